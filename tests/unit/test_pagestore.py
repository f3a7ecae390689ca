"""The page store's byte accounting: one count, last-owner release, refusals, the ceiling."""

from __future__ import annotations

import mmap
import os
from collections.abc import Callable

import psutil
import pytest

from kvswap.core.errors import ErrorKind, KvswapError
from kvswap.core.keys import PageKey, namespace_of, page_key, spare_key
from kvswap.core.page import PageGeometry, plan_layout
from kvswap.engine.kv.buffers import new_buffer
from kvswap.engine.kv.pagestore import (
    SHELF_KEY,
    SWITCH_KEY,
    Page,
    PageStore,
    Reservation,
    close_now,
)

MiB = 1 << 20
GEOMETRY = PageGeometry("model", "f16", "f16", n_stream=1, n_ctx_slot=1024)
NS = namespace_of("tenant")


def _k(name: str) -> PageKey:
    return page_key(NS, name)


def _page(store: PageStore, name: str, n_bytes: int, fill: int = 1) -> Page:
    res = store.reserve(_k(name), n_bytes)
    buffer = new_buffer(n_bytes)
    buffer[:n_bytes] = bytes([fill]) * n_bytes  # touch every byte, as a state copy does
    return store.commit(res, buffer, plan_layout(0, n_bytes, GEOMETRY))


def _kind(err: pytest.ExceptionInfo[KvswapError]) -> ErrorKind:
    return err.value.kind


def test_admission_equals_the_charge() -> None:
    store = PageStore(10 * MiB)
    res = store.reserve(_k("a"), 3 * MiB)
    assert store.charged_bytes == 3 * MiB  # reserved before the copy
    page = store.commit(res, new_buffer(3 * MiB), plan_layout(0, 3 * MiB, GEOMETRY))
    assert store.charged_bytes == page.n_bytes == 3 * MiB
    store.cancel(store.reserve(_k("b"), 1 * MiB))
    assert store.charged_bytes == 3 * MiB


def test_a_page_at_exactly_the_ceiling_fits_and_one_byte_more_does_not() -> None:
    store = PageStore(4 * MiB)
    with pytest.raises(KvswapError) as too_big:
        store.reserve(_k("a"), 4 * MiB + 1)
    assert _kind(too_big) is ErrorKind.INVALID_REQUEST  # larger than the whole ceiling
    _page(store, "a", 4 * MiB)
    assert store.charged_bytes == 4 * MiB
    with pytest.raises(KvswapError) as full:
        store.reserve(_k("b"), 1)
    assert _kind(full) is ErrorKind.UNAVAILABLE  # full now


def test_a_refusal_keeps_the_incumbent() -> None:
    store = PageStore(4 * MiB)
    _page(store, "other", 3 * MiB)
    incumbent = _page(store, "mind", 1 * MiB, fill=7)
    with pytest.raises(KvswapError):
        store.reserve(_k("mind"), 2 * MiB)  # 3 + 2 - 1 > 4
    assert store.get(_k("mind")) is incumbent
    assert incumbent.buffer[0] == 7
    assert store.charged_bytes == 4 * MiB


def test_replacement_subtracts_the_old_page_only_when_the_store_is_its_sole_owner() -> None:
    store = PageStore(4 * MiB)
    _page(store, "mind", 3 * MiB)
    new = _page(store, "mind", 4 * MiB)  # fits only once the old page is gone
    assert store.get(_k("mind")) is new and store.charged_bytes == 4 * MiB
    held = store.hold(_k("mind"))  # a spill holds it
    with pytest.raises(KvswapError) as full:
        store.reserve(_k("mind"), 1 * MiB)  # the spill keeps the 4 MiB counted
    assert _kind(full) is ErrorKind.UNAVAILABLE
    store.release(held)
    _page(store, "mind", 1 * MiB)
    assert store.charged_bytes == 1 * MiB


@pytest.mark.parametrize("how", ["page_in", "page_drop", "replacement"])
def test_a_page_held_by_a_spill_stays_counted_until_the_spill_ends(how: str) -> None:
    store = PageStore(10 * MiB)
    page = _page(store, "mind", 2 * MiB)
    held = store.hold(_k("mind"))
    assert held is page
    if how == "page_in":
        assert store.remove(_k("mind"), page.generation)
    elif how == "page_drop":
        store.drop(_k("mind"))
    else:
        _page(store, "mind", 1 * MiB)
    assert store.charged_bytes == (2 if how != "replacement" else 3) * MiB
    infos = {(i.key.name, i.in_store): i for i in store.infos()}
    assert infos[("mind", False)].n_bytes == 2 * MiB and infos[("mind", False)].n_spills == 1
    assert store.held_bytes == 2 * MiB
    store.release(held)
    assert store.held_bytes == 0
    assert store.charged_bytes == (0 if how != "replacement" else 1) * MiB
    assert page.buffer.closed


def test_remove_frees_only_the_named_generation() -> None:
    store = PageStore(10 * MiB)
    old = _page(store, "mind", 1 * MiB)
    new = _page(store, "mind", 1 * MiB)
    assert not store.remove(
        _k("mind"), old.generation
    )  # a spill of `old` asked to drop: newer stays
    assert store.get(_k("mind")) is new


def test_unknown_pages_are_404() -> None:
    store = PageStore(MiB)
    for call in (
        lambda: store.get(_k("x")),
        lambda: store.drop(_k("x")),
        lambda: store.hold(_k("x")),
    ):
        with pytest.raises(KvswapError) as err:
            call()
        assert _kind(err) is ErrorKind.NOT_FOUND


def test_the_charge_never_exceeds_the_ceiling_under_any_sequence() -> None:
    import random

    rng = random.Random(1)
    store = PageStore(8 * MiB)
    holds = []
    for _ in range(400):
        op = rng.random()
        name = f"p{rng.randrange(6)}"
        try:
            if op < 0.5:
                _page(store, name, rng.randrange(1, 4 * MiB))
            elif op < 0.65:
                holds.append(store.hold(_k(name)))
            elif op < 0.8 and holds:
                store.release(holds.pop(rng.randrange(len(holds))))
            else:
                store.drop(_k(name))
        except KvswapError:
            pass
        assert 0 <= store.charged_bytes <= store.ceiling_bytes
    for h in holds:
        store.release(h)
    store.close()
    assert store.charged_bytes == 0


def test_resident_memory_follows_the_charge() -> None:
    proc = psutil.Process(os.getpid())
    store = PageStore(512 * MiB)
    base = proc.memory_info().rss
    for i in range(4):
        _page(store, f"p{i}", 64 * MiB)
    grown = proc.memory_info().rss - base
    assert grown >= 200 * MiB  # the pages are really resident
    for i in range(4):
        store.drop(_k(f"p{i}"))
    after = proc.memory_info().rss - base
    assert after < 32 * MiB, (grown, after)
    assert store.charged_bytes == 0


def _shelved(store: PageStore) -> int:
    return dict(store.reservations()).get(SHELF_KEY, 0)


def test_a_freed_buffer_is_shelved_charged_and_taken_again_without_a_mapping() -> None:
    """Decision (the shelf): a page's buffer freed by its last owner stays mapped and charged,
    shown among the spares, and the next buffer of about its size is that one, trimmed to what
    it needs and reserved under its new key: no fresh memory faulted in for the next spare or
    disk read. A buffer too small or more than twice as large is not taken."""
    store = PageStore(16 * MiB, shelf_max=2)
    page = _page(store, "a", 4 * MiB)
    buffer = page.buffer
    store.remove(_k("a"))
    assert store.charged_bytes == 4 * MiB and _shelved(store) == 4 * MiB
    assert store.in_use_bytes == 0 and not store.short_of_headroom
    assert store.take_shelved(_k("b"), 5 * MiB) is None  # too small
    assert store.take_shelved(_k("b"), 1 * MiB) is None  # more than twice as large
    got = store.take_shelved(_k("b"), 3 * MiB)
    assert got is not None and got[0] is buffer
    assert got[1] == Reservation(_k("b"), 3 * MiB) and store.charged_bytes == 3 * MiB
    store.commit(got[1], got[0], plan_layout(0, 3 * MiB, GEOMETRY))
    store.check_integrity()


def test_the_shelf_gives_its_bytes_to_a_reservation_that_needs_them() -> None:
    """Defect caught: a cache of freed buffers that refuses a page (503) or makes the demoter
    spill minds for room it only borrows. A reservation that fits only without the shelf
    unmaps shelved buffers first, and the headroom never counts them."""
    store = PageStore(10 * MiB, shelf_max=2)
    for name in ("a", "b"):
        _page(store, name, 4 * MiB)
    store.remove(_k("a"))
    store.remove(_k("b"))
    assert _shelved(store) == 8 * MiB
    store.reserve(_k("c"), 9 * MiB)
    assert _shelved(store) == 0 and store.charged_bytes == 9 * MiB
    store.check_integrity()


def test_a_returned_buffer_is_shelved_when_there_is_room_and_a_place() -> None:
    """A buffer its user is done with (a disk read's, a spare given back) is shelved: charged
    now when it never was, and only while the store has room and the shelf a place; otherwise,
    or when too small to be worth a place, it is unmapped and nothing stays charged."""
    closed: list[bool] = []

    def dispose(buffer: mmap.mmap, done: Callable[[bool], None]) -> None:
        closed.append(True)
        close_now(buffer, done)

    store = PageStore(10 * MiB, dispose, shelf_max=1)
    store.shelve(new_buffer(4 * MiB), None)
    assert store.charged_bytes == _shelved(store) == 4 * MiB and not closed
    store.shelve(new_buffer(4 * MiB), None)  # no place left
    store.shelve(new_buffer(4096), None)  # too small
    res = store.reserve(_k("x"), 2 * MiB)
    store.shelve(new_buffer(2 * MiB), res)  # no place left: unmapped, its charge ends
    assert closed == [True, True, True] and store.charged_bytes == 4 * MiB
    store.check_integrity()
    store.close()
    assert store.charged_bytes == 0


def test_the_switch_spare_is_the_headroom_so_the_budget_pays_for_it_once() -> None:
    """Defect caught (issue 32): the demoter kept a free mind's worth of headroom beside the
    switch's prepared spare, so a budget of two minds and a little held no mind page beside the
    spare (every page spilled to disk). The spare is the room a switch needs: a page and the
    spare fill the store without the demoter having work; another spare does not count."""
    store = PageStore(10 * MiB)
    store.saw_mind_page(4 * MiB)  # the headroom: the largest mind page
    _page(store, "a", 5 * MiB)
    switch = store.reserve(SWITCH_KEY, 4 * MiB)
    assert store.charged_bytes == 9 * MiB and not store.short_of_headroom
    store.cancel(switch)
    store.reserve(spare_key("anon-cache"), 4 * MiB)
    assert store.short_of_headroom  # another purpose's spare is not the switch's room
    store.check_integrity()
