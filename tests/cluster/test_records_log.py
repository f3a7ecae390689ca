"""The stored conversations of a cluster in a real Redis: two replicas' stores over one records
log see each other's chains, deletes and conversations; a replica started later replays them
all; a turn's write by a replica whose lease on the mind moved is refused inside Redis."""

from __future__ import annotations

import numpy as np
import pytest
import redis

from kvswap.core.keys import PageKey, mind_key
from kvswap.minds.continuation import Position
from kvswap.minds.stored.records import ResponseRecord, TurnWrite
from kvswap.minds.stored.replicated import ReplicatedRecords
from kvswap.minds.stored.responses import segment_after
from kvswap.tiers.shared.errors import StaleOwner
from kvswap.tiers.shared.keys import MindKeys
from kvswap.tiers.shared.lease import Lease, Leases
from kvswap.tiers.shared.recordlog import RecordLog
from tests.cluster.util import incarnation

pytestmark = pytest.mark.timeout(60)
NS = "public"


class Replica:
    """A replica's side of the log: `SharedTier.append_record`'s rule (fenced when it holds
    the mind's lease) over the real `RecordLog`."""

    def __init__(self, client: redis.Redis) -> None:
        self.log = RecordLog(client, "kv")
        self.leases: dict[PageKey, Lease] = {}

    def append_record(self, op: bytes, mind: PageKey | None) -> str:
        return self.log.append(op, self.leases.get(mind) if mind is not None else None)

    def read_records(self, after: str) -> list[tuple[str, bytes]]:
        return self.log.read_after(after)


def _turn(rid: str, tokens: list[int], *, parent: object = None, mind: str = "m") -> TurnWrite:
    arr = np.asarray(tokens, dtype=np.int32)
    rec = ResponseRecord(
        rid, NS, mind, getattr(getattr(parent, "response", None), "id", None), None, 0, 0,
        Position(len(arr), len(arr) - 1, 0, ""), 0,
        [{"id": f"in_{rid}", "type": "message"}], [{"id": f"out_{rid}", "type": "message"}],
        {"id": rid}, 0.0,
    )  # fmt: skip
    return TurnWrite(NS, mind, True, rec, segment_after(parent, arr))  # type: ignore[arg-type]


def _store(client: redis.Redis) -> tuple[ReplicatedRecords, Replica]:
    replica = Replica(client)
    return ReplicatedRecords(replica, ttl_s=3600, budget_bytes=None), replica


def test_replicas_share_chains_and_a_late_replica_replays_them(rclient: redis.Redis) -> None:
    """Decision: any replica continues any chain. A chain written by one replica is read by
    another (tokens, items, head), deletes and conversations travel too, and a replica that
    starts after them replays the log to the same records."""
    a, _ = _store(rclient)
    b, _ = _store(rclient)
    a.record(_turn("r1", [1, 2, 3]))
    first = b.chain(NS, "r1")
    assert first is not None and first.is_head and first.tokens.tolist() == [1, 2, 3]
    b.record(_turn("r2", [1, 2, 3, 4, 5], parent=first))
    second = a.chain(NS, "r2")
    assert second is not None and second.tokens.tolist() == [1, 2, 3, 4, 5]
    assert [i["id"] for i in second.items] == ["in_r1", "out_r1", "in_r2", "out_r2"]
    assert second.segments == b.chain(NS, "r2").segments  # type: ignore[union-attr]
    conv = a.create_conversation(NS, "conv_1", [{"id": "i1", "type": "message"}], {"k": "v"})
    assert b.conversation(NS, conv.id) == conv
    found, _ = b.delete_response(NS, "r1")
    assert found and a.response(NS, "r1") is None
    late, _ = _store(rclient)
    assert late.chain(NS, "r2") is not None and late.response(NS, "r1") is None
    assert late.conversation_items(NS, "conv_1") == [{"id": "i1", "type": "message"}]


def test_a_turn_written_by_a_replica_that_lost_the_lease_is_refused(
    rclient: redis.Redis,
) -> None:
    """Fenced like pages: the replica that held the chain's mind froze, its lease moved to
    another; its late write of a turn is refused inside Redis, and no replica sees it."""
    key = mind_key(NS, "m")
    keys = MindKeys.of(key)
    a, ra = _store(rclient)
    b, rb = _store(rclient)
    old = Leases(rclient, incarnation("ra"), ttl_ms=100).acquire(keys)
    assert isinstance(old, Lease)
    ra.leases[key] = old
    a.record(_turn("r1", [1, 2]))
    rclient.delete(keys.lease)  # the lease expired while ra was frozen
    new = Leases(rclient, incarnation("rb")).acquire(keys)
    assert isinstance(new, Lease)
    rb.leases[key] = new
    with pytest.raises(StaleOwner):
        a.record(_turn("r2", [1, 2, 3], parent=a.chain(NS, "r1")))
    b.record(_turn("r2b", [1, 2, 4], parent=b.chain(NS, "r1")))
    assert a.chain(NS, "r2") is None and a.chain(NS, "r2b") is not None
