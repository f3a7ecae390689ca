"""The anonymous prompt cache's own logic on the CPU: its block index, which cached state a
prompt takes, what is saved, what is shed first, and `check_integrity`.

The slot state copies are done by a small stand-in for the runtime's verbs that moves tokens
only (the real copies are exercised by the server tests), and the buffer worker by one that maps
at once on the test's thread; the store is the real PageStore.
"""

from __future__ import annotations

import mmap
from collections.abc import Callable

import numpy as np
import pytest

from kvswap.core.keys import PUBLIC_NAMESPACE, PageKey, PageKind
from kvswap.core.page import PageGeometry, PageLayout, plan_layout, read_tokens, write_tokens
from kvswap.engine.kv.buffers import new_buffer
from kvswap.engine.kv.pagestore import PageStore, Reservation
from kvswap.engine.seats.anoncache import BLOCK_TOKENS, AnonCache, Kept
from kvswap.engine.seats.outcomes import NoRoomYet
from kvswap.engine.slot import Slot, SlotTable
from tests.unit.standins import Worker

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
        self, slot: Slot, *, layout: PageLayout, reservation: Reservation, buffer: mmap.mmap,
        keep_slot: bool = False,
    ) -> None:  # fmt: skip
        assert len(buffer) >= layout.n_bytes and reservation.key.kind is PageKind.ANON
        with memoryview(buffer) as view:
            write_tokens(view, layout, slot.tokens.view())
        self.store.commit(reservation, buffer, layout)
        assert keep_slot

    def page_in(self, slot: Slot, key: PageKey) -> None:
        self.copy_in(slot, key)
        self.store.remove(key, self.store.get(key).generation)

    def copy_in(self, slot: Slot, key: PageKey) -> None:
        page = self.store.hold(key)
        with page.view() as view:
            slot.tokens.replace(read_tokens(view, page.layout))
        self.store.release(page)

    def clear(self, slot: Slot) -> None:
        slot.tokens.truncate(0)


class _Runtime:
    def __init__(self, store: PageStore) -> None:
        self.verbs = _Verbs(store)


def _cache(
    ceiling: int = 1 << 20,
    budget: int = -1,
    worker: Worker | None = None,
    store: PageStore | None = None,
) -> tuple[AnonCache, PageStore]:
    store = store or PageStore(ceiling)
    cache = AnonCache(
        store=store,
        runtime=_Runtime(store),
        slots=SlotTable(1, 4096),
        budget_bytes=budget,
        buffers=worker or Worker(),  # type: ignore[arg-type]
        cache_idle_slots=False,
    )
    return cache, store


def _save(cache: AnonCache, slot: Slot) -> Kept:
    """A request ended on the slot (its buffer is prepared), then its state is displaced."""
    cache.expect(slot)
    return cache.save(slot)


def _pages(store: PageStore) -> int:
    return sum(1 for i in store.infos() if i.key.kind is PageKind.ANON)


def _slot(tokens: list[int], slot_id: int = 0) -> Slot:
    slot = Slot(slot_id, n_ctx=4096)
    slot.tokens.append(tokens)
    return slot


def _toks(n: int, start: int = 0) -> list[int]:
    return list(range(start, start + n))


def test_a_saved_state_is_found_by_its_longest_common_prefix() -> None:
    cache, _ = _cache()
    _save(cache, _slot(_toks(3 * B)))
    _save(cache, _slot(_toks(2 * B, start=10_000)))
    cache.check_integrity()
    prompt = np.array(_toks(2 * B) + [7] * B, dtype=np.int32)
    best = cache.best(prompt, PUBLIC_NAMESPACE)
    assert best is not None and best[1] == 2 * B
    assert cache.best(np.array([99] * (3 * B), dtype=np.int32), PUBLIC_NAMESPACE) is None


def test_states_shorter_than_a_block_are_not_kept_and_equal_states_once() -> None:
    cache, store = _cache()
    _save(cache, _slot(_toks(B - 1)))
    assert _pages(store) == 0
    _save(cache, _slot(_toks(B)))
    _save(cache, _slot(_toks(B), slot_id=1))
    assert _pages(store) == 1
    cache.check_integrity()


def test_prepare_pages_in_a_cached_prefix_only_when_it_beats_the_slot_by_a_block() -> None:
    cache, store = _cache()
    _save(cache, _slot(_toks(4 * B)))
    prompt = np.array([*_toks(4 * B), 1], dtype=np.int32)
    near = _slot(_toks(3 * B + 1))  # holds 3 blocks and a bit: the cache is < a block better
    cache.prepare(near, prompt, PUBLIC_NAMESPACE)
    assert len(near.tokens) == 3 * B + 1 and cache.n_hits == 0
    far = _slot(_toks(B, start=50_000))  # holds something else: the cache wins, and the
    cache.prepare(far, prompt, PUBLIC_NAMESPACE)  # slot's own state is kept first
    assert cache.n_hits == 1
    assert list(far.tokens.view()) == _toks(4 * B)
    assert (
        cache.best(np.array([*_toks(B, start=50000), 2], dtype=np.int32), PUBLIC_NAMESPACE)
        is not None
    )
    cache.check_integrity()
    # The cached state moved into the slot (it left the cache); the slot's own was saved.
    assert _pages(store) == 1


def test_the_budget_drops_least_recently_saved_states_first() -> None:
    page = plan_layout(B, 8 * B, GEOMETRY).n_bytes
    cache, store = _cache(budget=2 * page)
    for i in range(3):
        _save(cache, _slot(_toks(B, start=1000 * i)))
    assert _pages(store) == 2
    assert cache.best(np.array([*_toks(B, start=0), 1], dtype=np.int32), PUBLIC_NAMESPACE) is None
    cache.check_integrity()


def test_shed_frees_at_least_what_is_asked_oldest_first() -> None:
    cache, store = _cache()
    for i in range(3):
        _save(cache, _slot(_toks(B, start=1000 * i)))
    one = plan_layout(B, 8 * B, GEOMETRY).n_bytes
    assert cache.shed(one + 1) == 2 * one
    assert _pages(store) == 1
    assert (
        cache.best(np.array([*_toks(B, start=2000), 1], dtype=np.int32), PUBLIC_NAMESPACE)
        is not None
    )
    assert cache.shed(10 * one) == one and cache.shed(1) == 0
    cache.check_integrity()


def test_a_shed_for_a_clients_page_frees_the_bytes_before_it_returns() -> None:
    closes: list[tuple[mmap.mmap, Callable[[bool], None]]] = []  # a disposer that lags
    store = PageStore(1 << 20, dispose=lambda buffer, done: closes.append((buffer, done)))
    cache, _ = _cache(store=store)
    for i in range(3):
        _save(cache, _slot(_toks(B, start=1000 * i)))
    usage = store.usage()
    charged, page = usage.charged_bytes, usage.pages[0].n_bytes
    one = plan_layout(B, 8 * B, GEOMETRY).n_bytes
    assert cache.shed(one) == one
    assert store.usage().charged_bytes == charged  # the demoter's shed: freed by the disposer
    assert cache.shed(one, now=True) == one
    assert store.usage().charged_bytes == charged - page  # a page_out retries on these bytes
    for buffer, done in closes:
        buffer.close()
        done(True)
    assert store.usage().charged_bytes == charged - 2 * page
    store.check_integrity()
    cache.check_integrity()


def test_check_integrity_catches_an_entry_whose_page_is_gone() -> None:
    cache, store = _cache()
    _save(cache, _slot(_toks(B)))
    store.remove(store.infos()[0].key)
    with pytest.raises(AssertionError):
        cache.check_integrity()


def test_no_prepared_buffer_means_a_wait_for_the_one_being_mapped_never_a_lost_prompt() -> None:
    """Defect caught (a stored conversation's second turn re-prefilling its first): a request
    displacing an idle slot's prompt while the buffer for it was still being mapped skipped the
    save, and the prompt was gone. The save waits (never mapping on the engine thread): the
    displacing request is retried once the buffer arrives, and the prompt is saved."""
    worker = Worker()
    cache, store = _cache(worker=worker)
    worker.hold = True  # the worker has not answered yet
    slot = _slot(_toks(2 * B))
    assert cache.save(slot) is Kept.WAITING  # never mapped here, on the engine thread
    assert _pages(store) == 0 and cache.n_skipped == 0 and worker.n_mapped == 1
    with pytest.raises(NoRoomYet):
        cache.displace(slot)  # the displacing request waits
    assert worker.n_mapped == 1  # asked once only
    worker.deliver()
    cache.displace(slot)  # retried: saved
    assert _pages(store) == 1 and cache.n_skipped == 0
    assert worker.n_mapped == 2  # the next save's buffer is asked for at once
    cache.check_integrity()
    store.check_integrity()


def test_the_prepared_buffer_is_charged_and_shown_as_a_reservation() -> None:
    cache, store = _cache()
    cache.expect(_slot(_toks(2 * B)))
    [(key, n_bytes)] = store.reservations()
    assert key.kind is PageKind.SPARE and n_bytes >= plan_layout(2 * B, 16 * B, GEOMETRY).n_bytes
    assert store.charged_bytes == n_bytes
    cache.close()
    assert store.charged_bytes == 0 and store.reservations() == []


def test_keep_empties_the_slot_into_an_entry_found_by_its_prefix() -> None:
    cache, _ = _cache()
    slot = _slot(_toks(2 * B))
    cache.expect(slot)
    assert cache.keep(slot) is Kept.SAVED and len(slot.tokens) == 0
    assert cache.best(np.array([*_toks(2 * B), 1], dtype=np.int32), PUBLIC_NAMESPACE) is not None
    cache.check_integrity()


def test_adopt_and_drop_all() -> None:
    cache, store = _cache()
    key = cache.new_key()
    layout = plan_layout(B, 8 * B, GEOMETRY)
    buffer = new_buffer(layout.n_bytes)
    with memoryview(buffer) as view:
        write_tokens(view, layout, np.array(_toks(B), dtype=np.int32))
    store.commit(store.reserve(key, layout.n_bytes), buffer, layout)
    assert cache.adopt(key, np.array(_toks(B), dtype=np.int32), PUBLIC_NAMESPACE)
    assert cache.best(np.array([*_toks(B), 1], dtype=np.int32), PUBLIC_NAMESPACE) == (key, B)
    cache.check_integrity()
    assert cache.drop_all() == 1 and _pages(store) == 0


def test_a_paged_in_entry_becomes_the_next_saves_buffer() -> None:
    worker = Worker()
    cache, store = _cache(worker=worker)
    _save(cache, _slot(_toks(4 * B)))
    [entry] = [i for i in store.infos() if i.key.kind is PageKind.ANON]
    n_mapped = worker.n_mapped
    other = _slot(_toks(4 * B, start=50_000))
    cache.prepare(other, np.array([*_toks(4 * B), 1], dtype=np.int32), PUBLIC_NAMESPACE)
    assert cache.n_hits == 1 and cache.n_saved == 2
    # The entry's buffer, faulted in already, is the spare now: nothing new was mapped.
    assert worker.n_mapped == n_mapped
    assert [(k.kind, n) for k, n in store.reservations()] == [(PageKind.SPARE, entry.n_bytes)]
    cache.check_integrity()
    store.check_integrity()


def test_one_tenants_cached_prompt_is_never_another_tenants_hit() -> None:
    """Defect caught: the anonymous cache shared across API keys, so one key's prompt is a
    cache hit for another (its `cache_n` and TTFT reveal what the other key sent). A slot that
    holds another key's prompt is saved under that key before the request overwrites it."""
    cache, store = _cache()
    ka = _slot(_toks(3 * B))
    ka.namespace = "ka"
    _save(cache, ka)
    prompt = np.array([*_toks(3 * B), 1], dtype=np.int32)
    assert cache.best(prompt, "kb") is None
    found = cache.best(prompt, "ka")
    assert found is not None and found[1] == 3 * B
    other = _slot(_toks(B, start=90_000), slot_id=1)
    other.namespace = "kb"
    cache.prepare(other, prompt, "kb")
    assert cache.n_hits == 0 and list(other.tokens.view()) == _toks(B, start=90_000)
    cache.prepare(ka, prompt, "kb")  # kb's request on ka's slot: no reuse, ka's state kept
    assert cache.n_hits == 0 and cache.best(prompt, "ka") is not None
    cache.check_integrity()
    assert _pages(store) == 2  # ka's prompt, and kb's own from `other`
