"""Speculative acceptance (`engine.spec.accept`): which sampled rows are kept, and the counts."""

from __future__ import annotations

from kvswap.engine.spec.accept import Verdict, judge, more


def _verify(draft: list[int], target: list[int], finish_at: int = -1) -> tuple[list[int], Verdict]:
    """Sample `target` row by row as the step does, stopping as `more` says."""
    sampled: list[int] = []
    while not sampled or more(draft, sampled, finished=len(sampled) - 1 == finish_at):
        sampled.append(target[len(sampled)])
    return sampled, judge(draft, sampled)


def test_a_fully_accepted_draft_keeps_every_token_and_samples_one_more() -> None:
    sampled, v = _verify([5, 6, 7], [5, 6, 7, 8])
    assert sampled == [5, 6, 7, 8]
    assert v == Verdict(n_accepted=3, n_matched=3)


def test_the_first_disagreement_ends_verification() -> None:
    sampled, v = _verify([5, 6, 7], [5, 9, 7, 8])
    assert sampled == [5, 9]  # row 2 is never sampled
    assert v == Verdict(n_accepted=1, n_matched=1)


def test_a_rejected_first_draft_token_keeps_only_the_pending_one() -> None:
    sampled, v = _verify([5, 6], [4, 6, 7])
    assert sampled == [4]
    assert v == Verdict(n_accepted=0, n_matched=0)


def test_a_request_that_finishes_on_a_matching_token_counts_it_but_keeps_no_more() -> None:
    # llama-server counts the token that ended the request as accepted; its KV is not kept.
    sampled, v = _verify([5, 6, 7], [5, 6, 7, 8], finish_at=1)
    assert sampled == [5, 6]
    assert v == Verdict(n_accepted=1, n_matched=2)


def test_no_draft_samples_exactly_one_row() -> None:
    sampled, v = _verify([], [3, 4])
    assert sampled == [3]
    assert v == Verdict(n_accepted=0, n_matched=0)
