"""Speculative decoding on the real engine: token identity with and without a draft (SPEC §9),
single and parallel, for SmolLM2 drafting for itself, SmolLM2 with a tiny random draft, a tiny
hybrid target (rollback snapshots) with a tiny draft, and ngram-simple; a mind paged out and in
drafts as one that never moved; a page's draft bytes count against the ceiling."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import pytest

from kvswap.backend.model import Model
from kvswap.core.errors import KvswapError
from kvswap.core.keys import page_key
from kvswap.core.types import Completion, GenerationRequest
from kvswap.engine.commands import PageIn, PageMoved, PageOut
from kvswap.engine.engine import Engine
from kvswap.engine.spec.speculate import DRAFT_SIMPLE, NGRAM_SIMPLE, SpecConfig, check_compatible
from kvswap.tiny import tiny_model_path
from tests.engine.harness import (
    call,
    complete,
    complete_all,
    explain_mismatch,
    make_engine,
    request,
)

pytestmark = pytest.mark.model

# Chosen in advance for their wide top-2 margins (see test_engine_generation.STABLE_PROMPTS):
# batches of 64+ rows take the tiled flash-attention path, which moves logits by ~0.15.
STABLE_PROMPTS = [
    f"<|im_start|>user\nWhat is the capital of {country}?<|im_end|>\n<|im_start|>assistant\n"
    for country in ("France", "Japan", "Germany", "Italy")
]
# A prompt that quotes itself: its answer repeats what the prompt already holds (ngram-simple).
QUOTING_PROMPT = (
    "<|im_start|>user\nRepeat after me, word for word: one two three four five six seven "
    "eight nine ten.<|im_end|>\n<|im_start|>assistant\none two three four five six seven eight "
    "nine ten.<|im_end|>\n<|im_start|>user\nAgain, the same words.<|im_end|>\n"
    "<|im_start|>assistant\n"
)

DRAFT3 = SpecConfig(DRAFT_SIMPLE, n_max=3)


@pytest.fixture(scope="module")
def smollm2_draft(smollm2_path) -> Iterator[Model]:  # type: ignore[no-untyped-def]
    model = Model.load(smollm2_path)
    yield model
    model.close()


@pytest.fixture(scope="module")
def tiny_smollm2_draft() -> Iterator[Model]:
    model = Model.load(tiny_model_path("llama", vocab="smollm2", n_embd=32, seed=3))
    yield model
    model.close()


@pytest.fixture(scope="module")
def hybrid() -> Iterator[tuple[Model, Model]]:
    target = Model.load(tiny_model_path("lfm2"))
    draft = Model.load(tiny_model_path("llama", seed=5))
    yield target, draft
    draft.close()
    target.close()


def _tok(model: Model, text: str) -> list[int]:
    return [int(t) for t in model.vocab.tokenize(text, True, True)]


def _solo(engine: Engine, reqs: Sequence[GenerationRequest]) -> list[Completion]:
    return [complete(engine, r) for r in reqs]


def _compare_with_and_without(
    target: Model,
    reqs: Sequence[GenerationRequest],
    spec: SpecConfig,
    draft: Model | None,
    n_ctx: int = 2048,
) -> list[Completion]:
    """Run `reqs` without a draft, then with one alone and all together: the same tokens."""
    plain = make_engine(target, n_ctx=n_ctx)
    try:
        ref = _solo(plain, reqs)
    finally:
        plain.close()
    runs = []
    for together in (False, True):
        eng = make_engine(target, n_ctx=n_ctx, spec=spec, draft_model=draft)
        try:
            out = complete_all(eng, reqs) if together else _solo(eng, reqs)
            snap = eng.snapshot.metrics
            assert snap.spec_decode_num_draft_tokens_total == sum(c.timings.draft_n for c in out)
            assert snap.spec_decode_num_accepted_tokens_total == sum(
                c.timings.draft_n_accepted for c in out
            )
        finally:
            eng.close()
        for alone, spec_run in zip(ref, out, strict=True):
            assert spec_run.tokens == alone.tokens, explain_mismatch(alone, spec_run)
            assert spec_run.content == alone.content
            assert spec_run.timings.speculative
        runs.extend(out)
    return runs


def test_smollm2_drafting_for_itself_is_token_identical_and_accepts(smollm2, smollm2_draft) -> None:  # type: ignore[no-untyped-def]
    reqs = [request(_tok(smollm2, p), n_predict=16, n_probs=2) for p in STABLE_PROMPTS]
    runs = _compare_with_and_without(smollm2, reqs, DRAFT3, smollm2_draft)
    for c in runs:
        assert c.timings.draft_n > 0
        # The same model as its own draft agrees on every token it drafts before the end.
        assert c.timings.draft_n_accepted >= c.timings.draft_n - 3
        assert c.timings.draft_prompt_n == c.timings.prompt_n


def test_smollm2_with_a_tiny_random_draft_is_token_identical(smollm2, tiny_smollm2_draft) -> None:  # type: ignore[no-untyped-def]
    check_compatible(smollm2, tiny_smollm2_draft)
    reqs = [request(_tok(smollm2, p), n_predict=16, n_probs=2) for p in STABLE_PROMPTS]
    runs = _compare_with_and_without(smollm2, reqs, DRAFT3, tiny_smollm2_draft)
    assert all(c.timings.draft_n > 0 for c in runs)


def test_a_hybrid_target_with_a_tiny_draft_rolls_back_and_is_token_identical(hybrid) -> None:  # type: ignore[no-untyped-def]
    target, draft = hybrid
    rng = np.random.default_rng(0)
    reqs = [request(rng.integers(10, 300, 20).tolist(), n_predict=32) for _ in range(4)]
    runs = _compare_with_and_without(target, reqs, DRAFT3, draft, n_ctx=1024)
    # A random draft is mostly wrong: every rejection restored a snapshot and re-decoded.
    assert sum(c.timings.draft_n for c in runs) > sum(c.timings.draft_n_accepted for c in runs)


def test_a_hybrid_target_drafting_for_itself_accepts_everything(hybrid) -> None:  # type: ignore[no-untyped-def]
    target, _ = hybrid
    rng = np.random.default_rng(1)
    reqs = [request(rng.integers(10, 300, 20).tolist(), n_predict=24) for _ in range(2)]
    runs = _compare_with_and_without(target, reqs, SpecConfig(DRAFT_SIMPLE, n_max=4), target, 1024)
    assert all(c.timings.draft_n_accepted == c.timings.draft_n > 0 for c in runs)


def test_ngram_simple_drafts_from_the_slot_tokens_and_is_token_identical(smollm2) -> None:  # type: ignore[no-untyped-def]
    spec = SpecConfig(NGRAM_SIMPLE, ngram_size_n=3, ngram_size_m=8)
    reqs = [request(_tok(smollm2, QUOTING_PROMPT), n_predict=16, n_probs=2)]
    runs = _compare_with_and_without(smollm2, reqs, spec, None)
    assert all(c.timings.draft_n_accepted > 0 for c in runs)
    assert all(c.timings.draft_prompt_n == 0 for c in runs)  # no draft model, no draft prefill


# -- pages ---------------------------------------------------------------------------------


def _follow_up(model: Model, first_prompt: list[int], first: Completion) -> list[int]:
    more = _tok(model, "<|im_end|>\n<|im_start|>user\nAnd its population?<|im_end|>\n")[1:]
    return first_prompt + list(first.tokens) + more + _tok(model, "<|im_start|>assistant\n")[1:]


def test_a_paged_mind_drafts_like_one_that_never_moved(smollm2, tiny_smollm2_draft) -> None:  # type: ignore[no-untyped-def]
    prompt = _tok(smollm2, STABLE_PROMPTS[0])
    turns: list[Completion] = []
    for move in (False, True):
        eng = make_engine(
            smollm2, n_ctx=2048, spec=DRAFT3, draft_model=tiny_smollm2_draft, page_ram_bytes=1 << 28
        )
        try:
            first = complete(eng, request(prompt, n_predict=16, id_slot=1))
            if move:
                out = call(eng, lambda rid, reply: PageOut(rid, 1, page_key("t", "mind"), reply))
                assert isinstance(out, PageMoved) and out.n_bytes_spec > 0
                moved = call(eng, lambda rid, reply: PageIn(rid, 2, page_key("t", "mind"), reply))
                assert isinstance(moved, PageMoved) and moved.n_bytes_spec == out.n_bytes_spec
            turns.append(complete(eng, request(_follow_up(smollm2, prompt, first), n_predict=16)))
        finally:
            eng.close()
    stayed, moved_turn = turns
    assert moved_turn.id_slot == 2 and stayed.id_slot == 1
    assert moved_turn.tokens == stayed.tokens
    # The draft prefilled only the new tokens (plus at most the one it had not seen) ...
    assert moved_turn.timings.draft_prompt_n <= moved_turn.timings.prompt_n + 1
    # ... exactly as the mind that never moved, and accepted the same drafts.
    assert moved_turn.timings.draft_prompt_n == stayed.timings.draft_prompt_n
    assert moved_turn.timings.draft_n == stayed.timings.draft_n
    assert moved_turn.timings.draft_n_accepted == stayed.timings.draft_n_accepted


def test_a_page_with_draft_state_fits_the_ceiling_exactly_and_not_one_byte_over() -> None:
    target = Model.load(tiny_model_path("llama"))
    draft = Model.load(tiny_model_path("llama", seed=5))
    prompt = list(range(10, 60))
    try:
        sizes: list[int] = []
        for ceiling in (1 << 24, 0, -1):
            n_bytes = sizes[0] + ceiling if ceiling <= 0 else ceiling
            eng = make_engine(
                target, n_ctx=512, spec=DRAFT3, draft_model=draft, page_ram_bytes=n_bytes
            )
            try:
                first = complete(eng, request(prompt, n_predict=8, id_slot=0))
                out = call(eng, lambda rid, reply: PageOut(rid, 0, page_key("t", "p"), reply))
                if ceiling > 0:
                    assert isinstance(out, PageMoved) and out.n_bytes_spec > 0
                    assert eng.store is not None
                    sizes.append(eng.store.charged_bytes)
                    assert sizes[0] == 4 * out.n_tokens + out.n_bytes + out.n_bytes_spec
                elif ceiling == 0:
                    assert isinstance(out, PageMoved) and eng.store is not None
                    assert eng.store.charged_bytes == n_bytes
                else:
                    assert isinstance(out, KvswapError), out
                    # The slot kept its state: the same prompt again is a full cache hit.
                    again = complete(eng, request(prompt, n_predict=8, id_slot=0))
                    assert again.timings.cache_n == len(prompt) - 1
                    assert again.tokens == first.tokens
            finally:
                eng.close()
    finally:
        draft.close()
        target.close()
