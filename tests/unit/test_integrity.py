"""`check_integrity()` of the byte owners: it holds through any sequence of their operations,
and it catches the drifts it exists for."""

from __future__ import annotations

import random

import pytest

from kvswap.core.errors import KvswapError
from kvswap.core.keys import page_key
from kvswap.core.page import PageGeometry, plan_layout
from kvswap.engine.kv.buffers import new_buffer
from kvswap.engine.kv.checkpoints import Checkpoint, CheckpointBudget
from kvswap.engine.kv.memory import SlotMemory
from kvswap.engine.kv.pagestore import PageStore

MiB = 1 << 20
GEOMETRY = PageGeometry("model", "f16", "f16", n_stream=1, n_ctx_slot=1024)


def test_the_page_store_stays_whole_under_random_operations() -> None:
    rng = random.Random(7)
    store = PageStore(8 * MiB)
    holds, open_reservations = [], []
    for _ in range(600):
        op = rng.random()
        name = page_key("ns", f"p{rng.randrange(5)}")
        try:
            if op < 0.3:
                res = store.reserve(name, rng.randrange(1, 3 * MiB))
                open_reservations.append(res)
            elif op < 0.5 and open_reservations:
                res = open_reservations.pop(rng.randrange(len(open_reservations)))
                if rng.random() < 0.3:
                    res = store.trim(res, res.key, rng.randrange(1, res.n_bytes + 1))
                if rng.random() < 0.8:
                    store.commit(
                        res, new_buffer(res.n_bytes), plan_layout(0, res.n_bytes, GEOMETRY)
                    )
                else:
                    store.cancel(res)
            elif op < 0.65:
                holds.append(store.hold(name))
            elif op < 0.8 and holds:
                store.release(holds.pop(rng.randrange(len(holds))))
            else:
                store.drop(name)
        except KvswapError:
            pass
        store.check_integrity()
    for res in open_reservations:
        store.cancel(res)
    for h in holds:
        store.release(h)
    store.close()
    store.check_integrity()
    assert store.charged_bytes == 0


def test_a_reservation_given_back_twice_is_caught() -> None:
    store = PageStore(4 * MiB)
    res = store.reserve(page_key("ns", "a"), MiB)
    store.cancel(res)
    store.check_integrity()
    store.cancel(res)
    with pytest.raises(AssertionError):
        store.check_integrity()


def test_a_buffer_that_cannot_be_unmapped_stays_charged_as_leaked_and_is_caught() -> None:
    store = PageStore(4 * MiB)
    key = page_key("ns", "a")
    res = store.reserve(key, MiB)
    page = store.commit(res, new_buffer(MiB), plan_layout(0, MiB, GEOMETRY))
    view = memoryview(page.buffer)  # a stray view: the close must fail
    store.drop(key)
    assert store.leaked_bytes == MiB and store.charged_bytes == MiB  # still mapped: counted
    with pytest.raises(AssertionError, match="could not be unmapped"):
        store.check_integrity()
    view.release()


def _memory(max_per_slot: int = 4, max_bytes: int = 0) -> SlotMemory:
    return SlotMemory(
        None,  # type: ignore[arg-type]  # the check reads no context
        needs_checkpoints=True,
        swa_window=0,
        budget=CheckpointBudget(max_per_slot, max_bytes),
        n_ubatch=64,
        min_step=0,
    )


def _ckpt(n_tokens: int, n_bytes: int = 16) -> Checkpoint:
    return Checkpoint(n_tokens, 0, n_tokens - 1, bytearray(n_bytes), n_bytes)


def test_checkpoints_that_agree_with_their_slots_pass() -> None:
    mem = _memory(max_bytes=64)
    mem.slots = {0: [_ckpt(10), _ckpt(20)], 1: [_ckpt(5)]}
    mem.check_integrity({0: 20, 1: 7})


@pytest.mark.parametrize(
    "case",
    [
        "past_its_tokens",
        "bytes_not_its_buffer",
        "out_of_order",
        "over_count",
        "over_budget",
        "no_slot",
    ],
)
def test_checkpoint_drift_is_caught(case: str) -> None:
    mem = _memory(max_per_slot=2, max_bytes=64)
    cps = [_ckpt(10), _ckpt(20)]
    n_tokens = {0: 20}
    if case == "past_its_tokens":
        n_tokens = {0: 15}
    elif case == "bytes_not_its_buffer":
        cps[1].n_bytes = 8
    elif case == "out_of_order":
        cps.reverse()
    elif case == "over_count":
        cps.append(_ckpt(20))
    elif case == "over_budget":
        cps = [_ckpt(10, 40), _ckpt(20, 40)]
    elif case == "no_slot":
        n_tokens = {1: 20}
    mem.slots = {0: cps}
    with pytest.raises(AssertionError):
        mem.check_integrity(n_tokens)
