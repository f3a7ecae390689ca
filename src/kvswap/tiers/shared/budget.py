"""The shared tier's byte budget and LRU, kept by kvswap, not by Redis.

Redis runs with `maxmemory-policy noeviction`: its own eviction would drop single chunks or
lease keys. Instead every mind's bytes are charged here (its chunks, its manifest, its token
log and the small keys beside them, `mind_charge`; while a publication writes its chunks, the
old and the new generation's together, so the budget covers the peak)
(`kv:{tier}:bytes`, total in `kv:{tier}:total`) with its last use in a sorted set
(`kv:{tier}:lru`, scored by Redis's clock); the store degrades the least recently used minds to
tokens-only until the total is back under the budget. Each update is one script, so replicas
publishing at once keep one exact total.

A charge is set, not added: publishing a mind again replaces its charge, so a charge missed by
a crash between a page's commit and its charge is corrected by the mind's next publish.

Owns the three tier keys. Raises `TierUnavailable` when Redis fails. Thread-safe.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

import redis

from kvswap.tiers.shared.errors import translating
from kvswap.tiers.shared.keys import TierKeys

MIND_OVERHEAD_BYTES: Final = 1024  # a mind's lease, fence, generation and turn-id keys in Redis
TOKEN_BYTES: Final = 4  # the token log: int32 per token


def mind_charge(n_chunk_bytes: int, n_manifest_bytes: int, n_tokens: int) -> int:
    """What one mind costs the tier: its chunks, manifest, token log and small keys."""
    return n_chunk_bytes + n_manifest_bytes + TOKEN_BYTES * n_tokens + MIND_OVERHEAD_BYTES


_NOW_MS_LUA: Final = """
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""

# KEYS bytes, lru, total; ARGV tag, n_bytes -> the new total
_CHARGE_LUA: Final = (
    _NOW_MS_LUA
    + """
local old = tonumber(redis.call('HGET', KEYS[1], ARGV[1]) or '0')
local n = tonumber(ARGV[2])
redis.call('HSET', KEYS[1], ARGV[1], n)
redis.call('ZADD', KEYS[2], now_ms, ARGV[1])
return redis.call('INCRBY', KEYS[3], n - old)
"""
)

# KEYS bytes, lru, total; ARGV tag -> the new total
_UNCHARGE_LUA: Final = """
local old = tonumber(redis.call('HGET', KEYS[1], ARGV[1]) or '0')
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
return redis.call('INCRBY', KEYS[3], 0 - old)
"""

# KEYS lru; ARGV tag -> 1 when the mind is charged (its use time moved), else 0
_TOUCH_LUA: Final = (
    _NOW_MS_LUA
    + """
return redis.call('ZADD', KEYS[1], 'XX', 'CH', now_ms, ARGV[1])
"""
)


class TierBudget:
    """The tier's byte total against `budget_bytes`, and its least recently used minds."""

    def __init__(self, client: redis.Redis, keys: TierKeys, budget_bytes: int) -> None:
        if budget_bytes <= 0:
            raise ValueError(f"the shared tier's budget must be positive, not {budget_bytes}")
        self.budget_bytes = budget_bytes
        self._client = client
        self._keys = keys
        self._charge = client.register_script(_CHARGE_LUA)
        self._uncharge = client.register_script(_UNCHARGE_LUA)
        self._touch = client.register_script(_TOUCH_LUA)

    def _all(self) -> list[str]:
        return [self._keys.bytes, self._keys.lru, self._keys.total]

    def charge(self, tag: str, n_bytes: int) -> int:
        """Set the mind's charge to `n_bytes` and mark it used now; the tier's new total."""
        with translating("budget charge"):
            return int(self._charge(keys=self._all(), args=[tag, n_bytes]))

    def uncharge(self, tag: str) -> int:
        with translating("budget uncharge"):
            return int(self._uncharge(keys=self._all(), args=[tag]))

    def touch(self, tag: str) -> None:
        with translating("budget touch"):
            self._touch(keys=[self._keys.lru], args=[tag])

    def total_bytes(self) -> int:
        with translating("budget read"):
            return int(self._client.get(self._keys.total) or 0)

    def charged_bytes(self, tag: str) -> int:
        with translating("budget read"):
            return int(self._client.hget(self._keys.bytes, tag) or 0)

    def oldest(self, n: int) -> list[str]:
        """The `n` least recently used charged minds, oldest first."""
        with translating("budget read"):
            members = self._client.zrange(self._keys.lru, 0, n - 1)
        return [m.decode() if isinstance(m, bytes) else str(m) for m in members]

    def settle(self, tag: str, n_bytes: int, degrade: Callable[[str], int | None]) -> int:
        """Charge mind `tag` `n_bytes` (0: none), then `degrade` the least recently used other
        minds while the tier is over budget; how many were degraded or evicted.
        `degrade(victim)` answers what the victim still costs afterwards (a tokens-only mind:
        its manifest and log; 0: it left the tier), or None when it could not be touched (it
        kept moving, or a replica holds it): the next one is tried."""
        total = self.charge(tag, n_bytes) if n_bytes else self.uncharge(tag)
        n_degraded = 0
        skipped: set[str] = {tag}  # the mind being published, and victims left alone
        while total > self.budget_bytes:
            oldest = self.oldest(len(skipped) + 1)
            victim = next((t for t in oldest if t not in skipped), None)
            if victim is None:
                break
            left = degrade(victim)
            if left is None:
                skipped.add(victim)
                continue
            # degraded, it is charged what is left and becomes the most recently used: it
            # leaves the tier only once every older mind has been degraded
            total = self.charge(victim, left) if left else self.uncharge(victim)
            n_degraded += 1
        return n_degraded
