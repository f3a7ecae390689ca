"""The shared tier's typed outcomes: errors a caller must act on, and misses it falls back from.

- `TierUnavailable`: Redis cannot be reached or timed out; nothing was changed that a reader
  could see (a publish cut short leaves only chunks that expire by themselves).
- `StaleOwner`: this process's lease on the mind was lost or its fence moved (another replica
  took the mind): the mutation was refused inside Redis. The caller stops serving the mind.
- `TokenLogGap`: a token-log append assumed more tokens than the log holds.

A read never raises for bad data: it returns a `Miss` with a `MissReason`.

`translating()` turns redis-py's connection and timeout errors, and Redis refusing writes, into
`TierUnavailable`, so no transport failure escapes the cluster package as a redis exception.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from enum import StrEnum

import redis.exceptions


class SharedTierError(Exception):
    """Base of the shared tier's errors."""


class TierUnavailable(SharedTierError):
    """Redis is unreachable, timed out or refused the command."""


class StaleOwner(SharedTierError):
    """The lease is no longer ours (expired, taken, or the fence moved)."""


class TokenLogGap(SharedTierError):
    """An append's base is past the end of the token log."""

    def __init__(self, n_base: int, n_log: int) -> None:
        super().__init__(f"the append assumes {n_base} tokens, the log holds {n_log}")
        self.n_base = n_base
        self.n_log = n_log


class MissReason(StrEnum):
    ABSENT = "absent"  # no manifest: the tier never held this mind
    TOKENS_ONLY = "tokens_only"  # the tier holds its tokens, not its KV (budget, too large)
    FINGERPRINT = "fingerprint"  # made with another model or KV types
    CHUNK_MISSING = "chunk_missing"  # a chunk the manifest lists is gone
    CHUNK_CORRUPT = "chunk_corrupt"  # a chunk's length or CRC-32 differs from the manifest
    MANIFEST_CORRUPT = "manifest_corrupt"  # the manifest cannot be parsed
    UNAVAILABLE = "unavailable"  # Redis could not be reached


@dataclass(frozen=True)
class Miss:
    """A read that found no usable page; the caller falls back (local disk, then re-prefill)."""

    reason: MissReason
    detail: str
    gen: int = 0  # the manifest's generation, when one was read


# Redis answering but unable to take writes (noeviction memory full, a read-only replica, a
# server still loading its AOF, a login refused): the tier is unavailable, not our bug. Other
# ResponseErrors (a script error) are bugs and propagate.
_REFUSALS = (
    redis.exceptions.OutOfMemoryError,
    redis.exceptions.ReadOnlyError,
    redis.exceptions.BusyLoadingError,
    redis.exceptions.AuthenticationError,
    redis.exceptions.NoPermissionError,
)


@contextmanager
def translating(what: str) -> Iterator[None]:
    """Re-raise redis-py's transport errors as `TierUnavailable` naming `what` was attempted."""
    try:
        yield
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as err:
        raise TierUnavailable(f"shared tier unreachable during {what}: {err}") from err
    except _REFUSALS as err:
        raise TierUnavailable(f"shared tier refused {what}: {err}") from err
