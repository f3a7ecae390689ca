"""The engine on SmolLM2: parallel identity, prefix reuse, stops, cancellation, a full pool."""

from __future__ import annotations

import logging
import time

import pytest

from kvswap.backend.liblog import route_libllama_logs
from kvswap.core.errors import ErrorKind
from kvswap.core.keys import PageKind
from kvswap.core.sampling import SamplingParams
from kvswap.core.types import Completion, EngineError, GenerationRequest, StopType
from kvswap.engine.commands import Cancel, Erased, SlotErase
from tests.engine.harness import (
    call,
    complete,
    complete_all,
    explain_mismatch,
    make_engine,
    request,
    submit,
)

pytestmark = pytest.mark.model

# Chosen in advance (SPEC §9) for their top-2 margins over 16 greedy tokens (each >= 0.9 in
# log-prob alone): a batch of 64 or more query rows takes libllama's tiled flash-attention path,
# whose float results differ from the small-batch path by up to ~0.15 in log-prob.
STABLE_PROMPTS = [
    f"<|im_start|>user\nWhat is the capital of {country}?<|im_end|>\n<|im_start|>assistant\n"
    for country in ("France", "Japan", "Germany", "Italy")
]

PROMPTS = [
    "<|im_start|>user\nWrite a short poem about the sea.<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>user\nList three colours.<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>user\nExplain what a computer is in one sentence.<|im_end|>\n<|im_start|>assistant\n",
]


@pytest.fixture()
def engine(smollm2):  # type: ignore[no-untyped-def]
    eng = make_engine(smollm2, n_ctx=2048, n_parallel=4)
    yield eng
    eng.close()


def _tok(model, text: str):  # type: ignore[no-untyped-def]
    return model.vocab.tokenize(text, True, True)


def test_four_parallel_requests_are_token_identical_to_each_alone(smollm2, engine) -> None:  # type: ignore[no-untyped-def]
    reqs = [request(_tok(smollm2, p), n_predict=16, n_probs=2) for p in STABLE_PROMPTS]
    solo = [complete(engine, r) for r in reqs]
    # A fresh engine, so no slot has the prompts cached: all four prefill in one batch.
    parallel_engine = make_engine(smollm2, n_ctx=2048, n_parallel=4)
    try:
        together = complete_all(parallel_engine, reqs)
    finally:
        parallel_engine.close()
    for alone, par in zip(solo, together, strict=True):
        assert par.tokens == alone.tokens, explain_mismatch(alone, par)
        assert par.content == alone.content


def test_a_follow_up_reuses_the_slot_cache(smollm2, engine) -> None:  # type: ignore[no-untyped-def]
    first_prompt = _tok(smollm2, PROMPTS[0])
    first = complete(engine, request(first_prompt, n_predict=12))
    follow_text = (
        PROMPTS[0]
        + first.content
        + "<|im_end|>\n<|im_start|>user\nAnd another?<|im_end|>\n<|im_start|>assistant\n"
    )
    follow = _tok(smollm2, follow_text)
    shared = len(first_prompt) + len(first.tokens)
    second = complete(engine, request(follow, n_predict=4))
    assert second.id_slot == first.id_slot
    assert second.timings.cache_n >= shared - 1 - 1  # the last generated token was never decoded
    assert second.timings.prompt_n <= len(follow) - shared + 2
    assert second.timings.cache_n + second.timings.prompt_n == len(follow)


def test_an_identical_prompt_still_evaluates_one_token(smollm2, engine) -> None:  # type: ignore[no-untyped-def]
    prompt = _tok(smollm2, PROMPTS[2])
    a = complete(engine, request(prompt, n_predict=6))
    b = complete(engine, request(prompt, n_predict=6))
    assert b.timings.prompt_n == 1
    assert b.timings.cache_n == len(prompt) - 1
    assert a.tokens == b.tokens


def test_stop_string_and_n_predict(smollm2, engine) -> None:  # type: ignore[no-untyped-def]
    prompt = _tok(smollm2, PROMPTS[1])
    free = complete(engine, request(prompt, n_predict=30))
    assert free.stop_type in (StopType.LIMIT, StopType.EOS)
    word = free.content.split()[1] if len(free.content.split()) > 1 else free.content[:3]
    stopped = complete(engine, request(prompt, n_predict=30, stop=(word,)))
    assert stopped.stop_type is StopType.WORD
    assert stopped.stopping_word == word
    assert stopped.content == free.content[: free.content.index(word)]
    limited = complete(engine, request(prompt, n_predict=3))
    assert limited.n_decoded == 3 and limited.stop_type is StopType.LIMIT


def test_cancel_frees_the_slot(smollm2, engine) -> None:  # type: ignore[no-untyped-def]
    req_id, run = submit(engine, request(_tok(smollm2, PROMPTS[0]), n_predict=10_000, stream=True))
    deadline = time.monotonic() + 30
    while not any(hasattr(e, "text") for e in run.events) and time.monotonic() < deadline:
        time.sleep(0.01)
    engine.post(Cancel(req_id))
    result = run.result
    assert isinstance(result, Completion) and result.cancelled
    deadline = time.monotonic() + 10
    while any(s.is_processing for s in engine.snapshot.slots) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not any(s.is_processing for s in engine.snapshot.slots)


def test_prompt_past_the_window_is_refused(smollm2) -> None:  # type: ignore[no-untyped-def]
    eng = make_engine(smollm2, n_ctx=256, n_parallel=1)
    try:
        result = submit(eng, request([1] * 300))[1].result
        assert isinstance(result, EngineError)
        assert result.kind is ErrorKind.EXCEED_CONTEXT
        assert result.extra == {"n_prompt_tokens": 300, "n_ctx": 256}
        ok = complete(eng, request(_tok(smollm2, PROMPTS[2]), n_predict=2))
        assert ok.n_decoded == 2
    finally:
        eng.close()


def test_a_full_pool_refuses_the_newcomer_and_keeps_the_residents(smollm2) -> None:  # type: ignore[no-untyped-def]
    # Unified pool of 512 cells, 2 slots each allowed the whole pool.
    eng = make_engine(smollm2, n_ctx=512, n_parallel=2, n_ubatch=64)
    try:
        text = " ".join(f"word{i}" for i in range(120))
        resident_prompt = _tok(smollm2, text)[:300]
        resident = complete(eng, request(resident_prompt, n_predict=2, id_slot=0))
        other_prompt = _tok(smollm2, " ".join(f"item{i}" for i in range(150)))[:300]
        assert len(resident_prompt) == len(other_prompt) == 300
        newcomer = submit(eng, request(other_prompt, n_predict=2, id_slot=1))[1].result
        assert isinstance(newcomer, EngineError) and newcomer.kind is ErrorKind.UNAVAILABLE
        # The resident mind is intact: its prefix is still reused in full.
        again = complete(eng, request(resident_prompt, n_predict=2, id_slot=0))
        assert again.timings.cache_n == len(resident_prompt) - 1
        assert again.tokens == resident.tokens
    finally:
        eng.close()


def test_two_prompts_too_large_together_for_the_pool_run_one_after_the_other(  # type: ignore[no-untyped-def]
    smollm2, caplog
) -> None:
    """Defect caught: two requests whose prompts fit the unified pool alone but not together
    both started; the pool filled mid-prefill (`decode: failed to find a memory slot`) and the
    newcomer was refused with a 503. The engine foresees it: the second waits until the first
    ends, both answer as each would alone, and libllama never fails a decode."""
    route_libllama_logs(logging.WARNING)
    caplog.set_level(logging.WARNING, "kvswap.libllama")
    eng = make_engine(
        smollm2, n_ctx=512, n_parallel=2, n_ubatch=64, page_ram_bytes=64 << 20, cache_ram_bytes=-1
    )
    try:
        prompts = [
            _tok(smollm2, " ".join(f"{word}{i}" for i in range(150)))[:300]
            for word in ("word", "item")
        ]
        solo = [
            complete(eng, request(p, n_predict=4, cache_prompt=False, id_slot=0)) for p in prompts
        ]
        together = complete_all(eng, [request(p, n_predict=4, cache_prompt=False) for p in prompts])
        assert [c.tokens for c in together] == [c.tokens for c in solo]
    finally:
        eng.close()
    assert not [r for r in caplog.records if "memory slot" in r.getMessage()]


def test_a_full_pool_moves_the_idle_resident_into_the_anonymous_cache(smollm2) -> None:  # type: ignore[no-untyped-def]
    eng = make_engine(
        smollm2, n_ctx=512, n_parallel=2, n_ubatch=64, page_ram_bytes=64 << 20, cache_ram_bytes=-1
    )
    store = eng.store
    assert store is not None
    try:
        resident_prompt = _tok(smollm2, " ".join(f"word{i}" for i in range(120)))[:300]
        other_prompt = _tok(smollm2, " ".join(f"item{i}" for i in range(150)))[:300]
        resident = complete(eng, request(resident_prompt, n_predict=2, id_slot=0))
        newcomer = complete(eng, request(other_prompt, n_predict=2, id_slot=1))
        assert newcomer.n_decoded == 2
        # The idle slot's state became an entry of the anonymous cache: no page that a request
        # could name and that would live forever.
        (info,) = store.infos()
        assert info.key.kind is PageKind.ANON and info.n_tokens == 301
        # Once there is room it comes back whole: its prompt is a full cache hit.
        assert isinstance(call(eng, lambda rid, reply: SlotErase(rid, 1, reply)), Erased)
        again = complete(eng, request(resident_prompt, n_predict=2, id_slot=0))
        assert again.timings.cache_n == len(resident_prompt) - 1
        assert again.tokens == resident.tokens
        assert not any(i.key.kind is PageKind.ANON for i in store.infos())  # taken back
    finally:
        eng.close()


def test_a_full_pool_purges_an_idle_cached_prompt_when_the_cache_is_off(smollm2) -> None:  # type: ignore[no-untyped-def]
    eng = make_engine(smollm2, n_ctx=512, n_parallel=2, n_ubatch=64, page_ram_bytes=64 << 20)
    store = eng.store
    assert store is not None
    try:
        resident_prompt = _tok(smollm2, " ".join(f"word{i}" for i in range(120)))[:300]
        other_prompt = _tok(smollm2, " ".join(f"item{i}" for i in range(150)))[:300]
        complete(eng, request(resident_prompt, n_predict=2, id_slot=0))
        newcomer = complete(eng, request(other_prompt, n_predict=2, id_slot=1))
        assert newcomer.n_decoded == 2  # as llama-server's try_clear_idle_slots
        assert store.infos() == [] and eng.slots[0].tokens.view().size == 0
    finally:
        eng.close()


def test_a_reader_polling_the_snapshot_sees_the_decode_progress(smollm2, engine) -> None:  # type: ignore[no-untyped-def]
    # Views are built only when read or when more than progress changed: a reader that polls
    # still sees each request's progress (within a step of its read), and the final state.
    tokens = _tok(smollm2, PROMPTS[0])
    req = GenerationRequest(
        prompt_tokens=tuple(int(t) for t in tokens),
        sampling=SamplingParams(temperature=0.0, ignore_eos=True),
        n_predict=400,
    )
    req_id, run = submit(engine, req)
    seen: list[int] = []
    deadline = time.monotonic() + 120
    while len(set(seen)) < 3 and time.monotonic() < deadline:
        busy = [s for s in engine.snapshot.slots if s.is_processing]
        if busy and busy[0].n_decoded > 0:
            seen.append(busy[0].n_decoded)
        time.sleep(0.01)
    assert len(set(seen)) >= 3 and seen == sorted(seen), seen
    result = run.result
    assert isinstance(result, Completion) and result.n_decoded == 400
    deadline = time.monotonic() + 10
    while any(s.is_processing for s in engine.snapshot.slots) and time.monotonic() < deadline:
        time.sleep(0.01)
    last = next(s for s in engine.snapshot.slots if s.id_task == req_id)
    assert not last.is_processing and last.n_decoded == 400
