"""Typed keys of everything the page store holds, and the tenant namespace of an API key.

A page is found by a `PageKey`: its kind, the namespace of the tenant it belongs to, and a
name. Request input can build only two kinds, each in the namespace of the key that sent it:
`page_key` (a client's named page: page_out, page_in, spill, page_drop) and `mind_key` (a
mind). The kinds the server makes for itself (the anonymous cache's entries, the pages a
reconfigure moves slots through, the reservations of prepared buffers) have constructors no
route calls and an empty namespace no API key hashes to, so no request can name, replace or
read them: isolation holds by construction, not by a prefix check a later feature can forget.

Pure data; the bottom of the tree (imports only `core.errors`).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from enum import StrEnum

from kvswap.core.errors import ErrorKind, KvswapError

PUBLIC_NAMESPACE = "public"  # the one namespace of a server without --api-key
MIND_NAME_MAX_BYTES = 100  # a mind's file name (namespace, "~", the name in hex) fits 250 bytes


class PageKind(StrEnum):
    """What a page is, and so who may reach it."""

    PAGE = "page"  # a client's named page (request input, its own namespace)
    MIND = "mind"  # a mind's RAM page (request input names the mind, its own namespace)
    ANON = "anon"  # an entry of the anonymous prompt cache (engine only)
    ENGINE = "engine"  # a slot's state moved by a reconfigure (engine only, within the pause)
    SPARE = "spare"  # the reservation of a prepared buffer (engine only, never a listed page)


@dataclass(frozen=True, order=True)
class PageKey:
    """A page's identity in the store: kind, tenant namespace, name."""

    kind: PageKind
    namespace: str
    name: str

    def __str__(self) -> str:
        if self.namespace:
            return f"{self.kind.value} {self.name!r} ({self.namespace})"
        return f"{self.kind.value} {self.name!r}"


def namespace_of(api_key: str) -> str:
    """The namespace of an API key (`PUBLIC_NAMESPACE` for none): names never collide across
    keys, and the key itself is never stored or shown."""
    if not api_key:
        return PUBLIC_NAMESPACE
    return hashlib.sha256(api_key.encode()).hexdigest()[:16]


def page_key(namespace: str, name: str) -> PageKey:
    """A client's page `name` (validated by the caller as a page name) in `namespace`."""
    assert namespace, "a request's page lives in its tenant's namespace"
    return PageKey(PageKind.PAGE, namespace, name)


def mind_key(namespace: str, name: str) -> PageKey:
    """Mind `name` in `namespace`; a typed 400 for a name a mind cannot have."""
    assert namespace, "a request's mind lives in its tenant's namespace"
    if not isinstance(name, str) or not name:
        raise _invalid("a mind name must be a non-empty string")
    try:
        raw = name.encode("utf-8")
    except UnicodeEncodeError as err:
        raise _invalid("a mind name must be valid UTF-8") from err
    if len(raw) > MIND_NAME_MAX_BYTES:
        raise _invalid(
            f"a mind name has at most {MIND_NAME_MAX_BYTES} bytes (this one has {len(raw)})"
        )
    if any(c < 0x20 or c == 0x7F for c in raw):
        raise _invalid("a mind name has no control characters")
    return PageKey(PageKind.MIND, namespace, name)


def _invalid(message: str) -> KvswapError:
    return KvswapError(ErrorKind.INVALID_REQUEST, message)


def anon_key(n: int) -> PageKey:
    """Entry `n` of the anonymous prompt cache."""
    return PageKey(PageKind.ANON, "", str(n))


def engine_key(name: str) -> PageKey:
    """A page the engine makes for itself (a reconfigure's move of a slot)."""
    return PageKey(PageKind.ENGINE, "", name)


def spare_key(purpose: str) -> PageKey:
    """The reservation of a prepared buffer (`purpose`: what it is prepared for)."""
    return PageKey(PageKind.SPARE, "", purpose)
