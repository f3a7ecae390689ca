"""Waiting work and slot choice: id_slot, longest prefix, LRU, and arrival order."""

import time

import numpy as np

from kvswap.engine.plan.scheduler import Job, WaitQueue, choose_slot
from kvswap.engine.slot import Slot
from kvswap.engine.tokens import TokenBuffer


def _slots(n: int) -> list[Slot]:
    return [Slot(i, n_ctx=1024, t_last_used=float(i)) for i in range(n)]


def _prompt(*toks: int) -> np.ndarray:
    return np.array(toks, dtype=np.int32)


def test_token_buffer_common_prefix() -> None:
    buf = TokenBuffer(4)
    buf.append([1, 2, 3, 4, 5])
    assert buf.common_prefix(_prompt(1, 2, 3, 9)) == 3
    assert buf.common_prefix(_prompt(1, 2, 3, 4, 5, 6)) == 5
    assert buf.common_prefix(_prompt(7)) == 0
    assert buf.common_prefix(_prompt()) == 0
    buf.truncate(2)
    assert list(buf.view()) == [1, 2]


def test_longest_prefix_above_similarity_wins() -> None:
    slots = _slots(3)
    slots[0].tokens.append([1, 2, 3])
    slots[1].tokens.append([1, 2, 3, 4, 5])
    chosen = choose_slot(slots, _prompt(1, 2, 3, 4, 5, 6), similarity=0.1, taken=set())
    assert chosen is slots[1]


def test_lru_when_no_prefix_is_similar_enough() -> None:
    slots = _slots(3)
    slots[0].tokens.append([9, 9, 9])
    slots[0].t_last_used = 10.0
    slots[1].t_last_used = 5.0
    slots[2].t_last_used = 7.0
    chosen = choose_slot(slots, _prompt(1, 2, 3), similarity=0.1, taken=set())
    assert chosen is slots[1]


def test_busy_slots_are_never_chosen() -> None:
    slots = _slots(2)
    slots[0].running = object()  # type: ignore[assignment]
    slots[1].running = object()  # type: ignore[assignment]
    assert choose_slot(slots, _prompt(1), similarity=0.1, taken=set()) is None


def test_unpinned_requests_wait_in_order() -> None:
    slots = _slots(2)
    slots[0].running = object()  # type: ignore[assignment]
    slots[1].running = object()  # type: ignore[assignment]
    q = WaitQueue(similarity=0.1)
    q.add(Job(1, -1, _prompt(1)))
    q.add(Job(2, -1, _prompt(2)))
    assert list(q.startable(slots)) == []
    slots[1].running = None
    started = []
    for job, slot in q.startable(slots):
        started.append((job.req_id, slot.id))
        slot.running = object()  # type: ignore[assignment]
    assert started == [(1, 1)]
    assert [j.req_id for j in q.jobs] == [2]


def test_jobs_on_one_slot_run_in_arrival_order() -> None:
    slots = _slots(2)
    slots[0].running = object()  # type: ignore[assignment]
    q = WaitQueue(similarity=0.1)
    q.add(Job(1, 0))  # a verb on the busy slot 0
    q.add(Job(2, 0))
    q.add(Job(3, 1))  # a verb on the idle slot 1: not held up by slot 0's queue
    assert [(j.req_id, s.id) for j, s in q.startable(slots)] == [(3, 1)]
    slots[0].running = None
    # Verbs finish at once, so both jobs of slot 0 start in order in one pass.
    assert [(j.req_id, s.id) for j, s in q.startable(slots)] == [(1, 0), (2, 0)]


def test_an_unpinned_request_does_not_jump_a_slot_queue() -> None:
    slots = _slots(1)
    slots[0].running = object()  # type: ignore[assignment]
    q = WaitQueue(similarity=0.1)
    q.add(Job(1, 0))
    q.add(Job(2, -1, _prompt(5)))
    slots[0].running = None
    started = [job.req_id for job, _slot in q.startable(slots)]
    # The verb on slot 0 runs first; the request then finds the slot idle again.
    assert started == [1, 2]


def test_remove_drops_a_waiting_job() -> None:
    q = WaitQueue(similarity=0.1)
    q.add(Job(1, -1, _prompt(1)))
    assert q.remove(1) is not None
    assert q.remove(1) is None
    assert len(q) == 0


def test_another_tenants_prompt_in_a_slot_is_no_prefix_match() -> None:
    """Defect caught: an anonymous request of one API key taking (and reusing) a slot whose
    cached prompt another key sent: `cache_n` then tells it how much of its guess the other
    key already sent (a prefix oracle across tenants)."""
    slots = _slots(2)
    slots[0].tokens.append([1, 2, 3, 4, 5])
    slots[0].namespace = "ka"
    slots[0].t_last_used = 9.0
    prompt = _prompt(1, 2, 3, 4, 5, 6)
    assert choose_slot(slots, prompt, similarity=0.1, taken=set(), namespace="ka") is slots[0]
    assert choose_slot(slots, prompt, similarity=0.1, taken=set(), namespace="kb") is slots[1]
    assert slots[0].prefix_for(prompt, "ka") == 5
    assert slots[0].prefix_for(prompt, "kb") == 0


def test_a_mind_that_adopts_takes_the_anonymous_slot_holding_its_prefix() -> None:
    """Decision: a stored conversation's new mind (`adopt`) is seated where its first turn's
    anonymous KV is, so its second turn prefills only its new input; any other homeless mind
    takes its seat order (an empty slot first), as before."""
    from kvswap.core.keys import mind_key

    slots = _slots(3)
    slots[1].tokens.append([1, 2, 3, 4])  # the first turn, anonymous, of the same tenant
    slots[1].namespace = "ns"
    mind = mind_key("ns", "chain-1")
    prompt = _prompt(1, 2, 3, 4, 5, 6)
    adopted = choose_slot(slots, prompt, similarity=0.1, taken=set(), mind=mind, adopt=True)
    assert adopted is slots[1]
    seated = choose_slot(slots, prompt, similarity=0.1, taken=set(), mind=mind)
    assert seated is slots[0]


def test_a_job_put_back_for_room_keeps_its_place_and_its_wait_counts_from_the_first_try() -> None:
    """What `mind_seat_wait_ms_total` adds up: a job that found no room to start goes back to
    the head of the queue (before jobs that arrived after it) and its wait is timed from its
    first failed start, not reset by each retry; a job that started at once waited 0 ms."""
    queue = WaitQueue(similarity=0.5)
    first, later = Job(1, -1, _prompt(1)), Job(2, -1, _prompt(2))
    assert first.held_ms() == 0.0
    queue.add(later)
    queue.put_back(first)
    began = first.held_since
    assert began is not None
    assert [j.req_id for j in queue.jobs] == [1, 2]
    retried_at = time.perf_counter()
    queue.jobs.remove(first)
    queue.put_back(first)  # a second retry
    assert first.held_since == began < retried_at
    assert first.held_ms() >= (retried_at - began) * 1e3 and later.held_ms() == 0.0
