"""The checkpoint budget: where checkpoints go, which leave, and the byte total."""

from __future__ import annotations

import logging

import pytest

from kvswap.engine.kv.checkpoints import Checkpoint, CheckpointBudget, boundaries, newest_usable


def _ck(n_tokens: int, n_bytes: int = 100) -> Checkpoint:
    return Checkpoint(
        n_tokens=n_tokens, pos_min=0, pos_max=n_tokens - 1, data=None, n_bytes=n_bytes
    )


def test_boundaries_near_the_end_and_every_min_step() -> None:
    assert boundaries(1000, 0, n_ubatch=64, min_step=256) == [256, 512, 768, 932, 996]
    assert boundaries(1000, 600, n_ubatch=64, min_step=256) == [768, 932, 996]
    assert boundaries(1000, 0, n_ubatch=64, min_step=0) == [932, 996]  # llama-server's two
    assert boundaries(50, 0, n_ubatch=64, min_step=0) == [46]


def test_newest_usable_is_at_or_before_the_divergence() -> None:
    cps = [_ck(100), _ck(200), _ck(300)]
    assert newest_usable(cps, 250).n_tokens == 200
    assert newest_usable(cps, 200).n_tokens == 200
    assert newest_usable(cps, 99) is None


def test_per_slot_cap_drops_the_oldest() -> None:
    budget = CheckpointBudget(max_per_slot=2, max_bytes=0)
    slots = {0: [_ck(10), _ck(20)]}
    gone = budget.admit(slots, 0, _ck(30))
    assert [c.n_tokens for c in gone] == [10]
    assert [c.n_tokens for c in slots[0]] == [20, 30]


def test_a_slot_mid_capture_gives_up_no_checkpoint() -> None:
    """A page_out's layout counted the slot's checkpoints when its buffer was asked for; the
    budget must not take one away before the copy (the engine crashed on the mismatch)."""
    budget = CheckpointBudget(max_per_slot=32, max_bytes=500)
    slots = {0: [_ck(10, 200), _ck(20, 200)], 1: [_ck(10, 50)]}
    gone = budget.admit(slots, 1, _ck(20, 100), frozen={0})
    assert [c.n_tokens for c in gone] == [20]  # the new one, skipped
    assert [c.n_tokens for c in slots[0]] == [10, 20]
    assert [c.n_tokens for c in slots[1]] == [10]
    gone = budget.admit(slots, 1, _ck(20, 100))  # the capture is done: slot 0 gives one up
    assert [c.n_tokens for c in gone] == [20]
    assert [c.n_tokens for c in slots[0]] == [10] and [c.n_tokens for c in slots[1]] == [10, 20]


def test_the_slot_with_most_bytes_drops_its_oldest_after_its_first(
    caplog: pytest.LogCaptureFixture,
) -> None:
    budget = CheckpointBudget(max_per_slot=32, max_bytes=1000)
    slots = {
        0: [_ck(10, 200), _ck(20, 200)],
        1: [_ck(10, 100), _ck(20, 100), _ck(30, 300)],
        2: [_ck(5, 50)],
    }
    assert budget.total_bytes(slots) == 950
    with caplog.at_level(logging.INFO, logger="kvswap.checkpoints"):
        gone = budget.admit(slots, 2, _ck(60, 200))
    # 950 + 200 > 1000. Slot 1 holds the most (500): it loses its oldest after its first (at
    # 20); 850 + 200 still does not fit, and slots 0 and 1 now tie at 400: the lower id loses
    # its checkpoint at 20. Slot 2 (one checkpoint) is never touched.
    assert [c.n_tokens for c in gone] == [20, 20]
    assert [c.n_tokens for c in slots[0]] == [10]
    assert [c.n_tokens for c in slots[1]] == [10, 30]
    assert [c.n_tokens for c in slots[2]] == [5, 60]
    assert budget.total_bytes(slots) == 850
    assert budget.counters.evicted_budget_total == 2
    assert "evicted slot 1's checkpoint at 20 tokens" in caplog.text


def test_every_slot_keeps_its_first_and_the_new_one_is_skipped_when_nothing_can_go(
    caplog: pytest.LogCaptureFixture,
) -> None:
    budget = CheckpointBudget(max_per_slot=32, max_bytes=300)
    slots = {0: [_ck(10, 150)], 1: [_ck(10, 150)]}
    with caplog.at_level(logging.INFO, logger="kvswap.checkpoints"):
        gone = budget.admit(slots, 0, _ck(20, 10))
    assert [c.n_tokens for c in gone] == [20]  # the new one
    assert [len(v) for v in slots.values()] == [1, 1]
    assert budget.counters.skipped_budget_total == 1
    assert "skipped a 10-byte checkpoint of slot 0" in caplog.text


def test_the_total_never_exceeds_the_budget() -> None:
    import random

    rng = random.Random(3)
    budget = CheckpointBudget(max_per_slot=5, max_bytes=2000)
    slots: dict[int, list[Checkpoint]] = {i: [] for i in range(4)}
    for step in range(500):
        sid = rng.randrange(4)
        budget.admit(slots, sid, _ck(step + 1, rng.randrange(10, 600)))
        assert budget.total_bytes(slots) <= 2000
        assert all(len(v) <= 5 for v in slots.values())


def test_incoming_checkpoints_drop_their_own_oldest_after_their_first() -> None:
    budget = CheckpointBudget(max_per_slot=32, max_bytes=1000)
    slots = {0: [_ck(10, 400)], 1: []}
    incoming = [_ck(100, 200), _ck(200, 200), _ck(300, 200), _ck(400, 200)]
    kept, dropped = budget.admit_incoming(slots, 1, incoming)
    # 400 held elsewhere leaves room for 600: one of the four goes, the oldest after the first.
    assert [c.n_tokens for c in kept] == [100, 300, 400]
    assert [c.n_tokens for c in dropped] == [200]
    assert [c.n_tokens for c in slots[0]] == [10]  # never another slot's


def test_incoming_never_fails_even_when_nothing_fits() -> None:
    budget = CheckpointBudget(max_per_slot=32, max_bytes=100)
    kept, dropped = budget.admit_incoming({0: [_ck(1, 100)]}, 1, [_ck(10, 50), _ck(20, 50)])
    assert kept == [] and len(dropped) == 2


def test_incoming_respects_the_per_slot_count() -> None:
    budget = CheckpointBudget(max_per_slot=2, max_bytes=0)
    kept, dropped = budget.admit_incoming({}, 0, [_ck(1), _ck(2), _ck(3)])
    assert [c.n_tokens for c in kept] == [1, 3] and [c.n_tokens for c in dropped] == [2]


class _Context:
    """The calls `SlotMemory.capture` makes, counting the copies it asks for."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.n_copies = 0

    def state_size(self, seq: int, flags: int) -> int:
        return self.size

    def state_get_into(self, seq: int, data: bytearray, flags: int) -> int:
        self.n_copies += 1
        return len(data)

    def seq_pos_min(self, seq: int) -> int:
        return 0

    def seq_pos_max(self, seq: int) -> int:
        return 0


def test_a_checkpoint_the_budget_refuses_is_never_copied() -> None:
    from kvswap.engine.kv.memory import SlotMemory
    from kvswap.engine.slot import Slot

    ctx = _Context(size=48)
    budget = CheckpointBudget(max_per_slot=4, max_bytes=64)
    mem = SlotMemory(
        ctx,  # type: ignore[arg-type]
        needs_checkpoints=True, swa_window=0, budget=budget, n_ubatch=64, min_step=0,
    )  # fmt: skip
    slot = Slot(0, n_ctx=1024)
    slot.tokens.append([1, 2, 3])
    mem.capture(slot)
    assert ctx.n_copies == 1 and mem.total_bytes == 48
    slot.tokens.append([4])
    mem.capture(slot)  # 48 + 48 > 64, and the slot's first is kept: skipped before any copy
    assert ctx.n_copies == 1 and mem.total_bytes == 48
    assert budget.counters.skipped_budget_total == 1
