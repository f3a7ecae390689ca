"""Per-mind owner leases with fencing tokens, kept in Redis (docs/CLUSTER.md, "Why it is built this way").

One replica serves a mind at a time. A lease is `kv:{h}:lease = "<replica id> <advertise URL>
<token>"` with a TTL (`SET NX PX`), where the token is random per process incarnation
(`Incarnation.new()` at start-up), so a restarted replica never inherits the leases of its
previous life. Every acquisition that finds the lease free increments `kv:{h}:fence`; the
`Lease` returned carries that fence. Renewal and release are compare-and-set scripts on the
holder value and the fence, and every mutation of shared state (the store's publish and token
appends) runs `OWNS_LUA` inside its own script: an owner that froze past its TTL and wakes up
is refused by Redis itself, whatever it believes.

Times are Redis's (PX, PTTL, TIME): no clock of ours is compared with another machine's. Every
lease script answers with Redis's clock (`t_ms`), so the moments a replica logs for its leases
(acquired, renewed, released) are on one clock across the cluster.

Owns the lease scripts and `Leases`, the client side for one incarnation. Thread-safe (redis-py
pools its connections). Raises `TierUnavailable` when Redis cannot be reached; a lease that is
not ours is a value (`LeaseHolder`, `False`), not an exception.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import redis

from kvswap.tiers.shared.errors import translating
from kvswap.tiers.shared.keys import MindKeys

DEFAULT_TTL_MS: Final = 5000
_REPLICA_ID_RE = re.compile(r"[A-Za-z0-9_.-]{1,64}")

# KEYS[1] lease, KEYS[2] fence; ARGV[1] holder value, ARGV[2] fence. Pasted at the top of every
# script that mutates a mind's shared state.
OWNS_LUA: Final = """
local function owns(lease_key, fence_key, holder, fence)
  return redis.call('GET', lease_key) == holder and redis.call('GET', fence_key) == fence
end
"""

# Redis's clock in ms, for the lease scripts' answers.
_NOW_LUA: Final = """
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
"""

# ARGV[1] holder value, ARGV[2] ttl ms. {1, fence, now} when acquired (or already ours: TTL
# extended, fence unchanged); {0, holder value, pttl, fence} when another holds it.
_ACQUIRE_LUA: Final = (
    _NOW_LUA
    + """
local cur = redis.call('GET', KEYS[1])
if cur == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {1, tonumber(redis.call('GET', KEYS[2]) or '0'), now_ms()}
end
if cur then
  return {0, cur, redis.call('PTTL', KEYS[1]), tonumber(redis.call('GET', KEYS[2]) or '0')}
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return {1, redis.call('INCR', KEYS[2]), now_ms()}
"""
)

# ARGV[1] holder, ARGV[2] fence, ARGV[3] ttl ms -> Redis's time when renewed, 0 not ours
_RENEW_LUA: Final = (
    OWNS_LUA
    + _NOW_LUA
    + """
if owns(KEYS[1], KEYS[2], ARGV[1], ARGV[2]) then
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  return now_ms()
end
return 0
"""
)

# ARGV[1] holder, ARGV[2] fence -> Redis's time when released, 0 not ours
_RELEASE_LUA: Final = (
    OWNS_LUA
    + _NOW_LUA
    + """
if owns(KEYS[1], KEYS[2], ARGV[1], ARGV[2]) then
  redis.call('DEL', KEYS[1])
  return now_ms()
end
return 0
"""
)


@dataclass(frozen=True)
class Incarnation:
    """This process: its replica id, where other replicas reach it, and its random token."""

    replica_id: str
    advertise_url: str
    token: str

    @classmethod
    def new(cls, replica_id: str, advertise_url: str) -> Incarnation:
        """A fresh incarnation (call once per process start)."""
        return cls(replica_id, advertise_url, secrets.token_hex(16))

    def __post_init__(self) -> None:
        if not _REPLICA_ID_RE.fullmatch(self.replica_id):
            raise ValueError(f"replica id {self.replica_id!r}: 1-64 of A-Z a-z 0-9 _ . -")
        if not self.advertise_url or any(c.isspace() for c in self.advertise_url):
            raise ValueError(f"advertise URL {self.advertise_url!r} is empty or has spaces")

    @property
    def value(self) -> str:
        """The lease key's value while this incarnation holds it."""
        return f"{self.replica_id} {self.advertise_url} {self.token}"


@dataclass(frozen=True)
class Lease:
    """A lease this incarnation holds: the proof every fenced mutation presents."""

    keys: MindKeys
    holder: Incarnation
    fence: int
    ttl_ms: int
    t_ms: int = 0  # Redis's time when it was acquired (or found ours)


@dataclass(frozen=True)
class LeaseHolder:
    """Whoever holds a mind's lease, as read from Redis."""

    replica_id: str
    advertise_url: str
    token: str
    ttl_left_ms: int
    fence: int

    @classmethod
    def parse(cls, value: bytes, ttl_left_ms: int, fence: int) -> LeaseHolder:
        parts = value.decode("utf-8", "replace").split(" ")
        if len(parts) != 3:
            return cls("?", "", value.hex(), ttl_left_ms, fence)  # not written by kvswap
        return cls(parts[0], parts[1], parts[2], ttl_left_ms, fence)


class Leases:
    """Acquire, renew and release mind leases for one incarnation."""

    def __init__(
        self, client: redis.Redis, incarnation: Incarnation, ttl_ms: int = DEFAULT_TTL_MS
    ) -> None:
        if ttl_ms < 10:
            raise ValueError(f"lease TTL {ttl_ms} ms is below 10 ms")
        self.incarnation = incarnation
        self.ttl_ms = ttl_ms
        self._client = client
        self._acquire = client.register_script(_ACQUIRE_LUA)
        self._renew = client.register_script(_RENEW_LUA)
        self._release = client.register_script(_RELEASE_LUA)

    def acquire(self, keys: MindKeys) -> Lease | LeaseHolder:
        """The lease on `keys` (fence incremented if it was free), or who holds it."""
        with translating("lease acquire"):
            reply = self._acquire(
                keys=[keys.lease, keys.fence], args=[self.incarnation.value, self.ttl_ms]
            )
        if int(reply[0]) == 1:
            return Lease(keys, self.incarnation, int(reply[1]), self.ttl_ms, int(reply[2]))
        return LeaseHolder.parse(reply[1], int(reply[2]), int(reply[3]))

    def renew(self, lease: Lease) -> int:
        """Extend the TTL: Redis's time in ms of the renewal; 0 when the lease is no longer
        ours (stop serving the mind)."""
        with translating("lease renew"):
            reply = self._renew(
                keys=[lease.keys.lease, lease.keys.fence],
                args=[lease.holder.value, lease.fence, lease.ttl_ms],
            )
        return int(reply)

    def renew_many(self, leases: Sequence[Lease]) -> list[int]:
        """`renew` of every lease in one pipeline (one round trip, not one per mind): Redis's
        time of each renewal, 0 for each lease no longer ours."""
        with translating("lease renew"):
            pipe = self._client.pipeline(transaction=False)
            for lease in leases:
                self._renew(
                    keys=[lease.keys.lease, lease.keys.fence],
                    args=[lease.holder.value, lease.fence, lease.ttl_ms],
                    client=pipe,
                )
            return [int(reply) for reply in pipe.execute()]

    def release(self, lease: Lease) -> int:
        """Give the lease up: Redis's time in ms of the release; 0 when it was not ours anymore
        (nothing changed)."""
        with translating("lease release"):
            reply = self._release(
                keys=[lease.keys.lease, lease.keys.fence], args=[lease.holder.value, lease.fence]
            )
        return int(reply)

    def release_many(self, leases: Sequence[Lease]) -> list[int]:
        """`release` of every lease in one pipeline: Redis's time of each, 0 where not ours."""
        with translating("lease release"):
            pipe = self._client.pipeline(transaction=False)
            for lease in leases:
                self._release(
                    keys=[lease.keys.lease, lease.keys.fence],
                    args=[lease.holder.value, lease.fence],
                    client=pipe,
                )
            return [int(reply) for reply in pipe.execute()]

    def holder(self, keys: MindKeys) -> LeaseHolder | None:
        """Who holds the lease now, or None when it is free."""
        with translating("lease read"):
            pipe = self._client.pipeline(transaction=True)
            pipe.get(keys.lease)
            pipe.pttl(keys.lease)
            pipe.get(keys.fence)
            value, pttl, fence = pipe.execute()
        if value is None:
            return None
        return LeaseHolder.parse(value, int(pttl), int(fence or 0))
