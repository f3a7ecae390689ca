"""The anonymous prompt cache's own logic on the CPU: its block index, which cached state a
prompt takes, what is saved, what is shed first, and `check_integrity`.

The slot state copies are done by a small stand-in for the runtime's verbs that moves tokens
only (the real copies are exercised by the server tests); the store is the real PageStore.
"""

from __future__ import annotations

import numpy as np
import pytest

from kvswap.engine.kv.buffers import new_buffer
from kvswap.engine.kv.pagefmt import (
    PageGeometry,
    PageLayout,
    plan_layout,
    read_tokens,
    write_tokens,
)
from kvswap.engine.kv.pagestore import PageStore, Reservation
from kvswap.engine.minds.anoncache import BLOCK_TOKENS, AnonCache
from kvswap.engine.slot import Slot, SlotTable

GEOMETRY = PageGeometry("model", "f16", "f16", n_stream=1, n_ctx_slot=4096)
B = BLOCK_TOKENS


class _Verbs:
    """Moves a slot's tokens to and from pages (a state of 8 bytes per token)."""

    def __init__(self, store: PageStore) -> None:
        self.store = store
        self.mover = self

    def measure(self, slot: Slot) -> PageLayout:
        return plan_layout(len(slot.tokens), 8 * len(slot.tokens), GEOMETRY)

    def capture_to_page(
        self, slot: Slot, name: str, *, layout: PageLayout, reservation: Reservation,
        keep_slot: bool = False,
    ) -> None:  # fmt: skip
        buffer = new_buffer(layout.n_bytes)
        with memoryview(buffer) as view:
            write_tokens(view, layout, slot.tokens.view())
        self.store.commit(reservation, buffer, layout)
        assert keep_slot

    def page_in(self, slot: Slot, name: str) -> None:
        page = self.store.hold(name)
        with page.view() as view:
            slot.tokens.replace(read_tokens(view, page.layout))
        self.store.remove(name, page.generation)
        self.store.release(page)


class _Runtime:
    def __init__(self, store: PageStore) -> None:
        self.verbs = _Verbs(store)


def _cache(ceiling: int = 1 << 20, budget: int = -1) -> tuple[AnonCache, PageStore]:
    store = PageStore(ceiling)
    cache = AnonCache(
        store=store,
        runtime=_Runtime(store),  # type: ignore[arg-type]
        slots=SlotTable(1, 4096),
        budget_bytes=budget,
        cache_idle_slots=False,
    )
    return cache, store


def _slot(tokens: list[int], slot_id: int = 0) -> Slot:
    slot = Slot(slot_id, n_ctx=4096)
    slot.tokens.append(tokens)
    return slot


def _toks(n: int, start: int = 0) -> list[int]:
    return list(range(start, start + n))


def test_a_saved_state_is_found_by_its_longest_common_prefix() -> None:
    cache, _ = _cache()
    cache.save(_slot(_toks(3 * B)))
    cache.save(_slot(_toks(2 * B, start=10_000)))
    cache.check_integrity()
    prompt = np.array(_toks(2 * B) + [7] * B, dtype=np.int32)
    best = cache.best(prompt)
    assert best is not None and best[1] == 2 * B
    assert cache.best(np.array([99] * (3 * B), dtype=np.int32)) is None


def test_states_shorter_than_a_block_are_not_kept_and_equal_states_once() -> None:
    cache, store = _cache()
    cache.save(_slot(_toks(B - 1)))
    assert store.n_pages == 0
    cache.save(_slot(_toks(B)))
    cache.save(_slot(_toks(B), slot_id=1))
    assert store.n_pages == 1
    cache.check_integrity()


def test_prepare_pages_in_a_cached_prefix_only_when_it_beats_the_slot_by_a_block() -> None:
    cache, store = _cache()
    cache.save(_slot(_toks(4 * B)))
    prompt = np.array([*_toks(4 * B), 1], dtype=np.int32)
    near = _slot(_toks(3 * B + 1))  # holds 3 blocks and a bit: the cache is < a block better
    cache.prepare(near, prompt)
    assert len(near.tokens) == 3 * B + 1 and cache.n_hits == 0
    far = _slot(_toks(B, start=50_000))  # holds something else: the cache wins, and the
    cache.prepare(far, prompt)  # slot's own state is kept first
    assert cache.n_hits == 1
    assert list(far.tokens.view()) == _toks(4 * B)
    assert cache.best(np.array([*_toks(B, start=50000), 2], dtype=np.int32)) is not None
    cache.check_integrity()
    # The cached state moved into the slot (it left the cache); the slot's own was saved.
    assert store.n_pages == 1


def test_the_budget_drops_least_recently_saved_states_first() -> None:
    page = plan_layout(B, 8 * B, GEOMETRY).n_bytes
    cache, store = _cache(budget=2 * page)
    for i in range(3):
        cache.save(_slot(_toks(B, start=1000 * i)))
    assert store.n_pages == 2
    assert cache.best(np.array([*_toks(B, start=0), 1], dtype=np.int32)) is None
    cache.check_integrity()


def test_shed_frees_at_least_what_is_asked_oldest_first() -> None:
    cache, store = _cache()
    for i in range(3):
        cache.save(_slot(_toks(B, start=1000 * i)))
    one = plan_layout(B, 8 * B, GEOMETRY).n_bytes
    assert cache.shed(one + 1) == 2 * one
    assert store.n_pages == 1
    assert cache.best(np.array([*_toks(B, start=2000), 1], dtype=np.int32)) is not None
    assert cache.shed(10 * one) == one and cache.shed(1) == 0
    cache.check_integrity()


def test_check_integrity_catches_an_entry_whose_page_is_gone() -> None:
    cache, store = _cache()
    cache.save(_slot(_toks(B)))
    store.remove(store.infos()[0].name)
    with pytest.raises(AssertionError):
        cache.check_integrity()
