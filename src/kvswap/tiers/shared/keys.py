"""The shared tier's key layout in Redis.

Every key of one mind carries the same hash tag `{h}`, so a Redis Cluster keeps them in one
slot and one Lua script may touch them together; `h` is a digest of the mind's key (`core.keys.PageKey`: its
tenant's namespace and its name, `mind_id`), so two tenants' minds of one name never share a key,
neither an API key nor a raw name is ever stored in a key, and a name holding `{` or `}` cannot
break the tag.

    kv:{h}:lease      "<replica id> <advertise URL> <incarnation token>" with PX (owner lease)
    kv:{h}:fence      integer, INCR at every acquisition (fencing token)
    kv:{h}:gens       integer, INCR for every generation a publish starts (unique chunk keys)
    kv:{h}:manifest   hash: gen, fence, body (JSON: the page's commit record, `manifest`)
    kv:{h}:tokens     the token log, int32 little-endian, appended per turn
    kv:{h}:turns      list of the latest applied turn ids (a replayed turn applies once)
    kv:{h}:chat       the last chat turn, for the next one's prompt (`minds.turnrecord`)
    kv:{h}:g<gen>:<i> chunk i of generation gen's blob (`chunks`)

The tier's own keys (byte budget and LRU, `budget`) share the tag `{tier}`:

    kv:{tier}:bytes   hash: mind tag -> bytes its chunks hold
    kv:{tier}:lru     sorted set: mind tag -> last use (ms since the epoch)
    kv:{tier}:total   integer: sum of `bytes`

`prefix` (default `kv`) lets several deployments share one Redis database. Pure: names only.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Final

from kvswap.core.keys import PageKey, PageKind

DEFAULT_PREFIX: Final = "kv"
TAG_HEX_CHARS: Final = 32  # 128 bits of SHA-256: collisions need ~2^64 minds
_PREFIX_RE = re.compile(r"[A-Za-z0-9_.-]{1,32}")
_TAG_RE = re.compile(f"[0-9a-f]{{{TAG_HEX_CHARS}}}")


def check_prefix(prefix: str) -> str:
    if not _PREFIX_RE.fullmatch(prefix):
        raise ValueError(f"key prefix {prefix!r}: 1-32 of A-Z a-z 0-9 _ . -")
    return prefix


def mind_id(key: PageKey) -> str:
    """A mind's key as one string: `mind~<namespace>~<name in UTF-8 hex>` (the string key of
    the versions before typed keys, so a tier they published is found again; the namespace
    is in it, so tenants never collide). What the tag digests and a manifest records."""
    assert key.kind is PageKind.MIND and key.namespace, key
    return f"mind~{key.namespace}~{key.name.encode('utf-8').hex()}"


def mind_tag(key: PageKey) -> str:
    """The hash tag of a mind: hex SHA-256 of `mind_id(key)`, truncated."""
    return hashlib.sha256(mind_id(key).encode("utf-8")).hexdigest()[:TAG_HEX_CHARS]


@dataclass(frozen=True)
class MindKeys:
    """The Redis keys of one mind."""

    tag: str
    prefix: str = DEFAULT_PREFIX

    @classmethod
    def of(cls, key: PageKey, prefix: str = DEFAULT_PREFIX) -> MindKeys:
        return cls(mind_tag(key), check_prefix(prefix))

    def __post_init__(self) -> None:
        if not _TAG_RE.fullmatch(self.tag):
            raise ValueError(f"mind tag {self.tag!r} is not {TAG_HEX_CHARS} hex digits")

    def _key(self, what: str) -> str:
        return f"{self.prefix}:{{{self.tag}}}:{what}"

    @property
    def lease(self) -> str:
        return self._key("lease")

    @property
    def fence(self) -> str:
        return self._key("fence")

    @property
    def gens(self) -> str:
        return self._key("gens")

    @property
    def manifest(self) -> str:
        return self._key("manifest")

    @property
    def tokens(self) -> str:
        return self._key("tokens")

    @property
    def turns(self) -> str:
        return self._key("turns")

    @property
    def chat(self) -> str:
        return self._key("chat")

    def chunk(self, gen: int, index: int) -> str:
        return self._key(f"g{gen}:{index}")


@dataclass(frozen=True)
class TierKeys:
    """The keys of the tier's byte budget and LRU."""

    prefix: str = DEFAULT_PREFIX

    def __post_init__(self) -> None:
        check_prefix(self.prefix)

    @property
    def bytes(self) -> str:
        return f"{self.prefix}:{{tier}}:bytes"

    @property
    def lru(self) -> str:
        return f"{self.prefix}:{{tier}}:lru"

    @property
    def total(self) -> str:
        return f"{self.prefix}:{{tier}}:total"
