"""Which mind a request names: `"mind"` in its body and/or the `X-Mind-Id` header, in the
namespace of the tenant its API key belongs to; and the name a caller may see of a mind.

Pure. The header's text is taken as HTTP hands it over (its bytes read as Latin-1) and read
back as UTF-8, so the header and the body name the same mind for any name.
"""

from __future__ import annotations

from kvswap.core.errors import ErrorKind, KvswapError
from kvswap.core.keys import PageKey, mind_key


def request_mind(header: str | None, body_mind: str | None, namespace: str) -> PageKey | None:
    """The mind a request names in its tenant's `namespace` (`header`: the X-Mind-Id value, as
    HTTP hands it over); None when it names none. A typed 400 when the two disagree or the
    header is not UTF-8."""
    named = _header_utf8(header)
    if body_mind is not None and named is not None and body_mind != named:
        raise KvswapError(
            ErrorKind.INVALID_REQUEST,
            f'the X-Mind-Id header ({named!r}) and the body\'s "mind" ({body_mind!r}) name '
            "different minds",
        )
    name = body_mind if body_mind is not None else named
    if name is None:
        return None
    return mind_key(namespace, name)


def _header_utf8(raw: str | None) -> str | None:
    if raw is None:
        return None
    try:
        return raw.encode("latin-1").decode("utf-8")
    except UnicodeError as err:
        raise KvswapError(
            ErrorKind.INVALID_REQUEST, "the X-Mind-Id header must be UTF-8 text"
        ) from err


def mind_name(key: PageKey | None, namespace: str) -> str | None:
    """The name of mind `key` as a caller of `namespace` may see it: None for another
    tenant's mind (or no mind)."""
    if key is None or key.namespace != namespace:
        return None
    return key.name
