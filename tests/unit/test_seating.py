"""Seating minds in slots (`engine.seats.seating.Seating`) on the CPU: the decisions a model test
reaches only by chance, or not at all.

A real page store, slot table, mind registry, flush schedule, hand-offs and anonymous cache
around slot verbs that move tokens only (`standins`): every page and copy holds exactly the
tokens its slot held, so a lost or mixed-up state shows as wrong tokens. No libllama, no
threads; each test runs in milliseconds.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest

from kvswap.core.errors import ErrorKind, KvswapError
from kvswap.core.keys import PageKey, PageKind, mind_key, page_key
from kvswap.core.vocab import MindMove
from kvswap.engine.commands import RoomReport, SlotCapture, SlotErase
from kvswap.engine.seats.anoncache import BLOCK_TOKENS, Kept
from kvswap.engine.seats.outcomes import NoRoomYet, NotYourMind
from kvswap.engine.slot import Slot
from tests.unit.standins import (
    NS,
    EngineSide,
    engine_side,
    mind_verb,
    page_bytes,
    page_tokens,
    put_page,
    state_of,
    submit,
    tokens,
)


def _m(name: str) -> PageKey:
    return mind_key(NS, name)


def _seat(side: EngineSide, slot: Slot, cmd: object, n_waits: int = 1) -> None:
    """Seat `cmd` on `slot` as the engine retries a waiting job: each NoRoomYet is a wait for a
    buffer the worker maps (at once here); exactly `n_waits` of them are expected."""
    for _ in range(n_waits):
        with pytest.raises(NoRoomYet):
            side.seating.seat(slot, cmd)
    side.seating.seat(slot, cmd)
    side.check()


def _counts(side: EngineSide) -> dict[str, float]:
    return {k: v for k, v in side.registry.metrics().items() if v}


def test_a_mind_in_its_home_slot_is_served_where_it_is() -> None:
    """Decision: a mind's next turn on the slot that holds it copies nothing and makes no page
    (a regression re-paging it costs a memcpy a turn and the prefix the turn reuses); the turn
    still counts as a change for the flush schedule."""
    side = engine_side()
    ann = _m("ann")
    slot = side.seated(0, ann, 40)
    side.flushes.flushed(ann, float("inf"))  # clean before the turn
    side.seating.seat(slot, submit(ann, tokens(41))[0])
    assert slot.mind == ann and slot.tokens.view().tolist() == tokens(40)
    assert side.store.n_pages == 0 and side.worker.n_mapped == 0
    assert _counts(side) == {"mind_hits_slot_total": 1.0, "mind_entries": 1.0}
    assert side.flushes.is_dirty(ann)


def test_a_switch_pages_the_slots_mind_out_under_its_own_key_and_brings_it_back() -> None:
    """Defect caught: a switch that destroys the mind it evicts, keeps it under another key, or
    maps its buffer on the engine thread. The evicted mind's page holds its exact tokens; the
    first switch waits once for its spare buffer (mapped by the worker, never during the
    switch); the mind returns to another slot from RAM."""
    side = engine_side()
    ann, bob = _m("ann"), _m("bob")
    side.seated(0, ann, 40)
    _seat(side, side.slots[0], submit(bob, tokens(5))[0])
    assert side.slots[0].mind == bob and len(side.slots[0].tokens) == 0
    assert page_tokens(side.store, ann) == tokens(40)
    assert side.registry.residents() == {bob: 0}
    assert side.store.largest_mind_page_bytes == page_bytes(40)
    counts = _counts(side)
    assert counts["mind_demotions_total"] == 1 and counts["mind_new_total"] == 1
    side.seating.seat(side.slots[1], submit(ann, tokens(41))[0])  # the next spare is ready
    side.check()
    assert side.slots[1].tokens.view().tolist() == tokens(40)
    assert not side.store.has(ann) and side.registry.residents() == {bob: 0, ann: 1}
    assert _counts(side)["mind_hits_ram_total"] == 1


def test_an_anonymous_request_never_destroys_a_mind() -> None:
    """Decision: a request naming no mind on a slot that holds one pages the mind out first
    (an anonymous prompt must never overwrite a conversation's state)."""
    side = engine_side()
    ann = _m("ann")
    side.seated(0, ann, 30)
    _seat(side, side.slots[0], submit(None, tokens(8, start=500))[0])
    assert side.slots[0].mind is None and page_tokens(side.store, ann) == tokens(30)
    assert side.registry.residents() == {}


def test_a_unified_pool_moves_out_the_least_recently_used_minds_the_returning_one_needs() -> None:
    """Decision: in a unified KV pool a returning mind needs free cells for its state; exactly
    as many idle residents move out as make it fit, least recently used first (a regression
    that evicts every resident, or the most recent one, costs other minds their seat)."""
    side = engine_side(n_slots=4, n_ctx=100, kv_unified=True)
    new, old, mid, back = _m("new"), _m("old"), _m("mid"), _m("back")
    for i, (key, age) in enumerate(((new, 2.0), (old, 0.0), (mid, 1.0))):  # not in slot order
        side.seated(i, key, 30, start=100 * i).t_last_used = age
    put_page(side.store, back, 50, start=900)
    # 90 cells held by the others + 50 needed > 100: two of them must go, the oldest first.
    _seat(side, side.slots[3], submit(back, tokens(51))[0])
    assert side.registry.residents() == {new: 0, back: 3}
    assert page_tokens(side.store, old) == tokens(30, 100)
    assert page_tokens(side.store, mid) == tokens(30, 200)
    assert side.slots[3].tokens.view().tolist() == tokens(50, 900)


def test_a_returning_mind_waits_while_running_requests_hold_the_cells() -> None:
    """Decision: cells held by running requests are never taken; the returning mind's job waits
    (NoRoomYet) and nothing moves meanwhile."""
    side = engine_side(n_slots=2, n_ctx=100, kv_unified=True)
    busy, back = _m("busy"), _m("back")
    side.seated(0, busy, 80).running = object()  # type: ignore[assignment]
    put_page(side.store, back, 50)
    with pytest.raises(NoRoomYet):
        side.seating.seat(side.slots[1], submit(back, tokens(51))[0])
    assert side.store.has(back) and side.registry.residents() == {busy: 0}
    assert len(side.slots[0].tokens) == 80


def test_without_a_disk_tier_a_mind_larger_than_the_store_is_dropped_and_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Decision: with no disk tier the state of a mind too large for the store is dropped (its
    next request re-prefills it), logged once per mind, not once per switch."""
    side = engine_side(ceiling_bytes=8192)
    big = _m("big")
    caplog.set_level(logging.WARNING, "kvswap.minds")
    for _ in range(2):
        side.seated(0, big, 1000)
        side.seating.seat(side.slots[0], submit(_m("bob"), tokens(5))[0])
        side.check()
        assert side.slots[0].mind == _m("bob") and side.registry.resident_slot(big) is None
    dropped = [r for r in caplog.records if "no --slot-save-path" in r.getMessage()]
    assert len(dropped) == 1
    assert _counts(side)["mind_too_large_total"] == 2


def test_a_store_that_cannot_make_room_fails_the_switch_naming_page_ram_bytes() -> None:
    """Defect caught: a switch that waits forever, or fails on a report that predates it.
    While the store is full the switch waits for a demoter pass that runs after it began
    waiting; only a refusal from such a pass fails it, typed, naming --page-ram-bytes and the
    pass's reason, and the evicted mind is still in its slot."""
    side = engine_side(ceiling_bytes=16384)
    ann = _m("ann")
    put_page(side.store, page_key(NS, "client"), 1340)  # 16080 of 16384 bytes
    side.seated(0, ann, 40)
    side.post(RoomReport(5, "an old pass's reason"))  # before the switch waits: not its answer
    rang: list[bool] = []
    side.handoffs.attach(lambda: rang.append(True), disk_tier=False)
    cmd = submit(_m("bob"), tokens(5))[0]
    with pytest.raises(NoRoomYet):
        side.seating.seat(side.slots[0], cmd)
    assert rang  # the demoter was asked for room
    side.post(RoomReport(6, ""))  # a pass that made no room but reported no refusal
    with pytest.raises(NoRoomYet):
        side.seating.seat(side.slots[0], cmd)
    side.post(RoomReport(7, "no idle mind page can be spilled to disk now"))
    with pytest.raises(KvswapError) as err:
        side.seating.seat(side.slots[0], cmd)
    assert err.value.kind is ErrorKind.UNAVAILABLE
    assert "--page-ram-bytes 16384" in err.value.message
    assert "no idle mind page can be spilled" in err.value.message
    assert err.value.extra["retry_after_s"] > 0  # the 503's Retry-After: a refusal that passes
    assert side.slots[0].mind == ann and side.slots[0].tokens.view().tolist() == tokens(40)
    side.check()


def test_a_disk_tier_that_refused_room_fails_the_switch_naming_its_flag() -> None:
    """Decision: a switch goes straight to disk only when every page is held; when the pass
    could not make room because the disk tier is full, a write there would fail too, so the
    switch fails at once, typed, with that reason (naming --page-disk-bytes)."""
    side = engine_side(ceiling_bytes=16384)
    ann = _m("ann")
    put_page(side.store, page_key(NS, "client"), 1340)
    side.seated(0, ann, 40)
    side.handoffs.attach(lambda: None, disk_tier=True)
    cmd = submit(_m("bob"), tokens(5))[0]
    with pytest.raises(NoRoomYet):
        side.seating.seat(side.slots[0], cmd)
    side.post(RoomReport(1, "the disk tier is full (9 of --page-disk-bytes 9 bytes)"))
    with pytest.raises(KvswapError) as err:
        side.seating.seat(side.slots[0], cmd)
    assert "--page-disk-bytes" in err.value.message and not side.handoffs.handing(ann)
    assert side.slots[0].mind == ann
    side.check()


def test_a_state_read_back_from_disk_is_applied_and_its_time_recorded() -> None:
    """A mind on disk only arrives with its state (`Submit.restore`): the slot takes exactly
    those tokens, the read-back counts as a disk hit, and its apply time is kept for the turn's
    figures (popped once)."""
    side = engine_side()
    ann = _m("ann")
    side.seating.seat(side.slots[1], submit(ann, tokens(26), restore=state_of(25))[0])
    side.check()
    assert side.slots[1].tokens.view().tolist() == tokens(25)
    assert side.registry.residents() == {ann: 1}
    assert _counts(side)["mind_hits_disk_total"] == 1
    assert side.registry.pop_restore_ms(ann) is not None
    assert side.registry.pop_restore_ms(ann) is None


def test_a_slot_verb_of_another_tenant_on_a_minds_slot_is_refused_naming_no_mind() -> None:
    """Defect caught: one API key erasing (or reading) another key's conversation through a
    slot id. The verb is refused as a permission error that names no mind; the owner's own
    verb acts on the mind where it is."""
    side = engine_side()
    side.seated(0, _m("secret-name"), 20)

    def erase(namespace: str) -> SlotErase:
        return SlotErase(1, 0, lambda _: None, namespace=namespace)

    with pytest.raises(NotYourMind) as err:
        side.seating.seat(side.slots[0], erase("another-tenant"))
    assert err.value.kind is ErrorKind.PERMISSION and "secret-name" not in err.value.message
    side.seating.seat(side.slots[0], erase(NS))  # the engine then erases it on the slot
    assert side.slots[0].mind == _m("secret-name") and len(side.slots[0].tokens) == 20


def test_a_new_mind_starts_from_its_tenants_cached_prefix_and_leaves_it_cached() -> None:
    """Decision: a new mind (a session key's first turn) starts from the longest prefix of its
    prompt its own tenant's anonymous cache holds, copied in, so the next new mind with the
    same system prompt finds it too (a moved entry would serve only the first). Defect
    caught: another tenant's cached prompt seeding a mind (a prefix oracle across keys)."""
    side = engine_side(n_slots=3)
    side.with_cache(-1)
    system = tokens(2 * BLOCK_TOKENS, start=500)
    cached = side.slots[1]
    cached.tokens.append(system)
    cached.namespace = NS
    side.anon.expect(cached)
    side.worker.deliver()
    assert side.anon.save(cached) is Kept.SAVED
    side.runtime.verbs.clear(cached)
    for name, slot_id in (("ann", 0), ("bob", 1)):
        cmd, _ = submit(_m(name), [*system, *tokens(10, start=9000 + slot_id)])
        side.seating.seat(side.slots[slot_id], cmd)
        assert side.slots[slot_id].tokens.view().tolist() == system
    stranger = mind_key("another-tenant", "eve")
    side.seating.seat(side.slots[2], submit(stranger, [*system, 1])[0])
    assert len(side.slots[2].tokens) == 0
    side.check()


def test_a_slot_verb_of_another_tenant_on_its_anonymous_prompt_is_refused() -> None:
    """Defect caught: one API key saving (into a slot file it then probes at leisure) or
    paging out a slot whose anonymous prompt another key sent. An empty slot, or one of the
    caller's own prompts, is the caller's to act on."""
    side = engine_side()
    slot = side.slots[0]
    slot.tokens.append(tokens(20))
    slot.namespace = "another-tenant"
    save = SlotCapture(1, 0, lambda _: None, namespace=NS)
    with pytest.raises(NotYourMind):
        side.seating.seat(slot, save)
    slot.namespace = NS
    side.seating.seat(slot, save)  # the engine then copies it
    slot.tokens.truncate(0)
    slot.namespace = "another-tenant"
    side.seating.seat(slot, save)  # nothing of anyone's to read


@pytest.mark.parametrize("action", [MindMove.TO_RAM, MindMove.ERASE])
def test_a_mind_verb_moves_the_mind_where_it_is_and_nothing_elsewhere(action: MindMove) -> None:
    """POST /minds/{name}: `to_ram` pages the mind out under its key, `erase` ends it in its
    slot; a mind in no slot is left as it is (no other slot is touched)."""
    side = engine_side()
    ann, bob = _m("ann"), _m("bob")
    side.seated(0, ann, 20)
    side.seated(1, bob, 10)
    cmd = mind_verb(ann, action)[0]
    if action is MindMove.TO_RAM:
        _seat(side, side.slots[0], cmd)
        assert page_tokens(side.store, ann) == tokens(20)
    else:
        side.seating.seat(side.slots[0], cmd)
        assert not side.store.has(ann)
    assert side.slots[0].mind is None and side.registry.residents() == {bob: 1}
    side.seating.seat(side.slots[1], cmd)  # the mind is in no slot now: nothing happens
    assert side.slots[1].mind == bob and len(side.slots[1].tokens) == 10
    side.check()


def test_the_flush_before_exit_copies_idle_minds_only() -> None:
    """Decision: the spill before exit and a scheduled flush copy idle slots holding a mind
    with tokens (a busy slot's turn publishes when it ends; an anonymous slot is no mind)."""
    side = engine_side(n_slots=4)
    ann, bob, eve = _m("ann"), _m("bob"), _m("eve")
    side.seated(0, ann, 5)
    side.seated(1, bob, 5).running = object()  # type: ignore[assignment]
    side.seated(2, eve, 5)
    side.slots[3].tokens.replace(np.array(tokens(5), dtype=np.int32))
    assert [s.mind for s in side.slots.idle_minds()] == [ann, eve]
    assert [s.mind for s in side.slots.idle_minds(frozenset({eve}))] == [eve]


def test_a_forgotten_mind_leaves_its_slot_and_its_page() -> None:
    """Another replica owns the mind now (`ForgetMind`): its slot is cleared and its RAM page
    dropped; a busy slot changes nothing and says so."""
    side = engine_side()
    ann, bob = _m("ann"), _m("bob")
    side.seated(0, ann, 5)
    put_page(side.store, bob, 5)
    assert side.seating.forget(ann) and side.seating.forget(bob)
    assert side.registry.residents() == {} and side.store.n_pages == 0
    side.seated(1, ann, 5).running = object()  # type: ignore[assignment]
    assert not side.seating.forget(ann) and side.registry.residents() == {ann: 1}
    assert all(i.key.kind is not PageKind.MIND for i in side.store.infos())


def _idle_out(side: EngineSide) -> EngineSide:
    side.seating.idle_out = True  # --cache-idle-slots, as the engine builds it by default
    return side


def test_a_start_in_a_unified_pool_moves_every_other_idle_mind_to_its_page_first() -> None:
    """Defect caught: idle minds left in a unified pool, which libllama attends over up to its
    highest used cell, slowing every step of the request that starts (a named mind's cold
    prefill beside them was the issue's 24% gap). The start waits once for the spare (as a
    switch does); then every other idle mind is a RAM page holding exactly its tokens, a busy
    slot and the starting slot's own mind stay, and each moved mind comes back whole."""
    side = _idle_out(engine_side(n_slots=4, n_ctx=1000))
    ann, bob, eve, new = _m("ann"), _m("bob"), _m("eve"), _m("new")
    side.seated(0, ann, 40, start=100)
    side.seated(1, bob, 30, start=200).t_last_used = 0.0  # the least recently used
    side.seated(2, eve, 20, start=300).running = object()  # type: ignore[assignment]
    _seat(side, side.slots[3], submit(new, tokens(50))[0])
    assert side.registry.residents() == {eve: 2, new: 3}
    assert page_tokens(side.store, ann) == tokens(40, 100)
    assert page_tokens(side.store, bob) == tokens(30, 200)
    side.slots[2].running = None
    side.seating.seat(side.slots[0], submit(ann, tokens(41, 100))[0])
    assert side.slots[0].tokens.view().tolist() == tokens(40, 100)
    side.check()


def test_an_idle_mind_stays_where_the_slots_have_cells_of_their_own() -> None:
    """Decision: without a unified pool each slot has a stream of its own, which no other
    request attends over: a start moves nothing (a move there would only cost copies), and
    neither does a server run with --no-cache-idle-slots."""
    for side in (_idle_out(engine_side(kv_unified=False)), engine_side()):
        ann = _m("ann")
        side.seated(0, ann, 40)
        side.seating.seat(side.slots[1], submit(None, tokens(8, start=500))[0])
        assert side.registry.residents() == {ann: 0} and side.store.n_pages == 0
        assert side.worker.n_mapped == 0


def test_a_mind_the_store_has_no_room_for_stays_and_the_start_goes_on() -> None:
    """Decision: moving an idle mind out is worth a copy, never a refused or stuck request:
    when the store cannot take its page now, the mind stays and the start goes ahead."""
    side = _idle_out(engine_side(ceiling_bytes=16384))
    put_page(side.store, page_key(NS, "client"), 1340)  # 16080 of 16384 bytes
    ann = _m("ann")
    side.seated(0, ann, 40)
    side.seating.seat(side.slots[1], submit(None, tokens(8, start=500))[0])
    assert side.registry.residents() == {ann: 0}
    side.check()


def test_a_switch_copies_into_the_buffer_a_paged_in_mind_left_behind() -> None:
    """Defect caught: every switch faulting a fresh buffer in (the kernel zeroing each page,
    on a core the decode threads need) while a page just freed could hold the next mind. With
    the store's shelf, the mind paged in leaves its buffer there, the next spare is that
    buffer, and the mind paged out next is copied into it at once (no wait for the buffer
    worker): the only buffer it maps is the spare for the switch after."""
    side = engine_side(n_slots=2)
    side.store.shelf_max, side.store.shelf_min_bytes = 2, 0  # (stand-in states are tiny)
    ann, bob, eve = _m("ann"), _m("bob"), _m("eve")
    side.seated(0, ann, 40)
    put_page(side.store, bob, 44, start=400)
    side.seating.seat(side.slots[1], submit(bob, tokens(45, 400))[0])
    side.seating.seat(side.slots[0], submit(eve, tokens(5))[0])  # no NoRoomYet: no wait
    side.check()
    assert side.worker.n_mapped == 1
    assert page_tokens(side.store, ann) == tokens(40)
    assert side.registry.residents() == {bob: 1, eve: 0}
