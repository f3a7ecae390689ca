"""Connecting to the shared tier: one redis-py client per process, shared by every thread.

Bytes in, bytes out (`decode_responses=False`: chunks are binary). Failures surface fast, as
`TierUnavailable` from the callers: two retries at most, 50 ms apart and growing, instead of
redis-py's default back-off (seconds per call when Redis is down, which would stall a turn's
end or a drain). The socket timeout bounds one command, an 8 MiB chunk included.
"""

from __future__ import annotations

from typing import Final

import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

CONNECT_TIMEOUT_S: Final = 2.0
COMMAND_TIMEOUT_S: Final = 10.0


def connect(url: str, *, command_timeout_s: float = COMMAND_TIMEOUT_S) -> redis.Redis:
    """A client for `redis://[user:password@]host:port/db` (or `rediss://`, `unix://`)."""
    if not url.startswith(("redis://", "rediss://", "unix://")):
        raise ValueError(f"shared tier URL {url!r}: expected redis://host:port/db")
    return redis.Redis.from_url(
        url,
        decode_responses=False,
        socket_connect_timeout=CONNECT_TIMEOUT_S,
        socket_timeout=command_timeout_s,
        retry=Retry(ExponentialBackoff(cap=0.5, base=0.05), retries=2),
        retry_on_error=[redis.exceptions.ConnectionError, redis.exceptions.TimeoutError],
    )


def as_bytes(reply: object) -> bytes | None:
    """A reply of a `connect()` client (bytes, not str) as bytes, None staying None."""
    if reply is None:
        return None
    if not isinstance(reply, bytes):
        raise TypeError(f"expected bytes from Redis, got {type(reply).__name__}")
    return reply
