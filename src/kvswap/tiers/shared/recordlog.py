"""The stored conversations' log in the shared tier: every replica's writes to its stored
Responses records, in one Redis stream, in the order every replica applies them.

    kv:records    a stream of entries {op: <bytes>} (the minds layer's serialized writes)

A turn's write is appended by the replica that holds the turn's mind, fenced like a page: one
script checks the mind's lease and fence (`lease.OWNS_LUA`) and appends, so an owner that froze
past its lease and wakes up cannot record a turn over its successor's. Writes that belong to no
held mind (a new chain's first turn, a conversation made, a response deleted) are appended
unfenced. The script touches the mind's keys and the log's, so the tier needs one Redis (as
`kvswap cluster up` runs it), not a Redis Cluster.

Owns `RecordLog`. Thread-safe. Raises `StaleOwner` (the lease moved), `TierUnavailable`.
"""

from __future__ import annotations

from typing import Final

import redis

from kvswap.tiers.shared.connection import as_bytes
from kvswap.tiers.shared.errors import StaleOwner, translating
from kvswap.tiers.shared.lease import OWNS_LUA, Lease

# KEYS lease, fence, log; ARGV holder, fence, op -> {1, id} | {0}
_APPEND_FENCED: Final = (
    OWNS_LUA
    + """
if not owns(KEYS[1], KEYS[2], ARGV[1], ARGV[2]) then return {0} end
return {1, redis.call('XADD', KEYS[3], '*', 'op', ARGV[3])}
"""
)
_BATCH: Final = 512  # entries read per round trip


class RecordLog:
    """Appends to and reads of the records' stream."""

    def __init__(self, client: redis.Redis, prefix: str) -> None:
        self._client = client
        self.key = f"{prefix}:records"
        self._fenced = client.register_script(_APPEND_FENCED)

    def append(self, op: bytes, lease: Lease | None) -> str:
        """Append one write (fenced by `lease` when given); its entry id."""
        with translating("records append"):
            if lease is None:
                return (as_bytes(self._client.xadd(self.key, {"op": op})) or b"").decode()
            keys = lease.keys
            reply = self._fenced(
                keys=[keys.lease, keys.fence, self.key], args=[lease.holder.value, lease.fence, op]
            )
        if int(reply[0]) != 1:
            raise StaleOwner(f"lease on {keys.tag} lost before the turn's record was written")
        return (as_bytes(reply[1]) or b"").decode()

    def read_after(self, after: str) -> list[tuple[str, bytes]]:
        """Every entry after id `after` ("0": from the first), oldest first."""
        out: list[tuple[str, bytes]] = []
        start = "(" + after if after != "0" else "-"
        with translating("records read"):
            while True:
                batch = self._client.xrange(self.key, start, "+", count=_BATCH) or []
                for entry_id, fields in batch:
                    eid = (as_bytes(entry_id) or b"").decode()
                    out.append((eid, as_bytes((fields or {}).get(b"op")) or b""))
                if len(batch) < _BATCH:
                    return out
                start = "(" + out[-1][0]
