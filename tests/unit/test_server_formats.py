"""Response bodies: formats.py, formats_native.py, formats_oai.py, formats_info.py.

Shapes are checked against what llama-server's own tests assert (tools/server/tests/unit:
test_completion.py, test_chat_completion.py, test_tokenize.py, test_slot_save.py,
test_basic.py), and the OpenAI ones by parsing them with the `openai` package's types.
"""

from __future__ import annotations

import json
import math
from typing import Any

import openai.types as oai
import pytest
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from kvswap.core.sampling import LLAMA_DEFAULT_SEED, SamplingParams
from kvswap.core.types import (
    Completion,
    GenerationRequest,
    PromptProgress,
    StopType,
    Timings,
    TokenEvent,
    TokenProb,
    TokenProbs,
)
from kvswap.server import formats, formats_native
from kvswap.server.formats import KvGeometry
from kvswap.server.llama import formats_info
from kvswap.server.llama.formats_info import (
    ContextGeometry,
    ModelView,
    PropsView,
    SlotTaskView,
    SlotView,
)
from kvswap.server.openai import formats_oai
from kvswap.server.openai.formats_oai import OaiMeta

pytestmark = pytest.mark.timeout(30)

TIMINGS = Timings(cache_n=2, prompt_n=6, prompt_ms=12.0, predicted_n=4, predicted_ms=30.0)
META = OaiMeta(id="chatcmpl-abc", model="smollm2", created=1700000000, system_fingerprint="b1-x")
TIMINGS_KEYS = {
    "cache_n",
    "prompt_n",
    "prompt_ms",
    "prompt_per_token_ms",
    "prompt_per_second",
    "predicted_n",
    "predicted_ms",
    "predicted_per_token_ms",
    "predicted_per_second",
}


def token_probs(token: int, piece: bytes, prob: float) -> TokenProbs:
    top = (TokenProb(token, piece, prob), TokenProb(token + 1, b" b", 1.0 - prob))
    return TokenProbs(token=token, piece=piece, prob=prob, top=top)


PROBS = (token_probs(11, b"He", 0.75), token_probs(12, b"llo", 0.5))


def make_completion(**overrides: Any) -> Completion:
    fields: dict[str, Any] = {
        "req_id": 1,
        "id_slot": 0,
        "content": "Hello\nworld",
        "tokens": (11, 12, 13, 14),
        "n_decoded": 4,
        "n_prompt_tokens": 8,
        "n_tokens_cached": 12,
        "stop_type": StopType.LIMIT,
        "stopping_word": "",
        "timings": TIMINGS,
        "seed": 1234,
        "sampling": SamplingParams(),
        "n_predict": 4,
    }
    fields.update(overrides)
    return Completion(**fields)


def make_event(**overrides: Any) -> TokenEvent:
    fields: dict[str, Any] = {
        "req_id": 1,
        "id_slot": 0,
        "text": "He",
        "tokens": (11,),
        "n_decoded": 1,
        "n_prompt_tokens": 8,
    }
    fields.update(overrides)
    return TokenEvent(**fields)


def request(**overrides: Any) -> GenerationRequest:
    return GenerationRequest(prompt_tokens=(1, 2, 3), **overrides)


def strict_json(payload: Any) -> Any:
    """Round-trip through JSON as the server writes it: no NaN, no infinities."""
    return json.loads(json.dumps(payload, allow_nan=False))


def unfinished(chunk: dict[str, Any]) -> Any:
    """A /v1/completions stream chunk, made parsable by `openai.types.Completion`.

    OpenAI streams `finish_reason: null` until the end, but the type only admits the final
    values (the SDK builds stream objects without validating them).
    """
    out = strict_json(chunk)
    for choice in out["choices"]:
        assert choice["finish_reason"] is None
        choice["finish_reason"] = "length"
    return out


# --------------------------------------------------------------------------- primitives


def test_timings_keys_and_rates() -> None:
    t = formats.timings_json(TIMINGS)
    assert set(t) == TIMINGS_KEYS
    assert t["prompt_per_second"] == pytest.approx(500.0)
    assert t["predicted_per_token_ms"] == pytest.approx(10.0)  # 3 decode steps


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b"", 0),
        (b"abc", 3),
        ("é".encode(), 2),
        ("é".encode()[:1], 0),
        (b"a" + "€".encode()[:2], 1),
        (b"a" + "😀".encode()[:3], 1),
        ("😀".encode(), 4),
        (b"a\xff", 2),  # invalid, not cut off: kept (then replaced)
    ],
)
def test_utf8_complete_len(data: bytes, expected: int) -> None:
    assert formats.utf8_complete_len(data) == expected


def test_probs_json_logprob_form() -> None:
    # test_completion.py::test_n_probs: id, token (str), logprob <= 0, bytes, top_logprobs.
    out = formats.probs_json(PROBS, post_sampling=False)
    assert len(out) == 2
    first = out[0]
    assert set(first) == {"id", "token", "bytes", "logprob", "top_logprobs"}
    assert first["id"] == 11 and first["token"] == "He" and first["bytes"] == [72, 101]
    assert first["logprob"] == pytest.approx(math.log(0.75))
    for top in first["top_logprobs"]:
        assert set(top) == {"id", "token", "bytes", "logprob"}
        assert top["logprob"] <= 0.0


def test_probs_json_post_sampling_form() -> None:
    # test_completion.py::test_n_probs_post_sampling: prob in (0, 1], top_probs.
    out = formats.probs_json(PROBS, post_sampling=True)
    assert set(out[0]) == {"id", "token", "bytes", "prob", "top_probs"}
    assert out[0]["prob"] == 0.75
    assert all(set(t) == {"id", "token", "bytes", "prob"} for t in out[0]["top_probs"])


def test_probs_json_edge_values() -> None:
    cut = "€".encode()[:2]
    out = formats.probs_json([TokenProbs(5, cut, 0.0, ())], post_sampling=False)
    assert out[0]["token"] == "" and out[0]["bytes"] == list(cut)
    assert out[0]["logprob"] == formats.FLOAT32_LOWEST  # log(0) without -inf
    strict_json(out)
    bad = formats.probs_json([TokenProbs(5, b"\xffa", 0.5, ())], post_sampling=False)
    assert bad[0]["token"] == "\ufffda"


def test_tokenize_json() -> None:
    # test_tokenize.py: ids, or {"id", "piece"} with a string piece or a byte list.
    assert formats.tokenize_json([1, 2]) == {"tokens": [1, 2]}
    out = formats.tokenize_json([5, 6], [b" hi", "媽".encode()[:2]])
    assert out["tokens"][0] == {"id": 5, "piece": " hi"}
    assert out["tokens"][1] == {"id": 6, "piece": list("媽".encode()[:2])}
    assert formats.detokenize_json("x") == {"content": "x"}
    assert formats.apply_template_json("<s>x") == {"prompt": "<s>x"}
    assert formats.health_json() == {"status": "ok"}


def test_slot_action_results() -> None:
    # test_slot_save.py reads n_saved / n_restored; names from server_task_result_slot_*.
    assert formats.slot_save_json(1, "a.bin", 84, 4096, 1.5) == {
        "id_slot": 1,
        "filename": "a.bin",
        "n_saved": 84,
        "n_written": 4096,
        "timings": {"save_ms": 1.5},
    }
    assert formats.slot_restore_json(0, "a.bin", 84, 4096, 2.0) == {
        "id_slot": 0,
        "filename": "a.bin",
        "n_restored": 84,
        "n_read": 4096,
        "timings": {"restore_ms": 2.0},
    }
    assert formats.slot_erase_json(1, 84) == {"id_slot": 1, "n_erased": 84}


def test_select_fields() -> None:
    body = {"content": "x", "generation_settings": {"n_predict": 8}, "prompt": "p"}
    out = formats.select_fields(["content", "generation_settings/n_predict", "missing/x"], body)
    assert out == {"content": "x", "generation_settings/n_predict": 8}


def test_generation_settings() -> None:
    sampling = SamplingParams(logit_bias=((5, -math.inf), (6, 1.5)), seed=7)
    g = formats.generation_settings_json(request(sampling=sampling, n_predict=9, stop=("x",)))
    assert g["seed"] == 7 and g["n_predict"] == 9 and g["max_tokens"] == 9
    assert g["stop"] == ["x"]
    assert g["logit_bias"] == [{"bias": None, "token": 5}, {"bias": 1.5, "token": 6}]
    assert "adaptive_target" in g and "adaptive_decay" in g  # test_completion_stream
    assert g["samplers"] == list(sampling.samplers)
    assert g["speculative.types"] == "none" and g["lora"] == []
    strict_json(g)
    metrics = formats.generation_settings_json(request(), only_metrics=True)
    for key in ("stop", "logit_bias", "dry_sequence_breakers", "grammar", "preserved_tokens"):
        assert key not in metrics
    assert set(metrics) < set(g)


# ------------------------------------------------------------------------------- native


NATIVE_FINAL_KEYS = {
    "index",
    "content",
    "tokens",
    "id_slot",
    "stop",
    "model",
    "tokens_predicted",
    "tokens_evaluated",
    "generation_settings",
    "prompt",
    "has_new_line",
    "truncated",
    "stop_type",
    "stopping_word",
    "tokens_cached",
    "timings",
}


def test_native_final() -> None:
    c = make_completion()
    out = formats_native.native_final(c, request(n_predict=4), model="m", prompt_text="<s> hi")
    assert set(out) == NATIVE_FINAL_KEYS
    assert out["content"] == "Hello\nworld" and out["stop"] is True
    assert out["tokens"] == []  # only with return_tokens
    assert (out["tokens_predicted"], out["tokens_evaluated"], out["tokens_cached"]) == (4, 8, 12)
    assert out["stop_type"] == "limit" and out["truncated"] is False
    assert type(out["has_new_line"]) is bool and out["has_new_line"] is True
    assert out["generation_settings"]["seed"] == 1234  # the seed actually used
    assert out["generation_settings"]["n_predict"] == 4
    assert set(out["timings"]) == TIMINGS_KEYS
    strict_json(out)


def test_native_final_tokens_probs_and_stream() -> None:
    c = make_completion(probs=PROBS)
    out = formats_native.native_final(
        c, request(n_probs=2), model="m", prompt_text="", return_tokens=True
    )
    assert out["tokens"] == [11, 12, 13, 14]
    assert len(out["completion_probabilities"]) == 2
    streamed = formats_native.native_final(
        c, request(n_probs=2, stream=True), model="m", prompt_text="", return_tokens=True
    )
    assert streamed["content"] == "" and streamed["tokens"] == []
    assert "completion_probabilities" not in streamed


@pytest.mark.parametrize(
    ("stop_type", "word"), [(StopType.EOS, ""), (StopType.WORD, "</s>"), (StopType.NONE, "")]
)
def test_native_stop_types(stop_type: StopType, word: str) -> None:
    c = make_completion(stop_type=stop_type, stopping_word=word)
    out = formats_native.native_final(c, request(), model="m", prompt_text="")
    assert out["stop_type"] == stop_type.value and out["stopping_word"] == word


def test_native_response_fields() -> None:
    # test_completion.py::test_completion_response_fields
    fields = ["content", "generation_settings/n_predict", "prompt"]
    out = formats_native.native_final(
        make_completion(),
        request(n_predict=32),
        model="m",
        prompt_text="<s> x",
        response_fields=fields,
    )
    assert out == {
        "content": "Hello\nworld",
        "generation_settings/n_predict": 32,
        "prompt": "<s> x",
    }


def test_native_chunks() -> None:
    out = formats_native.native_chunk(make_event())
    assert out == {
        "index": 0,
        "content": "He",
        "tokens": [11],
        "stop": False,
        "id_slot": 0,
        "tokens_predicted": 1,
        "tokens_evaluated": 8,
    }
    rich = formats_native.native_chunk(make_event(timings=TIMINGS, probs=PROBS[:1]))
    assert set(rich["timings"]) == TIMINGS_KEYS
    assert len(rich["completion_probabilities"]) == 1
    progress = PromptProgress(req_id=1, total=100, cache=20, processed=52, time_ms=3.7)
    p = formats_native.native_progress_chunk(progress, id_slot=2)
    assert p["prompt_progress"] == {"total": 100, "cache": 20, "processed": 52, "time_ms": 3}
    assert p["stop"] is False and p["content"] == "" and p["id_slot"] == 2


# ---------------------------------------------------------------------------------- OAI


def test_finish_reason() -> None:
    assert formats_oai.finish_reason(StopType.EOS) == "stop"
    assert formats_oai.finish_reason(StopType.WORD) == "stop"
    assert formats_oai.finish_reason(StopType.LIMIT) == "length"
    assert formats_oai.finish_reason(StopType.NONE) == "length"


def test_completion_id() -> None:
    a, b = formats_oai.new_completion_id(), formats_oai.new_completion_id()
    assert a.startswith("chatcmpl-") and len(a) == len("chatcmpl-") + 32 and a != b


def test_usage() -> None:
    usage = formats_oai.usage_json(make_completion())
    assert usage == {
        "completion_tokens": 4,
        "prompt_tokens": 8,
        "total_tokens": 12,
        "prompt_tokens_details": {"cached_tokens": 2},
    }


def test_oai_completion_final_parses_as_openai() -> None:
    c = make_completion(stop_type=StopType.EOS, probs=PROBS)
    out = formats_oai.completion_final(c, request(n_probs=2), META)
    parsed = oai.Completion.model_validate(strict_json(out))
    assert parsed.object == "text_completion" and parsed.id == META.id
    assert parsed.choices[0].text == "Hello\nworld" and parsed.choices[0].finish_reason == "stop"
    assert parsed.usage is not None and parsed.usage.prompt_tokens == 8
    assert parsed.usage.prompt_tokens_details is not None
    assert parsed.usage.prompt_tokens_details.cached_tokens == 2
    assert parsed.system_fingerprint == "b1-x"
    assert out["choices"][0]["logprobs"]["content"][0]["id"] == 11
    assert set(out["timings"]) == TIMINGS_KEYS
    assert (
        formats_oai.completion_final(make_completion(), request(), META)["choices"][0]["logprobs"]
        is None
    )


def test_oai_completion_stream_parses_as_openai() -> None:
    chunk = formats_oai.completion_chunk(make_event(timings=TIMINGS), META)
    assert chunk["choices"][0]["finish_reason"] is None
    parsed = oai.Completion.model_validate(unfinished(chunk))
    assert parsed.choices[0].text == "He"
    assert "usage" not in chunk and "timings" in chunk
    last = formats_oai.completion_final(make_completion(), request(stream=True), META)
    parsed_last = oai.Completion.model_validate(strict_json(last))
    assert parsed_last.choices[0].text == "" and parsed_last.choices[0].finish_reason == "length"
    progress = PromptProgress(req_id=1, total=10, cache=0, processed=5, time_ms=1.0)
    p = formats_oai.completion_progress_chunk(progress, META)
    oai.Completion.model_validate(unfinished(p))
    assert p["prompt_progress"]["processed"] == 5


def test_chat_final_parses_as_openai() -> None:
    c = make_completion(stop_type=StopType.WORD, stopping_word="</s>", probs=PROBS)
    out = formats_oai.chat_final(c, request(n_probs=2), META)
    parsed = ChatCompletion.model_validate(strict_json(out))
    assert parsed.object == "chat.completion" and parsed.id.startswith("chatcmpl")
    choice = parsed.choices[0]
    assert choice.message.role == "assistant" and choice.message.content == "Hello\nworld"
    assert choice.finish_reason == "stop"
    assert choice.logprobs is not None and choice.logprobs.content is not None
    for token in choice.logprobs.content:
        assert token.logprob <= 0.0 and token.bytes is not None and token.top_logprobs
    assert parsed.usage is not None and parsed.usage.completion_tokens == 4
    assert set(out["timings"]) == TIMINGS_KEYS
    assert (
        "logprobs" not in formats_oai.chat_final(make_completion(), request(), META)["choices"][0]
    )


def test_chat_stream_sequence() -> None:
    # test_chat_completion.py::test_chat_completion_stream: the first chunk carries the role
    # and a null content, later ones no role; the finish chunk has no content; then usage.
    events = [
        make_event(text="He", n_decoded=1),
        make_event(text="", tokens=(12,), n_decoded=2),  # held back: nothing to send
        make_event(text="llo", tokens=(13,), n_decoded=3, timings=TIMINGS),
    ]
    chunks: list[dict[str, Any]] = []
    for i, event in enumerate(events):
        chunks += formats_oai.chat_chunks(event, META, first=i == 0)
    c = make_completion(content="Hello", n_decoded=3)
    chunks += formats_oai.chat_final_chunks(c, META, include_usage=True)

    parsed = [ChatCompletionChunk.model_validate(strict_json(ch)) for ch in chunks]
    assert len(parsed) == 5
    assert parsed[0].choices[0].delta.role == "assistant"
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": None}
    assert all("role" not in ch["choices"][0]["delta"] for ch in chunks[1:4])
    content = "".join(ch.choices[0].delta.content or "" for ch in parsed if ch.choices)
    assert content == "Hello"
    finish = chunks[3]["choices"][0]
    assert finish["finish_reason"] == "length" and finish["delta"] == {}
    assert chunks[4]["choices"] == [] and chunks[4]["usage"]["completion_tokens"] == 3
    assert "timings" in chunks[2] and "timings" in chunks[4] and "timings" not in chunks[3]
    assert "timings" not in chunks[0]  # test_chat_completion_with_timings_per_token
    assert {ch.id for ch in parsed} == {META.id}
    assert all(ch["object"] == "chat.completion.chunk" for ch in chunks)


def test_chat_stream_without_usage_puts_timings_on_the_finish_chunk() -> None:
    chunks = formats_oai.chat_final_chunks(make_completion(), META, include_usage=False)
    assert len(chunks) == 1 and "usage" not in chunks[0] and "timings" in chunks[0]


def test_chat_chunk_logprobs_and_progress() -> None:
    chunks = formats_oai.chat_chunks(make_event(probs=PROBS[:1]), META, first=True)
    assert len(chunks) == 2 and "logprobs" in chunks[1]["choices"][0]
    parsed = ChatCompletionChunk.model_validate(strict_json(chunks[1]))
    assert parsed.choices[0].logprobs is not None
    progress = PromptProgress(req_id=1, total=10, cache=4, processed=4, time_ms=0.0)
    p = formats_oai.chat_progress_chunk(progress, META)
    ChatCompletionChunk.model_validate(strict_json(p))
    assert p["prompt_progress"] == {"total": 10, "cache": 4, "processed": 4, "time_ms": 0}
    assert p["choices"][0]["delta"]["role"] == "assistant"


def test_merge_choices() -> None:
    # test_chat_completion.py::test_chat_completions_multiple_choices
    a = formats_oai.chat_final(make_completion(), request(), META, index=0)
    b = formats_oai.chat_final(make_completion(n_decoded=2), request(), META, index=1)
    merged = formats_oai.merge_choices([a, b])
    parsed = ChatCompletion.model_validate(strict_json(merged))
    assert [ch.index for ch in parsed.choices] == [0, 1]
    assert merged["usage"]["completion_tokens"] == 6 and merged["usage"]["total_tokens"] == 14


def test_verbose_carries_the_native_final() -> None:
    native = formats_native.native_final(make_completion(), request(), model="m", prompt_text="p")
    out = formats_oai.chat_final(make_completion(), request(), META, verbose=native)
    assert out["__verbose"]["prompt"] == "p"


# ------------------------------------------------------------------------------- /slots


def test_idle_slot_has_no_params() -> None:
    # test_basic.py::test_server_slots: n_ctx, and no "params" before any task.
    out = formats_info.slots_json(
        [SlotView(id=0, n_ctx=256, speculative=False, is_processing=False)]
    )
    assert out == [{"id": 0, "n_ctx": 256, "speculative": False, "is_processing": False}]


def test_busy_slot() -> None:
    task = SlotTaskView(
        id_task=7,
        request=request(n_predict=16),
        n_prompt_tokens=30,
        n_prompt_tokens_processed=20,
        n_prompt_tokens_cache=10,
        has_next_token=True,
        has_new_line=False,
        n_remain=12,
        n_decoded=4,
        prompt="<s> hi",
        generated="abc",
    )
    slot = SlotView(id=1, n_ctx=256, speculative=True, is_processing=True, task=task)
    out = formats_info.slot_json(slot)
    assert out["id_task"] == 7 and out["n_prompt_tokens"] == 30
    assert out["n_prompt_tokens_processed"] == 20 and out["n_prompt_tokens_cache"] == 10
    assert out["params"]["n_predict"] == 16 and "stop" not in out["params"]
    assert out["next_token"] == [
        {"has_next_token": True, "has_new_line": False, "n_remain": 12, "n_decoded": 4}
    ]
    assert "prompt" not in out
    debug = formats_info.slot_json(slot, debug=True)
    assert debug["prompt"] == "<s> hi" and debug["generated"] == "abc"
    assert "stop" in debug["params"]
    strict_json(debug)


# ------------------------------------------------------------------------------- /props


def geometry(draft: bool) -> ContextGeometry:
    target = KvGeometry(1024, 256, 4, 512, 512, True, "f16", "f16")
    small = KvGeometry(1024, 256, 4, 512, 512, True, "q8_0", "q8_0")
    return ContextGeometry(target=target, draft=small if draft else None, generation=3)


def props_view(**overrides: Any) -> PropsView:
    fields: dict[str, Any] = {
        "default_sampling": SamplingParams(),
        "model_alias": "smollm2",
        "model_path": "/models/smollm2.gguf",
        "model_ftype": "Q8_0",
        "chat_template": "{{ x }}",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "build_info": "b1-x",
        "geometry": geometry(draft=False),
    }
    fields.update(overrides)
    return PropsView(**fields)


def test_props() -> None:
    # test_basic.py::test_server_props: model_path, total_slots, default n_ctx = n_ctx / slots,
    # params.seed; SPEC §8: slot_page_version and context_geometry.
    out = formats_info.props_json(props_view())
    assert ".gguf" in out["model_path"] and out["total_slots"] == 4
    default = out["default_generation_settings"]
    assert default["n_ctx"] == 256
    assert default["params"]["seed"] == LLAMA_DEFAULT_SEED
    assert default["params"]["n_predict"] == -1 and default["params"]["stream"] is False
    for key in (
        "model_alias",
        "modalities",
        "endpoint_slots",
        "endpoint_props",
        "endpoint_metrics",
        "chat_template",
        "bos_token",
        "eos_token",
        "build_info",
        "is_sleeping",
    ):
        assert key in out
    assert out["slot_page_version"] == 1
    assert out["context_geometry"] == {
        "n_ctx": 1024,
        "n_ctx_slot": 256,
        "n_parallel": 4,
        "n_batch": 512,
        "n_ubatch": 512,
        "kv_unified": True,
        "cache_type_k": "f16",
        "cache_type_v": "f16",
        "draft": None,
        "generation": 3,
    }
    assert "chat_template_tool_use" not in out
    strict_json(out)


def test_props_with_draft_and_tool_template() -> None:
    out = formats_info.props_json(
        props_view(geometry=geometry(draft=True), chat_template_tool_use="{{ tools }}")
    )
    draft = out["context_geometry"]["draft"]
    assert draft["cache_type_k"] == "q8_0" and set(draft) == {
        "n_ctx",
        "n_ctx_slot",
        "n_parallel",
        "n_batch",
        "n_ubatch",
        "kv_unified",
        "cache_type_k",
        "cache_type_v",
    }
    assert out["chat_template_tool_use"] == "{{ tools }}"


# ------------------------------------------------------------------------------ models


def test_models() -> None:
    # test_basic.py::test_server_models: one entry in data, id = the alias.
    model = ModelView(
        name="smollm2",
        n_vocab=49152,
        n_ctx_slot=256,
        n_ctx_train=8192,
        n_embd=576,
        n_params=134515008,
        size=144000000,
        vocab_type=2,
        ftype="Q8_0",
        aliases=("smollm2",),
    )
    out = formats_info.models_json(model, created=1700000000)
    assert out["object"] == "list" and len(out["data"]) == 1
    parsed = oai.Model.model_validate(strict_json(out["data"][0]))
    assert parsed.id == "smollm2" and parsed.owned_by == "llamacpp"
    assert out["data"][0]["meta"]["n_ctx"] == 256
    assert out["models"][0]["name"] == "smollm2"


def test_a_slot_names_the_callers_own_mind_only_when_it_holds_one() -> None:
    own = SlotView(id=0, n_ctx=256, speculative=False, is_processing=False, mind="zed")
    assert formats_info.slots_json([own])[0]["mind"] == "zed"
