"""ngram-simple drafting (pure): llama-server's rule on small token histories."""

from __future__ import annotations

import numpy as np

from kvswap.engine.spec.ngram import ngram_simple_draft


def _arr(tokens: list[int]) -> np.ndarray:
    return np.asarray(tokens, dtype=np.int32)


def test_the_tokens_after_the_newest_earlier_occurrence_are_drafted() -> None:
    history = [9, 1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3, 4, 5, 6, 7, 8, 1, 2]
    # pattern = history[-2:] + sampled = 1 2 3; newest earlier start: 9, then 4 5 6 7 follow
    assert ngram_simple_draft(_arr(history), 3, size_n=3, size_m=4) == [4, 5, 6, 7]


def test_no_match_and_short_histories_draft_nothing() -> None:
    assert ngram_simple_draft(_arr(list(range(40))), 99, size_n=3, size_m=4) == []
    assert ngram_simple_draft(_arr([1, 2, 3, 1, 2]), 3, size_n=3, size_m=4) == []


def test_position_zero_is_never_a_match() -> None:
    history = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 1, 2]
    assert ngram_simple_draft(_arr(history), 3, size_n=3, size_m=4) == []


def test_a_draft_shorter_than_the_ngram_is_dropped() -> None:
    # The only earlier match leaves fewer than size_n tokens after it.
    history = [7] * 11 + [1, 2, 3, 1, 2]
    assert ngram_simple_draft(_arr(history), 3, size_n=3, size_m=4) == []
    history = [7, 7, 7, 7, 7, 7, 5, 1, 2, 3, 8, 9, 4, 6, 1, 2]
    assert ngram_simple_draft(_arr(history), 3, size_n=3, size_m=4) == [8, 9, 4, 6]
