"""Generation through the real HTTP server: shapes, streaming, prefix reuse, OpenAI clients."""

from __future__ import annotations

import openai
import pytest

from tests.server.agent_util import from_scratch
from tests.server.harness import ServerProcess, chat_prompt

pytestmark = pytest.mark.model

CAPITAL = chat_prompt(("user", "What is the capital of France?"))


def test_completion_shape_and_greedy_determinism(small_server: ServerProcess) -> None:
    body = {"prompt": CAPITAL, "n_predict": 16, "temperature": 0}
    a = small_server.post("/completion", body | {"cache_prompt": False}).json()
    b = small_server.post("/completion", body).json()
    assert a["content"] == b["content"] and "Paris" in a["content"]
    assert a["stop"] is True and a["stop_type"] in ("eos", "limit")
    assert set(a["timings"]) >= {"cache_n", "prompt_n", "prompt_ms", "predicted_n", "predicted_ms"}
    assert a["tokens_predicted"] == a["timings"]["predicted_n"]
    # The second run reuses the whole prompt but the last token.
    assert b["timings"]["prompt_n"] == 1


def test_streamed_deltas_concatenate_to_the_non_streamed_content(
    small_server: ServerProcess,
) -> None:
    body = {
        "prompt": chat_prompt(("user", "Write a haiku about rain.")),
        "n_predict": 40,
        "temperature": 0,
    }
    whole = small_server.post("/completion", body).json()
    chunks = list(small_server.stream("/completion", {**body, "stream": True}))
    assert chunks[-1]["stop"] is True and chunks[-1]["stop_type"] == whole["stop_type"]
    assert "".join(c["content"] for c in chunks) == whole["content"]


def test_progress_events_on_request(small_server: ServerProcess) -> None:
    long_prompt = chat_prompt(("user", " ".join(f"word{i}" for i in range(150))))
    chunks = list(
        small_server.stream(
            "/completion",
            {
                "prompt": long_prompt,
                "n_predict": 2,
                "stream": True,
                "return_progress": True,
                "cache_prompt": False,
            },
        )
    )
    progress = [c["prompt_progress"] for c in chunks if "prompt_progress" in c]
    assert len(progress) >= 2  # -ub 128: several chunks
    assert progress[-1]["processed"] == progress[-1]["total"]
    assert [p["processed"] for p in progress] == sorted(p["processed"] for p in progress)


def test_a_follow_up_prefills_only_its_new_tokens(small_server: ServerProcess) -> None:
    first_prompt = chat_prompt(("user", "Name a fruit."))
    first = small_server.post(
        "/completion", {"prompt": first_prompt, "n_predict": 10, "temperature": 0, "id_slot": 2}
    ).json()
    follow = (
        first_prompt
        + first["content"]
        + "<|im_end|>\n<|im_start|>user\nAnd a vegetable?<|im_end|>\n<|im_start|>assistant\n"
    )
    n_follow = len(
        small_server.post("/tokenize", {"content": follow, "add_special": True}).json()["tokens"]
    )
    n_shared = first["tokens_evaluated"] + first["tokens_predicted"]
    second = small_server.post(
        "/completion", {"prompt": follow, "n_predict": 4, "temperature": 0}
    ).json()
    assert second["id_slot"] == 2  # chosen by prefix similarity
    t = second["timings"]
    assert t["cache_n"] >= n_shared - 1 - 1
    assert t["prompt_n"] <= n_follow - n_shared + 1 + 1
    assert t["cache_n"] + t["prompt_n"] == n_follow


def test_three_turn_chat_reuses_the_cache_turn_after_turn(small_server: ServerProcess) -> None:
    messages = [{"role": "user", "content": "Hello, who are you?"}]
    previous_total = 0
    for turn, question in enumerate(["Tell me a colour.", "And a number?", "Thanks!"]):
        resp = small_server.post(
            "/v1/chat/completions",
            {"messages": messages, "max_tokens": 12, "temperature": 0, "id_slot": 3},
        ).json()
        usage = resp["usage"]
        timings = resp["timings"]
        if turn > 0:
            # Everything up to the previous answer is cached (the last generated token aside).
            assert timings["cache_n"] >= previous_total - 2, (turn, timings, previous_total)
            assert usage["prompt_tokens_details"]["cached_tokens"] == timings["cache_n"]
        previous_total = usage["prompt_tokens"] + usage["completion_tokens"]
        messages += [
            {"role": "assistant", "content": resp["choices"][0]["message"]["content"]},
            {"role": "user", "content": question},
        ]


def test_openai_client_chat_completion_and_streaming(small_server: ServerProcess) -> None:
    client = openai.OpenAI(base_url=small_server.url + "/v1", api_key="unused")
    # Each answer is compared with the same answer streamed: both from scratch (same batches).
    chat = client.chat.completions.create(
        model="anything",
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        max_tokens=12,
        temperature=0,
        extra_body=from_scratch(small_server),
    )
    text = chat.choices[0].message.content
    assert text and chat.choices[0].finish_reason in ("stop", "length")
    assert chat.usage is not None and chat.usage.completion_tokens > 0
    stream = client.chat.completions.create(
        model="anything",
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        max_tokens=12,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body=from_scratch(small_server),
    )
    chunks = list(stream)
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == text
    assert (
        chunks[-1].usage is not None
        and chunks[-1].usage.completion_tokens == chat.usage.completion_tokens
    )
    completion = client.completions.create(
        model="anything",
        prompt=CAPITAL,
        max_tokens=12,
        temperature=0,
        extra_body=from_scratch(small_server),
    )
    assert "Paris" in completion.choices[0].text
    streamed_completion = "".join(
        c.choices[0].text
        for c in client.completions.create(
            model="x",
            prompt=CAPITAL,
            max_tokens=12,
            temperature=0,
            stream=True,
            extra_body=from_scratch(small_server),
        )
    )
    assert streamed_completion == completion.choices[0].text
    models = client.models.list()
    assert len(models.data) == 1


def test_several_prompts_answer_in_order(small_server: ServerProcess) -> None:
    prompts = [chat_prompt(("user", f"What is the capital of {c}?")) for c in ("France", "Japan")]
    results = small_server.post(
        "/completion", {"prompt": prompts, "n_predict": 10, "temperature": 0}
    ).json()
    assert isinstance(results, list) and [r["index"] for r in results] == [0, 1]
    assert "Paris" in results[0]["content"] and "Tokyo" in results[1]["content"]
