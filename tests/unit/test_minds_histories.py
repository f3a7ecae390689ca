"""Each mind's last chat turn (`kvswap.minds.histories`): what a turn records, and the bound on
the tokens kept."""

from __future__ import annotations

import numpy as np

from kvswap.core.keys import mind_key
from kvswap.core.types import Completion, SamplingParams, StopType, Timings, TurnMark
from kvswap.minds.histories import MindHistories


def completion(*, tokens: tuple[int, ...]) -> Completion:
    timings = Timings(cache_n=0, prompt_n=1, prompt_ms=1.0, predicted_n=1, predicted_ms=1.0)
    return Completion(
        req_id=1, id_slot=0, content="", tokens=tokens, n_decoded=len(tokens),
        n_prompt_tokens=1, n_tokens_cached=1, stop_type=StopType.EOS, stopping_word="",
        timings=timings, seed=1, sampling=SamplingParams(), n_predict=-1,
    )  # fmt: skip


def test_a_turn_is_its_prompt_then_its_answer_and_the_least_recent_go_past_the_bound() -> None:
    """A mind's record is its prompt's tokens then the answer's, positioned where the prompt
    ends; a mind's newer turn replaces its older; past the token bound the least recently
    recorded minds go, never the one just recorded."""
    histories = MindHistories(budget_tokens=100)
    a, b, c = (mind_key("ns", n) for n in "abc")
    mark = TurnMark(n_messages=2, prompt_chars=40, prompt_digest="d")
    histories.record(a, [1, 2, 3], completion(tokens=(9, 9)), mark)
    turn = histories.get(a)
    assert turn is not None and turn.tokens.tolist() == [1, 2, 3, 9, 9]
    assert (turn.position.n_prompt, turn.position.n_tokens, turn.n_messages) == (3, 5, 2)
    histories.record(a, list(range(40)), completion(tokens=()), mark)
    histories.record(b, list(range(40)), completion(tokens=()), mark)
    histories.record(c, list(range(40)), completion(tokens=()), mark)
    assert histories.get(a) is None and histories.get(b) is not None
    newest = histories.get(c)
    assert newest is not None and len(np.asarray(newest.tokens)) == 40
