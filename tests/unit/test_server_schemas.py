"""Request bodies (schemas.py) and their mapping onto engine parameters (params.py).

What is asserted comes from llama-server's `server-schema.cpp`, `server-common.cpp` and its
tests under tools/server/tests/unit (test_completion.py, test_chat_completion.py,
test_tokenize.py), with SPEC §0 where kvswap does better (a wrong type is a 400).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pytest

from kvswap.config.settings import SamplingDefaults
from kvswap.core.errors import ErrorKind, KvswapError
from kvswap.core.sampling import DEFAULT_SAMPLERS, LLAMA_DEFAULT_SEED
from kvswap.server.requests import params
from kvswap.server.requests.chat import chat_messages
from kvswap.server.requests.params import PromptPart
from kvswap.server.requests.schemas import (
    ApplyTemplateRequest,
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    OaiCompletionRequest,
    SlotFileRequest,
    TokenizeRequest,
    parse_body,
)

pytestmark = pytest.mark.timeout(30)


@dataclass(frozen=True)
class Defaults:
    """A stand-in for config.settings.SamplingDefaults (the brief's field names only)."""

    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    typical_p: float = 1.0
    repeat_last_n: int = 64
    repeat_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    dry_multiplier: float = 0.0
    dry_base: float = 1.75
    dry_allowed_length: int = 2
    dry_penalty_last_n: int = 64
    xtc_probability: float = 0.0
    xtc_threshold: float = 0.1
    top_n_sigma: float = -1.0
    mirostat: int = 0
    mirostat_tau: float = 5.0
    mirostat_eta: float = 0.1
    seed: int = -1
    n_predict: int = -1
    n_probs: int = 0
    ignore_eos: bool = False
    samplers: tuple[str, ...] = DEFAULT_SAMPLERS


D = Defaults()
CHAT = [{"role": "user", "content": "hi"}]


def completion(**fields: Any) -> CompletionRequest:
    return parse_body(CompletionRequest, {"prompt": "x", **fields})


def chat(**fields: Any) -> ChatCompletionRequest:
    return parse_body(ChatCompletionRequest, {"messages": CHAT, **fields})


def invalid(model: type, body: Any) -> KvswapError:
    with pytest.raises(KvswapError) as info:
        parse_body(model, body)
    assert info.value.kind is ErrorKind.INVALID_REQUEST
    assert info.value.kind.code == 400
    return info.value


def fake_tokenize(text: str, add_special: bool) -> list[int]:
    """One token per character (its code point), BOS = 1."""
    return ([1] if add_special else []) + [ord(c) for c in text]


# ------------------------------------------------------------------------------- schemas


def test_minimal_bodies_parse() -> None:
    assert completion().prompt == "x"
    assert parse_body(OaiCompletionRequest, {"prompt": "x"}).prompt == "x"
    assert chat().messages[0].content == "hi"
    assert parse_body(ApplyTemplateRequest, {"messages": CHAT}).messages[0].role == "user"
    assert parse_body(TokenizeRequest, {}).content is None
    assert parse_body(DetokenizeRequest, {}).tokens == []
    assert parse_body(SlotFileRequest, {"filename": "a.bin"}).filename == "a.bin"


def test_raw_json_bytes_parse() -> None:
    body = parse_body(CompletionRequest, b'{"prompt": "x", "n_predict": 8}')
    assert body.n_predict == 8


@pytest.mark.parametrize(
    "raw",
    [b"{not json", b'{"prompt": "\xff"}', b"\xff\xfe", b"[1, 2]", b'"prompt"', b""],
)
def test_malformed_json_utf8_or_non_object_is_400(raw: bytes) -> None:
    # SPEC §0: the pinned llama-server answers these with a 500.
    invalid(CompletionRequest, raw)


@pytest.mark.parametrize(
    "fields",
    [
        {"n_predict": "5"},
        {"n_predict": True},
        {"n_predict": 1.5},
        {"max_tokens": "8"},
        {"temperature": "hot"},
        {"temperature": True},
        {"stream": "yes"},
        {"stream": 1},
        {"cache_prompt": 0},
        {"stop": 5},
        {"stop": ["a", 1]},
        {"samplers": 5},
        {"samplers": ["top_k", 2]},
        {"seed": "1"},
        {"seed": 1.5},
        {"n_probs": "3"},
        {"id_slot": "0"},
        {"logit_bias": 5},
        {"logit_bias": [[1, True]]},
        {"logit_bias": [[1, "x"]]},
        {"logit_bias": [[1]]},
        {"logit_bias": [[1, 2, 3]]},
        {"logit_bias": [[1.5, 2]]},
        {"logit_bias": [5]},
        {"logit_bias": {"1": "x"}},
        {"logit_bias": {"1": True}},
        {"dry_sequence_breakers": []},
        {"dry_sequence_breakers": "x"},
        {"response_fields": "content"},
        {"stream_options": "yes"},
        {"stream_options": {"include_usage": "yes"}},
        {"lora": [{"id": 0}]},
        {"prompt": True},
        {"prompt": [True]},
        {"prompt": [1.5]},
        {"prompt": [-1]},
        {"prompt": [[1, [2]]]},
        {"prompt": None},
        {"prompt": {"multimodal_data": []}},
    ],
)
def test_wrong_types_are_400(fields: dict[str, Any]) -> None:
    err = invalid(CompletionRequest, {"prompt": "x", **fields})
    assert next(iter(fields)) in err.message or "logit_bias" in err.message


def test_error_message_names_the_field() -> None:
    err = invalid(CompletionRequest, {"prompt": "x", "n_predict": "5"})
    assert err.message.startswith("Field 'n_predict'")


@pytest.mark.parametrize(
    "fields",
    [
        {"n_predict": -2},  # SPEC: a negative n_predict other than -1
        {"max_tokens": -5},
        {"n_predict": 2**31},
        {"id_slot": -2},
        {"n_keep": -2},
        {"n": 0},
        {"n_cmpl": 0},
        {"min_keep": -1},
        {"dry_allowed_length": -1},
        {"repeat_last_n": -2},
        {"dry_penalty_last_n": -2},
        {"adaptive_decay": 1.0},
        {"t_max_predict_ms": -2},
        {"sse_ping_interval": -2},
    ],
)
def test_hard_limits_are_400(fields: dict[str, Any]) -> None:
    invalid(CompletionRequest, {"prompt": "x", **fields})


def test_non_finite_numbers_are_400() -> None:
    invalid(CompletionRequest, b'{"prompt": "x", "temperature": NaN}')
    invalid(CompletionRequest, b'{"prompt": "x", "top_p": Infinity}')


def test_unknown_fields_are_ignored_and_null_is_absent() -> None:
    body = parse_body(
        OaiCompletionRequest,
        {
            "prompt": "x",
            "user": "u",
            "metadata": {"a": 1},
            "stream_options": {"include_usage": True, "other": 1},
            "frobnicate": [1, 2],
            "temperature": None,
            "n_predict": None,
        },
    )
    assert body.temperature is None and body.n_predict is None
    assert body.stream_options is not None and body.stream_options.include_usage is True


def test_integral_floats_are_integers() -> None:
    body = completion(n_predict=8.0, prompt=[1.0, 2.0], top_k=3.0)
    assert body.n_predict == 8 and isinstance(body.n_predict, int)
    assert body.prompt == [1, 2]


def test_negative_one_is_accepted_where_it_means_unlimited() -> None:
    body = completion(n_predict=-1, n_keep=-1, id_slot=-1, repeat_last_n=-1, dry_penalty_last_n=-1)
    assert body.n_predict == -1


def test_oai_completion_refuses_echo_best_of_and_suffix() -> None:
    for fields in ({"echo": True}, {"best_of": 2}, {"suffix": "tail"}):
        invalid(OaiCompletionRequest, {"prompt": "x", **fields})
    body = parse_body(OaiCompletionRequest, {"prompt": "x", "echo": False, "best_of": 1})
    assert body.best_of == 1


@pytest.mark.parametrize(
    "messages",
    [
        None,
        "string",
        [123],
        [{}],
        [{"role": 123}],
        [{"role": "system", "content": 123}],
        [{"role": "system", "content": "test"}, {}],
        [{"content": "no role"}],
        [{"role": "user"}],
        [{"role": "assistant"}],
        [{"role": "user", "content": [{"type": "text"}]}],
        [{"role": "user", "content": [{"type": "media_marker", "text": "x"}]}],
        [{"role": "user", "content": [{"text": "no type"}]}],
        [{"role": "assistant", "tool_calls": [{"type": "code", "function": {"name": "f"}}]}],
    ],
)
def test_invalid_chat_messages_are_400(messages: Any) -> None:
    # test_chat_completion.py::test_invalid_chat_completion_req, plus the key-presence rules.
    invalid(ChatCompletionRequest, {"messages": messages})


def test_chat_message_forms() -> None:
    body = chat(
        messages=[
            {"role": "system", "content": None},
            {"role": "user", "content": [{"type": "text", "text": "a"}]},
            {
                "role": "assistant",
                "tool_calls": [
                    {"type": "function", "function": {"name": "f", "arguments": {"x": 1}}}
                ],
            },
            {"role": "tool", "content": "42", "tool_call_id": "c1"},
        ]
    )
    out = chat_messages(body)
    assert out[0] == {"role": "system", "content": ""}
    assert out[1]["content"] == [{"type": "text", "text": "a"}]
    assert out[2]["tool_calls"][0]["function"] == {"name": "f", "arguments": '{"x":1}'}
    assert out[3]["tool_call_id"] == "c1"


def test_chat_media_parts_are_501() -> None:
    body = chat(
        messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]
    )
    with pytest.raises(KvswapError) as info:
        chat_messages(body)
    assert info.value.kind is ErrorKind.NOT_SUPPORTED


@pytest.mark.parametrize(
    "fields",
    [
        {"top_logprobs": 3},  # without logprobs
        {"logprobs": False, "top_logprobs": 3},
        {"logprobs": 5},  # chat's logprobs is a boolean
        {"json_schema": {"type": "object"}, "grammar": "root ::= x"},
        {"response_format": {"type": "sound"}},
        {"response_format": {"type": "json_object", "schema": 123}},
        {"response_format": "json"},
        {"add_generation_prompt": True, "continue_final_message": True},
        {"continue_final_message": "everything"},
        {"logprobs": True, "tools": [{"type": "function"}], "stream": True},
        {"chat_template_kwargs": "x"},
        {"tools": {"type": "function"}},
    ],
)
def test_invalid_chat_fields_are_400(fields: dict[str, Any]) -> None:
    invalid(ChatCompletionRequest, {"messages": CHAT, **fields})


def test_chat_accepts_openai_fields() -> None:
    body = chat(
        model="gpt",
        max_completion_tokens=5,
        stream=True,
        stream_options={"include_usage": True},
        tools=[{"type": "function", "function": {"name": "f"}}],
        tool_choice={"type": "function", "function": {"name": "f"}},
        response_format={"type": "json_schema", "json_schema": {"schema": {"type": "object"}}},
        chat_template_kwargs={"enable_thinking": False},
        seed=3,
        user="me",
        n=1,
    )
    assert body.response_format is not None and body.response_format.json_schema is not None


def test_tokenize_and_detokenize_bodies() -> None:
    body = parse_body(TokenizeRequest, {"content": [1, "a"], "with_pieces": True})
    assert body.content == [1, "a"] and body.add_special is False and body.parse_special is True
    invalid(TokenizeRequest, {"content": 5})
    invalid(DetokenizeRequest, {"tokens": [-1]})
    invalid(DetokenizeRequest, {"tokens": "1 2"})
    invalid(SlotFileRequest, {})
    invalid(SlotFileRequest, {"filename": 5})


# ------------------------------------------------------------------------------ sampling


def test_defaults_fill_absent_fields() -> None:
    s = params.build_sampling(completion(), D)
    assert (s.temperature, s.top_k, s.top_p, s.min_p) == (0.8, 40, 0.95, 0.05)
    assert s.seed == LLAMA_DEFAULT_SEED  # the flag's -1 is libllama's random seed
    assert s.samplers == DEFAULT_SAMPLERS
    assert s.dry_sequence_breakers == ("\n", ":", '"', "*")  # SamplingParams's, absent in D
    assert s.logit_bias == ()


def test_real_sampling_defaults_satisfy_the_protocol() -> None:
    defaults = SamplingDefaults()
    s = params.build_sampling(completion(), defaults)
    assert s.seed == LLAMA_DEFAULT_SEED
    assert s.temperature == defaults.temperature


def test_request_fields_override_defaults() -> None:
    s = params.build_sampling(
        completion(
            temperature=0.0,
            top_k=5,
            repeat_penalty=1.1,
            dry_multiplier=0.8,
            dry_sequence_breakers=["\n"],
            mirostat=2,
            seed=42,
            ignore_eos=True,
            min_keep=3,
            repeat_last_n=-1,
        ),
        D,
    )
    assert (s.temperature, s.top_k, s.repeat_penalty, s.dry_multiplier) == (0.0, 5, 1.1, 0.8)
    assert s.dry_sequence_breakers == ("\n",)
    assert (s.mirostat, s.seed, s.ignore_eos, s.min_keep) == (2, 42, True, 3)
    assert s.repeat_last_n == -1  # the engine reads -1 as the whole window


def test_soft_limits_clamp_as_llama_server() -> None:
    s = params.build_sampling(
        completion(
            top_k=-1,
            top_p=1.5,
            min_p=-0.5,
            temperature=-1.0,
            xtc_probability=2.0,
            xtc_threshold=-1.0,
            mirostat=7,
            dry_base=0.5,
            adaptive_target=3.0,
        ),
        D,
    )
    assert (s.top_k, s.top_p, s.min_p, s.temperature) == (0, 1.0, 0.0, 0.0)
    assert (s.xtc_probability, s.xtc_threshold, s.mirostat) == (1.0, 0.0, 2)
    assert s.dry_base == D.dry_base  # < 1.0 is replaced by the server's value
    assert s.adaptive_target == 1.0


@pytest.mark.parametrize(
    ("seed", "expected"),
    [(-1, LLAMA_DEFAULT_SEED), (0, 0), (7, 7), (2**32 + 5, 5), (-2, 0xFFFFFFFE)],
)
def test_seed_wraps_into_uint32(seed: int, expected: int) -> None:
    assert params.build_sampling(completion(seed=seed), D).seed == expected


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ([[15, 1.0]], ((15, 1.0),)),
        ([[15, -2]], ((15, -2.0),)),
        ([[15, False]], ((15, -math.inf),)),
        ({"15": 2.5}, ((15, 2.5),)),
        ({"15": False}, ((15, -math.inf),)),
        ([["ab", -100]], ((97, -100.0), (98, -100.0))),  # text: all its tokens
        ({"hi": -1}, ((104, -1.0), (105, -1.0))),
        ([[15, 1.0], [99999, 1.0], [-3, 1.0]], ((15, 1.0),)),  # out of vocab: dropped
    ],
)
def test_logit_bias_forms(raw: Any, expected: tuple[tuple[int, float], ...]) -> None:
    s = params.build_sampling(completion(logit_bias=raw), D, tokenize=fake_tokenize, n_vocab=1000)
    assert s.logit_bias == expected


def test_logit_bias_size_is_bounded() -> None:
    with pytest.raises(KvswapError) as info:
        params.build_sampling(
            completion(logit_bias=[[i, 1.0] for i in range(11)]), D, max_logit_bias=10
        )
    assert info.value.kind is ErrorKind.INVALID_REQUEST


def test_logit_bias_from_defaults_is_replaced_by_the_request() -> None:
    @dataclass(frozen=True)
    class WithBias(Defaults):
        logit_bias: tuple[tuple[int, float], ...] = ((3, -1.0),)

    assert params.build_sampling(completion(), WithBias()).logit_bias == ((3, -1.0),)
    s = params.build_sampling(completion(logit_bias=[[4, 1]]), WithBias())
    assert s.logit_bias == ((4, 1.0),)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (["top_k", "temperature"], ("top_k", "temperature")),
        (
            ["top-k", "TopK", "nucleus", "temp", "typ", "minp", "typical_p"],
            ("top_k", "top_k", "top_p", "temperature", "typ_p", "min_p", "typ_p"),
        ),
        (
            ["penalties", "dry", "top_n_sigma", "xtc", "adaptive_p"],
            ("penalties", "dry", "top_n_sigma", "xtc", "adaptive_p"),
        ),
        ("edkt", ("penalties", "dry", "top_k", "temperature")),
        ([], ()),
        ("", ()),
    ],
)
def test_samplers_forms(raw: list[str] | str, expected: tuple[str, ...]) -> None:
    assert params.build_sampling(completion(samplers=raw), D).samplers == expected


@pytest.mark.parametrize("raw", [["top_k", "bogus"], "kz", ["infill"]])
def test_unknown_samplers_are_400(raw: list[str] | str) -> None:
    with pytest.raises(KvswapError) as info:
        params.build_sampling(completion(samplers=raw), D)
    assert info.value.kind is ErrorKind.INVALID_REQUEST


# ---------------------------------------------------------------------------- generation


def gen(body: Any, **kwargs: Any) -> Any:
    args: dict[str, Any] = {
        "prompt_tokens": [1, 2, 3],
        "n_ctx_slot": 64,
        "max_n_predict": None,
    }
    args.update(kwargs)
    return params.build_generation(body, D, **args)


def test_generation_defaults() -> None:
    g = gen(completion())
    assert g.prompt_tokens == (1, 2, 3)
    assert (g.n_predict, g.stop, g.id_slot, g.cache_prompt, g.n_probs) == (-1, (), -1, True, 0)
    assert (g.stream, g.timings_per_token, g.return_progress, g.post_sampling_probs) == (
        False,
        False,
        False,
        False,
    )
    assert g.t_max_predict_ms == 0


def test_generation_fields() -> None:
    g = gen(
        completion(
            n_predict=7,
            stop=["</s>", ""],
            id_slot=1,
            cache_prompt=False,
            stream=True,
            timings_per_token=True,
            return_progress=True,
            post_sampling_probs=True,
            n_probs=4,
            t_max_predict_ms=500,
        ),
        n_parallel=2,
    )
    assert (g.n_predict, g.stop, g.id_slot, g.cache_prompt) == (7, ("</s>",), 1, False)
    assert (g.stream, g.timings_per_token, g.return_progress, g.post_sampling_probs) == (
        True,
        True,
        True,
        True,
    )
    assert (g.n_probs, g.t_max_predict_ms) == (4, 500)
    assert gen(completion(stop="END")).stop == ("END",)
    assert gen(completion(t_max_predict_ms=-1)).t_max_predict_ms == 0


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({}, -1),
        ({"max_tokens": 5}, 5),
        ({"max_completion_tokens": 6, "max_tokens": 5}, 6),
        ({"n_predict": 7, "max_completion_tokens": 6, "max_tokens": 5}, 7),
        ({"n_predict": None, "max_tokens": 5}, 5),
        ({"n_predict": 0}, 0),
    ],
)
def test_n_predict_aliases(fields: dict[str, Any], expected: int) -> None:
    assert gen(chat(**fields)).n_predict == expected


def test_n_predict_default_comes_from_the_server() -> None:
    g = params.build_generation(
        completion(), Defaults(n_predict=32), prompt_tokens=[1], n_ctx_slot=8, max_n_predict=None
    )
    assert g.n_predict == 32


def test_max_n_predict_bounds_requests() -> None:
    assert gen(completion(n_predict=10), max_n_predict=10).n_predict == 10
    assert gen(completion(), max_n_predict=10).n_predict == 10  # unlimited is capped
    with pytest.raises(KvswapError) as info:
        gen(completion(max_tokens=11), max_n_predict=10)
    assert info.value.kind is ErrorKind.INVALID_REQUEST and "max_tokens" in info.value.message


def test_prompt_at_the_window_is_exceed_context_size_error() -> None:
    # test_chat_completion.py: type exceed_context_size_error, n_prompt_tokens, n_ctx.
    with pytest.raises(KvswapError) as info:
        gen(completion(), prompt_tokens=list(range(8)), n_ctx_slot=8)
    err = info.value
    assert err.kind is ErrorKind.EXCEED_CONTEXT and err.kind.code == 400
    assert err.extra == {"n_prompt_tokens": 8, "n_ctx": 8}
    assert "exceeds the available context size" in err.message
    assert gen(completion(), prompt_tokens=list(range(7)), n_ctx_slot=8).prompt_tokens


def test_generation_refuses_what_would_harm_the_server() -> None:
    cases: Sequence[tuple[Any, dict[str, Any]]] = [
        (completion(), {"prompt_tokens": []}),
        (completion(), {"prompt_tokens": [1, 5000], "n_vocab": 100}),
        (completion(id_slot=2), {"n_parallel": 2}),  # SPEC: out of range is a 400
        (completion(n=3), {"n_parallel": 2}),
        (completion(n_probs=101), {}),
        (chat(logprobs=True, top_logprobs=500), {}),
    ]
    for body, kwargs in cases:
        with pytest.raises(KvswapError) as info:
            gen(body, **kwargs)
        assert info.value.kind is ErrorKind.INVALID_REQUEST


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (completion(n_probs=3), 3),
        (completion(logprobs=2), 2),  # alias, when n_probs is absent
        (completion(n_probs=3, logprobs=2), 3),
        (completion(n_probs=-4), 0),
        (parse_body(OaiCompletionRequest, {"prompt": "x", "logprobs": 5}), 5),
        (chat(logprobs=True), 20),  # llama-server's default top_logprobs
        (chat(logprobs=True, top_logprobs=2, n_probs=9), 2),
        (chat(logprobs=False, n_probs=9), 9),
        (chat(), 0),
    ],
)
def test_n_probs_sources(body: Any, expected: int) -> None:
    assert gen(body).n_probs == expected


def test_n_cmpl() -> None:
    assert params.resolve_n_cmpl(completion(), n_parallel=4) == 1
    assert params.resolve_n_cmpl(completion(n=3), n_parallel=4) == 3
    assert params.resolve_n_cmpl(completion(n_cmpl=2, n=3), n_parallel=4) == 2


# ------------------------------------------------------------------------------- prompts


@pytest.mark.parametrize(
    ("prompt", "expected"),
    [
        ("abc", [("abc",)]),
        ([1, 2, 3], [(1, 2, 3)]),
        ([1, "a", 2], [(1, "a", 2)]),  # one mixed prompt
        (["a", 1], [("a", 1)]),
        (["a", "b"], [("a",), ("b",)]),  # a batch of two
        ([[1, 2], [3]], [(1, 2), (3,)]),
        ([[1, "a"], "b", {"prompt_string": "c"}], [(1, "a"), ("b",), ("c",)]),
        ({"prompt_string": [5, "x"]}, [(5, "x")]),
    ],
)
def test_prompt_forms(prompt: Any, expected: list[tuple[int | str, ...]]) -> None:
    body = completion(prompt=prompt)
    assert params.parse_prompt(body.prompt) == [PromptPart(p) for p in expected]


def test_prompt_errors() -> None:
    with pytest.raises(KvswapError) as info:
        params.parse_prompt(completion(prompt=[]).prompt)
    assert info.value.kind is ErrorKind.INVALID_REQUEST
    with pytest.raises(KvswapError) as info:
        params.parse_prompt(completion(prompt=[1, [2]]).prompt)  # ids with a nested list
    assert info.value.kind is ErrorKind.INVALID_REQUEST
    with pytest.raises(KvswapError) as info:
        params.parse_prompt(completion(prompt=["a", "b", "c"]).prompt, max_prompts=2)
    assert info.value.kind is ErrorKind.INVALID_REQUEST
    mm = completion(prompt={"prompt_string": "x", "multimodal_data": ["AAAA"]})
    with pytest.raises(KvswapError) as info:
        params.parse_prompt(mm.prompt)
    assert info.value.kind is ErrorKind.NOT_SUPPORTED


def test_tokenize_prompt_adds_special_only_to_a_leading_text() -> None:
    # tokenize_mixed: BOS only when the first element is a string.
    assert params.tokenize_prompt(PromptPart(("ab", 7, "c")), fake_tokenize, add_special=True) == [
        1,
        97,
        98,
        7,
        99,
    ]
    assert params.tokenize_prompt(PromptPart((7, "c")), fake_tokenize, add_special=True) == [7, 99]
    assert params.tokenize_prompt(PromptPart(("a",)), fake_tokenize, add_special=False) == [97]
    assert params.content_part([1, "a"]) == PromptPart((1, "a"))
    assert params.content_part("a") == PromptPart(("a",))


def test_check_token_ids() -> None:
    params.check_token_ids([0, 99], 100)
    with pytest.raises(KvswapError):
        params.check_token_ids([100], 100)


def test_an_openai_chat_with_no_messages_is_a_400_but_the_shared_body_accepts_it() -> None:
    """OpenAI answers an empty conversation with a 400 (the newcomer note, finding 18); the
    Anthropic route, which builds the same body, accepts it as llama-server does."""
    from kvswap.core.errors import ErrorKind, KvswapError
    from kvswap.server.openai.routes_chat import _chat_body

    with pytest.raises(KvswapError) as err:
        _chat_body(b'{"messages": []}')
    assert err.value.kind is ErrorKind.INVALID_REQUEST and "messages" in err.value.message
    assert parse_body(ChatCompletionRequest, b'{"messages": []}').messages == []
