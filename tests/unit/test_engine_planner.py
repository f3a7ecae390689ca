"""The step planner: decode first, prompt chunks under the budget, logits only where sampled."""

from kvswap.engine.plan.planner import SlotWork, Span, cells_at_end, plan_step


def test_decodes_come_first_and_prefill_fills_the_budget() -> None:
    work = [
        SlotWork(slot_id=1, n_decode=0, n_prompt_left=20, admitted=2),
        SlotWork(slot_id=0, n_decode=1, n_prompt_left=0, admitted=1),
    ]
    plan = plan_step(work, budget=8)
    assert plan.spans == (
        Span(0, 1, is_decode=True, ends_prompt=False),
        Span(1, 7, is_decode=False, ends_prompt=False),
    )
    assert plan.n_tokens == 8
    assert plan.n_prompt_tokens == 7


def test_prefill_is_served_in_admission_order_and_the_last_chunk_ends_the_prompt() -> None:
    work = [
        SlotWork(slot_id=2, n_decode=0, n_prompt_left=3, admitted=5),
        SlotWork(slot_id=1, n_decode=0, n_prompt_left=6, admitted=4),
    ]
    plan = plan_step(work, budget=8)
    assert plan.spans == (
        Span(1, 6, is_decode=False, ends_prompt=True),
        Span(2, 2, is_decode=False, ends_prompt=False),
    )


def test_every_decoding_slot_gets_a_token_even_past_the_budget() -> None:
    work = [SlotWork(slot_id=i, n_decode=1, n_prompt_left=0, admitted=i) for i in range(4)]
    work.append(SlotWork(slot_id=4, n_decode=0, n_prompt_left=100, admitted=9))
    plan = plan_step(work, budget=2)
    assert [s.slot_id for s in plan.spans] == [0, 1, 2, 3]
    assert all(s.is_decode for s in plan.spans)


def test_chunk_limit_cuts_a_prompt_chunk() -> None:
    work = [SlotWork(slot_id=0, n_decode=0, n_prompt_left=50, admitted=1, chunk_limit=10)]
    assert plan_step(work, budget=64).spans == (Span(0, 10, is_decode=False, ends_prompt=False),)


def test_nothing_to_do_is_an_empty_plan() -> None:
    assert plan_step([], budget=8).spans == ()


def test_free_cells_hold_prompt_chunks_back_but_never_a_decode() -> None:
    """Decision (a unified pool with few free cells): prompt chunks shrink to the free cells,
    in admission order, so the decode that follows finds room; decode tokens are always
    planned (one that cannot fit fails, and the engine's full-pool path answers it)."""
    work = [
        SlotWork(slot_id=0, n_decode=1, n_prompt_left=0, admitted=1),
        SlotWork(slot_id=1, n_decode=0, n_prompt_left=100, admitted=2),
        SlotWork(slot_id=2, n_decode=0, n_prompt_left=100, admitted=3),
    ]
    assert plan_step(work, budget=64, n_cells=10).spans == (
        Span(0, 1, is_decode=True, ends_prompt=False),
        Span(1, 9, is_decode=False, ends_prompt=False),
    )
    assert plan_step(work, budget=64, n_cells=0).spans == (
        Span(0, 1, is_decode=True, ends_prompt=False),
    )
    assert plan_step(work, budget=8, n_cells=1000).n_tokens == 8  # the budget still holds


def test_cells_at_end_are_the_prompt_and_a_bounded_n_predict_within_the_window() -> None:
    """What a request will hold when it ends, as far as it can be foreseen: an unbounded
    n_predict adds nothing (its growth is not foreseeable), the window caps it, and a request
    never holds less than it already does."""
    assert cells_at_end(2500, 8, 8192) == 2508
    assert cells_at_end(2500, -1, 8192) == 2500
    assert cells_at_end(8000, 500, 8192) == 8192
    assert cells_at_end(10, 4, 8192, n_held=30) == 30
