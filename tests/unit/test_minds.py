"""Minds without a model: keys and namespaces, slot choice for named and anonymous requests,
the anonymous cache's block hashes, and the page store's trim."""

import time

import numpy as np
import pytest

from kvswap.core.errors import KvswapError
from kvswap.core.keys import PageKey, PageKind, mind_key, namespace_of, page_key, spare_key
from kvswap.engine.kv.pagestore import PageStore
from kvswap.engine.plan.scheduler import Job, WaitQueue, choose_slot
from kvswap.engine.seats.anoncache import BLOCK_TOKENS, block_hashes
from kvswap.engine.seats.flushes import FlushSchedule
from kvswap.engine.slot import Slot
from kvswap.tiers.mindfiles import file_name, key_of

NS = namespace_of("k")


def _m(name: str) -> PageKey:
    return mind_key(NS, name)


def _slots(n: int) -> list[Slot]:
    return [Slot(i, n_ctx=1024, t_last_used=float(i)) for i in range(n)]


def _prompt(*toks: int) -> np.ndarray:
    return np.array(toks, dtype=np.int32)


def test_keys_are_per_namespace_and_round_trip() -> None:
    a, b = namespace_of("key-a"), namespace_of("key-b")
    assert a != b and namespace_of("") == "public"
    key = mind_key(a, "agent/7 ünï")
    assert key != mind_key(b, "agent/7 ünï")
    assert (key.kind, key.namespace, key.name) == (PageKind.MIND, a, "agent/7 ünï")
    # A client's page of the same name is another key: it never reaches the mind's page.
    assert page_key(a, "agent/7 ünï") != key
    # The mind's file name is a valid slot file name of its own folder, and round-trips.
    assert "/" not in file_name(key) and key_of(file_name(key)) == key
    assert key_of("alice.bin") is None and key_of(file_name(mind_key(b, "x" * 100))) is not None
    for bad in ("", "x" * 101, "a\x00b", "tab\there"):
        with pytest.raises(KvswapError):
            mind_key(a, bad)


def test_a_resident_mind_waits_for_its_own_slot() -> None:
    slots = _slots(2)
    slots[1].mind = _m("m")
    assert choose_slot(slots, _prompt(1), 0.1, set(), mind=_m("m")) is slots[1]
    assert choose_slot(slots, _prompt(1), 0.1, {1}, mind=_m("m")) is None  # busy: never elsewhere


def test_a_new_mind_prefers_empty_then_anonymous_then_lru_mind() -> None:
    slots = _slots(3)
    slots[0].mind, slots[1].mind = _m("a"), _m("b")
    slots[2].tokens.append([5, 6])
    assert choose_slot(slots, _prompt(1), 0.1, set(), mind=_m("c")) is slots[2]
    slots[2].mind = _m("z")
    slots[0].t_last_used, slots[1].t_last_used, slots[2].t_last_used = 3.0, 1.0, 2.0
    assert choose_slot(slots, _prompt(1), 0.1, set(), mind=_m("c")) is slots[1]
    slots.append(Slot(3, n_ctx=1024, t_last_used=9.0))
    assert choose_slot(slots, _prompt(1), 0.1, set(), mind=_m("c")) is slots[3]


def test_anonymous_requests_never_match_a_minds_prefix() -> None:
    slots = _slots(2)
    slots[0].tokens.append([1, 2, 3, 4])
    slots[0].mind = _m("m")
    slots[0].t_last_used = 0.0
    slots[1].t_last_used = 5.0
    assert choose_slot(slots, _prompt(1, 2, 3, 4, 5), 0.1, set()) is slots[1]
    slots[1].mind = _m("n")  # every idle slot holds a mind: the LRU one (paged out first)
    assert choose_slot(slots, _prompt(1, 2, 3, 4, 5), 0.1, set()) is slots[0]


def test_queue_finds_a_minds_slot_behind_other_work() -> None:
    slots = _slots(2)
    slots[0].mind = _m("m")
    queue = WaitQueue(0.1)
    queue.add(Job(1, 0, None, "verb on slot 0"))
    queue.add(Job(2, -1, _prompt(1), "mind request", mind=_m("m")))
    started = [(job.req_id, slot.id) for job, slot in queue.startable(slots)]
    assert started[0] == (1, 0)
    assert (2, 0) in started  # the same pass, once the verb left the slot idle


def test_block_hashes_chain_over_full_blocks_from_the_tenant() -> None:
    """Defects caught: a block's hash not covering every token before it (a later block
    matching after an earlier mismatch), or two tenants' equal prompts hashing alike (one
    key's prompt a cache hit for another: a prefix oracle across keys)."""
    a = np.arange(3 * BLOCK_TOKENS + 5, dtype=np.int32)
    b = a.copy()
    b[BLOCK_TOKENS + 1] = -7
    ha, hb = block_hashes(a, "ka"), block_hashes(b, "ka")
    assert len(ha) == 3
    assert ha[0] == hb[0] and ha[1] != hb[1] and ha[2] != hb[2]
    assert block_hashes(a[: BLOCK_TOKENS - 1], "ka") == []
    assert not set(block_hashes(a, "kb")) & set(ha)


def test_trim_gives_back_the_unused_part_of_a_reservation() -> None:
    store = PageStore(1000)
    spare = store.reserve(spare_key("test"), 600)
    assert store.reservations() == [(spare_key("test"), 600)]
    res = store.trim(spare, _m("m"), 400)
    assert store.charged_bytes == 400 and res.key == _m("m")
    assert store.reservations() == [(_m("m"), 400)]
    store.cancel(res)
    assert store.charged_bytes == 0


def test_a_copy_taken_before_a_turn_never_makes_the_mind_clean() -> None:
    """A flush postpones a mind's dirty mark; a turn seated after the copy was taken must keep
    it dirty when that copy's write is recorded (else the spill before exit skipped it and a
    restart served the older copy)."""
    flushes = FlushSchedule()
    key = _m("ann")
    flushes.changed(key)
    assert flushes.due(0.0, busy=()) == [key]  # postponed: its mark is now
    t_copied = time.time()
    time.sleep(0.01)
    flushes.changed(key)  # a turn after the copy was taken
    flushes.flushed(key, t_copied)
    assert flushes.is_dirty(key)
    flushes.flushed(key, time.time())  # a copy taken after the turn
    assert not flushes.is_dirty(key)


def test_the_flush_schedule_hands_out_due_minds_oldest_first_and_postpones_them() -> None:
    """Decision: `due` gives the minds whose first change is `age_s` old, oldest first, and
    postpones each by a window (a mind whose write is refused is not retried every pass); a
    busy mind keeps its place (its turn changes it again) and is due as soon as it is idle."""
    now = [0.0]
    flushes = FlushSchedule(lambda: now[0])
    a, b, c = _m("a"), _m("b"), _m("c")
    for key, t in ((a, 0.0), (b, 5.0), (c, 20.0)):
        now[0] = t
        flushes.changed(key)
    now[0] = 70.0
    assert flushes.due(60.0, busy={a}) == [b]  # c changed 50 s ago: not yet
    assert flushes.due(60.0, busy={a}) == []  # b postponed a window
    now[0] = 80.0
    assert flushes.due(60.0, busy=()) == [a, c]  # a's place kept while busy
    now[0] = 130.0
    assert flushes.due(60.0, busy=()) == [b]
    flushes.flushed(b, 131.0)
    assert not flushes.is_dirty(b) and flushes.is_dirty(a)
