"""A unified pool's cells planned before a start or a step needs them (`engine.room.Room`), on
the CPU: the real seating moving idle residents out (`standins`: token-only states), a step
replanned by the real planner, and running requests that are only their prompt and
`n_predict`."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from kvswap.core.keys import PageKey, mind_key
from kvswap.core.types import GenerationRequest
from kvswap.engine.plan.planner import SlotWork, StepPlan, plan_step
from kvswap.engine.room import Room
from kvswap.engine.seats.outcomes import PagedOut
from tests.unit.standins import NS, EngineSide, engine_side, tokens


@dataclass
class _Running:
    """What the room reads of a running request."""

    prompt: npt.NDArray[np.int32]
    request: GenerationRequest


def _running(side: EngineSide, slot_id: int, n_prompt: int, n_predict: int) -> None:
    prompt = np.array(tokens(n_prompt), dtype=np.int32)
    side.slots[slot_id].tokens.replace(prompt[: n_prompt // 2])  # half of it prefilled yet
    request = GenerationRequest(prompt_tokens=tuple(tokens(n_prompt)), n_predict=n_predict)
    side.slots[slot_id].running = _Running(prompt, request)  # type: ignore[assignment]


def _m(name: str) -> PageKey:
    return mind_key(NS, name)


def _room(side: EngineSide, work: list[SlotWork], budget: int = 64) -> Room:
    return Room(
        side.runtime,
        side.slots,
        side.seating.page_out_idle_resident,
        lambda n_cells: plan_step(work, budget, n_cells),
    )


def _request(n_prompt: int, n_predict: int) -> GenerationRequest:
    return GenerationRequest(prompt_tokens=tuple(tokens(n_prompt)), n_predict=n_predict)


def test_a_request_starts_only_when_its_cells_fit_beside_the_running_ones_at_their_end() -> None:
    """Defect caught: two prompts that together exceed the pool both started, so one failed
    mid-way with a 503 (`decode: failed to find a memory slot`) though waiting for the other
    would have served both. The newcomer waits while the running request's end (its prompt
    and its bounded n_predict) leaves it no room; an unbounded n_predict reserves nothing past
    the prompt; with nothing running a request always starts; separate streams never wait."""
    side = engine_side(n_slots=4, n_ctx=1000)
    room = _room(side, [])
    assert room.may_start(_request(990, 8))  # nothing running
    _running(side, 0, 500, 100)  # will hold 600 cells
    assert room.may_start(_request(392, 8))
    assert not room.may_start(_request(393, 8))
    assert room.may_start(_request(400, -1))  # 600 + 400: its own growth is not foreseeable
    assert not room.may_start(_request(401, -1))
    streams = engine_side(n_slots=4, n_ctx=1000, kv_unified=False)
    _running(streams, 0, 500, 100)
    assert _room(streams, []).may_start(_request(900, 8))


def test_a_step_that_needs_more_cells_moves_idle_residents_out_first() -> None:
    """Decision: before a step whose tokens need more cells than are free, idle residents move
    out, least recently used first, only as many as the step needs, so the decode never fails
    (the engine used to try it, fail it, and page out after)."""
    side = engine_side(n_slots=4, n_ctx=200)
    old, mid = _m("old"), _m("mid")
    side.seated(0, old, 60, start=100).t_last_used = 0.0
    side.seated(1, mid, 60, start=200).t_last_used = 1.0
    _running(side, 2, 100, 4)  # 50 prefilled: 170 of 200 cells used
    work = [SlotWork(slot_id=2, n_decode=0, n_prompt_left=50, admitted=1)]
    room = _room(side, work)
    plan = plan_step(work, 64)
    side.seating.spare.ask(1 << 12)  # type: ignore[union-attr]  # a spare mapped ahead
    assert room.fit(plan) == plan
    assert side.registry.residents() == {mid: 1} and side.store.has(old)
    side.check()


def test_what_cannot_move_shrinks_the_step_and_a_wait_for_a_buffer_holds_it() -> None:
    """Decision: when idle residents cannot make room, the step's prompt chunks shrink to the
    free cells (a decode then never fails for lack of them); when nothing fits until a move's
    buffer arrives, the step waits (None); when nothing fits and nothing can move, the plan
    goes as it is and the engine's full-pool path answers its failed decode."""
    side = engine_side(n_slots=2, n_ctx=200)
    _running(side, 0, 300, 4)  # 150 prefilled, 50 free
    work = [SlotWork(slot_id=0, n_decode=0, n_prompt_left=150, admitted=1)]
    plan = plan_step(work, 64)
    fitted = _room(side, work).fit(plan)
    assert fitted is not None and fitted.n_tokens == 50
    side.slots[0].tokens.replace(np.array(tokens(200), dtype=np.int32))  # the pool is full
    assert _room(side, work).fit(plan) == plan  # nothing can move: let it fail and be answered
    waiting = Room(side.runtime, side.slots, lambda: PagedOut.WAITING, lambda n: StepPlan(()))
    assert waiting.fit(plan) is None
