"""The stored conversations' database (`kvswap.minds.stored`) on a real SQLite file: chains
read back, forks sharing tokens, deletes in the middle, tenants, retention by a controllable
clock and by bytes, conversations and their items."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kvswap.minds.continuation import Position
from kvswap.minds.stored import retention
from kvswap.minds.stored.records import Chain, ResponseRecord, TurnWrite
from kvswap.minds.stored.responses import segment_after
from kvswap.minds.stored.retention import RecordsTooLarge
from kvswap.minds.stored.store import StoredRecords

A, B = "ns-a", "ns-b"
DAY_S = 86400.0


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def _turn(
    store: StoredRecords,
    rid: str,
    tokens: list[int],
    *,
    mind: str = "m",
    ns: str = A,
    parent: Chain | None = None,
    conversation: str | None = None,
    text: str = "",
    evicts: bool = False,
) -> None:
    """A stored turn; it releases no mind unless `evicts` (the budget may drop others)."""
    arr = np.asarray(tokens, dtype=np.int32)
    rec = ResponseRecord(
        id=rid,
        namespace=ns,
        mind=mind,
        parent=parent.response.id if parent is not None else None,
        conversation=conversation,
        conv_seq=0,
        segment=0,
        position=Position(len(arr), len(arr) - 1, 0, ""),
        n_dropped=0,
        input=[{"id": f"in_{rid}", "type": "message", "role": "user", "content": text}],
        output=[{"id": f"out_{rid}", "type": "message", "role": "assistant", "content": text}],
        body={"id": rid, "object": "response"},
        created_at=0.0,
    )
    released = store.record(TurnWrite(ns, mind, True, rec, segment_after(parent, arr)))
    assert evicts or not released


def _store(tmp_path: Path, clock: Clock, budget: int | None = None) -> StoredRecords:
    return StoredRecords(tmp_path, ttl_s=30 * DAY_S, budget_bytes=budget, clock=clock)


def test_chain_reads_back_tokens_items_and_head(tmp_path: Path) -> None:
    """A turn's records survive the process (a new store on the same file reads them)."""
    clock = Clock()
    store = _store(tmp_path, clock)
    _turn(store, "r1", [1, 2, 3])
    first = store.chain(A, "r1")
    assert first is not None and first.is_head
    _turn(store, "r2", [1, 2, 3, 4, 5], parent=first)
    store.close()
    again = _store(tmp_path, clock)
    second = again.chain(A, "r2")
    assert second is not None and second.is_head
    assert second.tokens.tolist() == [1, 2, 3, 4, 5]
    assert [i["id"] for i in second.items] == ["in_r1", "out_r1", "in_r2", "out_r2"]
    assert len(second.segments) == 2, "the second turn stored only its new tokens"
    older = again.chain(A, "r1")
    assert older is not None and not older.is_head


def test_fork_shares_the_prefix_and_a_deleted_middle_keeps_descendants(tmp_path: Path) -> None:
    """Decision: each stored response stands alone. Deleting a response in the middle hides
    it (404) but its tokens and items stay while a descendant's history runs through it."""
    store = _store(tmp_path, Clock())
    _turn(store, "r1", [1, 2])
    _turn(store, "r2", [1, 2, 3, 4], parent=store.chain(A, "r1"))
    _turn(store, "r3", [1, 2, 3, 4, 5, 6], parent=store.chain(A, "r2"))
    # A fork from r2 (not its mind's newest) into a new mind, diverging inside r2's tokens.
    _turn(store, "f3", [1, 2, 3, 9, 9], mind="fork", parent=store.chain(A, "r2"))
    fork = store.chain(A, "f3")
    assert fork is not None and fork.tokens.tolist() == [1, 2, 3, 9, 9]
    assert fork.segments[-1][1] == 3, "the fork starts where it diverges"
    found, released = store.delete_response(A, "r2")
    assert found and not released
    assert store.response(A, "r2") is None and store.chain(A, "r2") is None
    for rid, tokens in (("r3", [1, 2, 3, 4, 5, 6]), ("f3", [1, 2, 3, 9, 9])):
        chain = store.chain(A, rid)
        assert chain is not None and chain.tokens.tolist() == tokens
        assert [i["id"] for i in chain.items][:4] == ["in_r1", "out_r1", "in_r2", "out_r2"]
    # Every reference of mind "m" gone: it is released (its state is the caller's to drop);
    # the fork keeps working on the records it shares.
    store.delete_response(A, "r1")
    found, released = store.delete_response(A, "r3")
    assert [(r.namespace, r.name, r.owned) for r in released] == [(A, "m", True)]
    fork = store.chain(A, "f3")
    assert fork is not None and fork.tokens.tolist() == [1, 2, 3, 9, 9]


def test_another_namespace_finds_nothing(tmp_path: Path) -> None:
    """Tenants: every read is of the caller's namespace; another key's id is simply absent."""
    store = _store(tmp_path, Clock())
    _turn(store, "r1", [1, 2], text="secret")
    conv = store.create_conversation(A, "conv_1", [{"id": "i1", "type": "message"}], {})
    assert store.chain(B, "r1") is None and store.response(B, "r1") is None
    assert store.input_items(B, "r1") is None
    assert store.delete_response(B, "r1") == (False, [])
    assert store.conversation(B, conv.id) is None
    assert store.conversation_items(B, conv.id) is None
    assert store.delete_conversation(B, conv.id) == (False, [])
    assert store.chain(A, "r1") is not None


def test_time_to_live_on_a_controllable_clock(tmp_path: Path) -> None:
    """Retention by TTL: 30 days after it was made a response is gone, and with it the mind
    it was the last reference to."""
    clock = Clock()
    store = _store(tmp_path, clock)
    _turn(store, "r1", [1, 2])
    clock.now += 30 * DAY_S - 1
    assert store.response(A, "r1") is not None
    clock.now += 2
    assert store.response(A, "r1") is None and store.chain(A, "r1") is None
    assert [r.name for r in store.sweep()] == ["m"]
    assert store.listing(A)["chains"] == []


def test_byte_budget_drops_the_least_recently_used_chain_first(tmp_path: Path) -> None:
    """Retention by bytes: past the budget the oldest chain goes whole; the one just written
    and the recently used stay."""
    clock = Clock()
    probe = _store(tmp_path / "probe", clock)
    _turn(probe, "p1", list(range(100)))
    one_chain = probe.listing(A)["n_bytes"]
    store = _store(tmp_path, clock, budget=int(one_chain * 2.5))
    for i, mind in enumerate(("old", "mid")):
        clock.now += 10
        _turn(store, f"r{i}", list(range(100)), mind=mind)
    clock.now += 10
    chain = store.chain(A, "r0")  # touching "old" does not refresh it: use is a turn
    assert chain is not None
    arr = np.arange(100, dtype=np.int32)
    rec = ResponseRecord(
        "r2", A, "new", None, None, 0, 0, Position(100, 99, 0, ""), 0, [], [], {}, 0.0
    )
    released = store.record(TurnWrite(A, "new", True, rec, segment_after(None, arr)))
    assert [r.name for r in released] == ["old"]
    assert store.response(A, "r0") is None and store.response(A, "r1") is not None
    assert store.listing(A)["n_bytes"] <= int(one_chain * 2.5)


def test_conversation_items_and_a_deleted_covered_item(tmp_path: Path) -> None:
    """A conversation's turn appends its input and output; deleting an item its head's tokens
    cover makes the next turn render anew (not intact); OpenAI's item order is kept."""
    store = _store(tmp_path, Clock())
    store.create_conversation(A, "conv_1", [{"id": "i0", "type": "message"}], {"k": "v"})
    start = store.conversation_turn(A, "conv_1")
    assert start is not None and start.head is None and len(start.items) == 1
    _turn(store, "r1", [1, 2, 3], mind="conv_1", conversation="conv_1")
    turn = store.conversation_turn(A, "conv_1")
    assert turn is not None and turn.head is not None and turn.n_covered == 3
    assert [i["id"] for i in turn.items] == ["i0", "in_r1", "out_r1"]
    assert store.input_items(A, "r1") is not None
    assert [i["id"] for i in store.input_items(A, "r1") or []] == ["i0", "in_r1"]
    store.add_items(A, "conv_1", [{"id": "i9", "type": "message"}])
    turn = store.conversation_turn(A, "conv_1")
    assert turn is not None and turn.n_covered == 3 and len(turn.items) == 4
    assert store.delete_conversation_item(A, "conv_1", "in_r1") is not None
    turn = store.conversation_turn(A, "conv_1")
    assert turn is not None and turn.head is None, "a covered item was deleted: render anew"
    found, released = store.delete_conversation(A, "conv_1")
    assert found and [r.name for r in released] == []  # r1 still references the mind
    store.delete_response(A, "r1")
    assert store.listing(A) == {
        "chains": [],
        "conversations": [],
        "n_bytes": 0,
        "budget_bytes": None,
    }


def _items(n: int, n_chars: int, tag: str) -> list[dict[str, object]]:
    return [
        {"id": f"{tag}{i}", "type": "message", "role": "user", "content": "x" * n_chars}
        for i in range(n)
    ]


def test_one_tenants_flood_leaves_another_tenants_records_whole(tmp_path: Path) -> None:
    """Audit F2: the budget is shared fairly between tenants. A stores a response and a
    conversation within its share; B floods (conversations of items, stored turns) far past
    the budget. B's own least recently used records go, A's stay whole, and the budget holds
    (items count as every record does, audit F3)."""
    clock = Clock()
    budget = 60_000
    store = _store(tmp_path, clock, budget=budget)
    _turn(store, "a1", list(range(50)), mind="a-mind", ns=A)
    clock.now += 1
    store.create_conversation(A, "conv_a", _items(2, 100, "a"), {})
    for i in range(12):
        clock.now += 1
        store.create_conversation(B, f"conv_b{i}", _items(5, 1000, f"b{i}-"), {})
        clock.now += 1
        _turn(
            store, f"b{i}", list(range(500)), mind=f"b-mind{i}", ns=B, text="y" * 2000, evicts=True
        )
    assert store.response(A, "a1") is not None
    assert store.conversation(A, "conv_a") is not None
    assert store.conversation_items(A, "conv_a") == _items(2, 100, "a")
    assert store.conversation(B, "conv_b0") is None and store.response(B, "b0") is None
    assert store.response(B, "b11") is not None  # the newest of B's stay
    a_bytes, b_bytes = store.listing(A)["n_bytes"], store.listing(B)["n_bytes"]
    with store.db.read() as conn:
        assert a_bytes + b_bytes == retention.total_bytes(conn) <= budget


def test_pages_shows_a_tenant_its_own_bytes_and_share(tmp_path: Path) -> None:
    """Audit F6: a tenant's listing counts its own records against its share of the budget;
    another tenant's writes never move its figures."""
    clock = Clock()
    store = _store(tmp_path, clock, budget=100_000)
    _turn(store, "a1", list(range(50)), ns=A)
    before = store.listing(A)
    assert before["budget_bytes"] == 100_000 and before["n_bytes"] > 0
    _turn(store, "b1", list(range(500)), ns=B, text="z" * 5000)
    after = store.listing(A)
    assert after["n_bytes"] == before["n_bytes"]
    assert after["budget_bytes"] == 50_000  # two tenants hold records: half each
    assert store.listing(B)["n_bytes"] > 5000


def test_a_conversation_larger_than_its_share_is_refused_whole(tmp_path: Path) -> None:
    """Audit F3: items that would make one conversation larger than its tenant's share are
    refused with a 400 naming --state-bytes and `items`, and nothing of them is written;
    items that fit are added."""
    store = _store(tmp_path, Clock(), budget=20_000)
    store.create_conversation(A, "conv_1", _items(2, 1000, "i"), {})
    with pytest.raises(RecordsTooLarge) as refused:
        store.add_items(A, "conv_1", _items(20, 1000, "j"))
    assert "--state-bytes 20000" in refused.value.message
    assert refused.value.extra["param"] == "items"
    assert len(store.conversation_items(A, "conv_1") or []) == 2
    with pytest.raises(RecordsTooLarge):
        store.create_conversation(A, "conv_2", _items(20, 1100, "k"), {})
    assert store.conversation(A, "conv_2") is None
    assert store.add_items(A, "conv_1", _items(3, 1000, "l"))
    assert len(store.conversation_items(A, "conv_1") or []) == 5


def test_the_database_file_shrinks_after_its_records_go(tmp_path: Path) -> None:
    """Audit F3: the SQLite file and its write-ahead log give their space back once records
    are deleted or evicted (the sweep compacts), rather than staying at their peak."""
    store = _store(tmp_path, Clock())
    for i in range(10):
        store.create_conversation(A, f"conv_{i}", _items(20, 20_000, f"c{i}-"), {})
    path = store.db.path
    assert path is not None
    wal = path.with_name(path.name + "-wal")
    peak = path.stat().st_size + wal.stat().st_size
    assert peak > 4_000_000
    for i in range(10):
        store.delete_conversation(A, f"conv_{i}")
    store.sweep()
    after = path.stat().st_size + (wal.stat().st_size if wal.exists() else 0)
    assert after < peak // 10, (peak, after)


def _background(store: StoredRecords, ns: str, rid: str, status: str, n_chars: int = 10) -> None:
    body = {"id": rid, "object": "response", "status": status, "metadata": {"k": "x" * n_chars}}
    store.put_pending(ns, rid, body, [{"type": "response.created"}])


def test_ended_background_responses_expire_and_count_against_the_budget(tmp_path: Path) -> None:
    """Audit F4: a cancelled or failed background response is kept for GET only as long as a
    response is (`--state-ttl-seconds`), counts against its tenant's bytes, and is the first
    thing its tenant loses past its share; one still running is kept."""
    clock = Clock()
    store = _store(tmp_path, clock, budget=50_000)
    _background(store, B, "resp_running", "in_progress")
    for i in range(8):
        clock.now += 1
        _background(store, B, f"resp_c{i}", "cancelled", n_chars=10_000)
    _turn(store, "a1", list(range(50)), ns=A)
    with store.db.read() as conn:
        assert retention.total_bytes(conn) <= 50_000
    assert store.response(B, "resp_c0") is None  # the oldest ended ones went first
    assert store.response(B, "resp_c7") is not None and store.response(A, "a1") is not None
    assert store.listing(B)["n_bytes"] > 10_000  # counted
    clock.now += 31 * DAY_S
    store.sweep()
    assert store.response(B, "resp_c7") is None
    assert (store.response(B, "resp_running") or {}).get("status") == "in_progress"


def test_a_restart_marks_interrupted_background_responses_failed(tmp_path: Path) -> None:
    """Audit F4: a background response a killed process left queued is, at the next start,
    failed with its reason (GET says so), and so expires with the ended ones."""
    clock = Clock()
    store = _store(tmp_path, clock)
    _background(store, A, "resp_q", "queued")
    _background(store, A, "resp_x", "cancelled")
    store.close()
    again = _store(tmp_path, clock)
    body = again.response(A, "resp_q") or {}
    assert body.get("status") == "failed"
    assert "restart" in body["error"]["message"]
    assert (again.response(A, "resp_x") or {}).get("status") == "cancelled"
    clock.now += 31 * DAY_S
    again.sweep()
    assert again.response(A, "resp_q") is None
