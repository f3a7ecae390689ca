"""The end of a mind's turn in a cluster, on the CPU: the tokens the token log appends, the
turn's id, a takeover's figures, and `SharedMinds.turn_done` against a stand-in `SharedTier`.

Each test names the defect it would catch: a sampled token the KV never held appended to the
log, a retried turn applied twice, re-prefilled tokens miscounted (the figure that says what a
publication missed), a lost mind's turn answered as if it were served.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kvswap.core.errors import ErrorKind
from kvswap.core.keys import PageKey, mind_key, namespace_of
from kvswap.core.sampling import SamplingParams
from kvswap.core.types import (
    Completion,
    EngineError,
    GenerationRequest,
    StopType,
    Timings,
    TurnMark,
)
from kvswap.core.vocab import ResumeSource
from kvswap.minds import figures as fig
from kvswap.minds.placement import TurnFacts
from kvswap.minds.shared import SharedMinds
from kvswap.minds.turnrecord import decode_record
from kvswap.tiers.shared.replica import Resumed

KEY = mind_key(namespace_of("k"), "alice")
PROMPT = np.arange(0, 132, dtype=np.int32)  # 100 tokens of history, 32 new


def completion(*, cache_n: int, tokens: tuple[int, ...] = (500, 501, 502)) -> Completion:
    n_cached = len(PROMPT) + len(tokens) - 1  # the last sampled token is not in the KV
    timings = Timings(cache_n=cache_n, prompt_n=len(PROMPT) - cache_n, prompt_ms=40.0,
                      predicted_n=len(tokens), predicted_ms=30.0)  # fmt: skip
    return Completion(
        req_id=7, id_slot=0, content="abc", tokens=tokens, n_decoded=len(tokens),
        n_prompt_tokens=len(PROMPT), n_tokens_cached=n_cached, stop_type=StopType.LIMIT,
        stopping_word="", timings=timings, seed=1, sampling=SamplingParams(), n_predict=3,
    )  # fmt: skip


def resumed(source: ResumeSource, known: int = 100, **fields: Any) -> Resumed:
    return Resumed(source, tokens_known=PROMPT[:known].copy(), fetch_s=0.2, verify_s=0.05, **fields)


def test_the_log_gets_what_the_kv_holds_not_the_last_sampled_token() -> None:
    """Defect caught: the turn's last sampled token (never decoded into the KV) appended to the
    token log: the next owner would believe the KV holds it."""
    done = completion(cache_n=100)
    got = fig.kv_tokens(PROMPT, done)
    assert list(got) == [*range(132), 500, 501]


def test_a_turn_id_is_the_requests_else_a_digest_of_its_tokens() -> None:
    """Defect caught: a retried turn (same request, no X-Request-Id, no forwarder) applied to
    the log twice: the same tokens give the same id, other tokens another; and (audit A9) a
    regenerated answer to the same request kept as a duplicate, the log holding the first
    answer while the KV holds the second."""
    tokens = fig.kv_tokens(PROMPT, completion(cache_n=100))
    assert fig.turn_id(TurnFacts("req-1"), tokens).startswith("req-1:")
    assert fig.turn_id(TurnFacts("req-1"), tokens) == fig.turn_id(TurnFacts("req-1"), tokens)
    assert fig.turn_id(TurnFacts("req-1"), tokens[:-1]) != fig.turn_id(TurnFacts("req-1"), tokens)
    assert fig.turn_id(None, tokens) == fig.turn_id(None, tokens.copy())
    assert fig.turn_id(None, tokens).startswith("tokens:")
    assert fig.turn_id(None, tokens[:-1]) != fig.turn_id(None, tokens)


def test_a_takeover_from_the_tier_reprefills_nothing_the_mind_held() -> None:
    """Decision: resumed from the tier's page with the history cached, the turn prefilled only
    its new tokens: 0 re-prefilled; the figures count one resume from the tier."""
    figures = fig.takeover_figures(
        resumed(ResumeSource.TIER), PROMPT, completion(cache_n=100), "t9",
        lease_wait_s=1.5, restore_ms=3.0,
    )  # fmt: skip
    assert figures.n_reprefilled == 0 and figures.n_prompt == 32
    assert figures.counts() == {
        "n_resumes": 1, "n_resumes_tier": 1, "n_resumes_fallback": 0, "lease_wait_s": 1.5,
        "fetch_s": 0.2, "verify_s": 0.05, "restore_s": 0.003, "prefill_s": 0.04,
        "n_reprefilled_tokens": 0,
    }  # fmt: skip
    assert "the shared tier" in figures.describe()


def test_a_takeover_after_a_miss_counts_the_history_prefilled_again() -> None:
    """Defect caught: a takeover that fell back to a re-prefill reported as free: the 100
    tokens the mind held were prefilled again, and counted as a fallback."""
    figures = fig.takeover_figures(
        resumed(ResumeSource.NONE, miss="chunk_corrupt"), PROMPT, completion(cache_n=0), "t9",
        lease_wait_s=0.0, restore_ms=0.0,
    )  # fmt: skip
    assert figures.n_reprefilled == 100
    assert figures.counts()["n_resumes_fallback"] == 1
    assert "after a miss (chunk_corrupt)" in figures.describe()


def test_a_retry_of_a_turn_the_dead_owner_logged_compares_with_the_restored_page() -> None:
    """Decision: when the log already ends with this very turn (its owner died after logging
    it), what the mind held before is the restored page, not the log (which holds the turn)."""
    logged = np.concatenate([PROMPT, np.array([500, 501], np.int32)])
    got = resumed(ResumeSource.TIER, last_turn="t9", page_tokens=PROMPT[:100].copy())
    got.tokens_known = logged
    figures = fig.takeover_figures(
        got, PROMPT, completion(cache_n=90), "t9", lease_wait_s=0.0, restore_ms=0.0
    )
    assert figures.n_reprefilled == 10  # held 100, found 90 cached


@dataclass
class FakeTier:
    """`SharedTier`'s turn-end surface: `lost` makes the end report the mind lost."""

    lost: bool = False
    ends: list[tuple[PageKey, str, list[int]]] = field(default_factory=list)
    chats: list[bytes] = field(default_factory=list)
    forgotten: list[PageKey] = field(default_factory=list)
    counted: list[dict[str, float]] = field(default_factory=list)

    def end_turn(
        self, key: PageKey, turn_id: str, tokens: np.ndarray, chat: bytes = b""
    ) -> str | None:
        self.ends.append((key, turn_id, [int(t) for t in tokens]))
        self.chats.append(chat)
        return "this replica lost the mind to another one during the turn" if self.lost else None

    def forget(self, key: PageKey) -> None:
        self.forgotten.append(key)

    def count(self, **deltas: float) -> None:
        self.counted.append(deltas)


def _turn_done(
    tier: FakeTier, source: ResumeSource, mark: TurnMark | None = None
) -> Completion | EngineError:
    shared = SharedMinds(tier)  # type: ignore[arg-type]
    prompt = tuple(int(t) for t in PROMPT)
    request = GenerationRequest(prompt_tokens=prompt, mind=KEY, turn_mark=mark)
    try:
        return asyncio.run(
            shared.turn_done(
                request, completion(cache_n=100), facts=TurnFacts("req-9"),
                resumed=resumed(source), lease_wait_s=0.5, restore_ms=2.0,
            )
        )  # fmt: skip
    finally:
        shared.close()


def test_a_turns_end_is_written_and_a_takeover_counted_once() -> None:
    """Decision: the turn's end reaches the tier under the request's id, before its answer;
    a mind held already counts no takeover."""
    tier = FakeTier()
    done = _turn_done(tier, ResumeSource.TIER)
    assert isinstance(done, Completion)
    ((key, turn_id, written),) = tier.ends
    assert (key, written) == (KEY, [*range(132), 500, 501]) and turn_id.startswith("req-9:")
    assert [c["n_resumes"] for c in tier.counted] == [1]
    held_tier = FakeTier()
    _turn_done(held_tier, ResumeSource.HELD)
    assert held_tier.counted == []


def test_a_chat_turns_end_carries_its_last_turn_for_the_next_owner() -> None:
    """Decision: a chat turn's end writes, with its tokens, the record from which any replica
    continues the mind's own answer (its last token, never in the KV, carried in it); a turn
    that is no chat turn writes none, and the tier drops the previous one."""
    tier = FakeTier()
    _turn_done(tier, ResumeSource.HELD, TurnMark(3, 500, "digest", "opening"))
    ((_, turn_id, written),) = tier.ends
    got = decode_record(tier.chats[0], np.asarray(written, dtype=np.int32), turn_id)
    assert got is not None and got.tokens.tolist() == [*range(132), 500, 501, 502]
    assert (got.position.n_prompt, got.position.prompt_chars, got.n_messages) == (132, 500, 3)
    assert (got.content, got.opening) == ("abc", "opening")
    raw = FakeTier()
    _turn_done(raw, ResumeSource.HELD)
    assert raw.chats == [b""]


def test_a_mind_lost_during_its_turn_answers_503_and_drops_its_copies() -> None:
    """Defect caught: a turn whose mind another replica took meanwhile answered as served
    (its client would continue a conversation the new owner never saw)."""
    tier = FakeTier(lost=True)
    done = _turn_done(tier, ResumeSource.HELD)
    assert isinstance(done, EngineError) and done.kind is ErrorKind.UNAVAILABLE
    assert "retry the turn" in done.message
    assert tier.forgotten == [KEY]
