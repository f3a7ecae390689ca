"""Token probabilities: at temperature 0 the chosen token is the most likely one (OpenAI
`logprobs`, llama-server `n_probs`), `post_sampling_probs` reports the chain's own
distribution, and `stream_options.include_usage` ends a stream with a usage chunk."""

from __future__ import annotations

import math

import pytest

from tests.server.agent_util import from_scratch, oai
from tests.server.harness import ServerProcess, chat_prompt

pytestmark = [pytest.mark.model, pytest.mark.timeout(300)]

PROMPTS = ["Name three colors.", "What is 2 + 2?", "Write a short greeting in French."]


@pytest.mark.parametrize("prompt", PROMPTS)
def test_chat_logprobs_top_is_the_greedy_choice(agent_server: ServerProcess, prompt: str) -> None:
    client = oai(agent_server)
    args = {
        "model": "m",
        "messages": [{"role": "user", "content": prompt}],
        "temperature": 0,
        "max_tokens": 24,
        "logprobs": True,
        "top_logprobs": 4,
    }
    # The answer and the same answer streamed are compared token for token: both from scratch.
    out = client.chat.completions.create(**args, extra_body=from_scratch(agent_server))  # type: ignore[call-overload]
    content = out.choices[0].logprobs.content
    assert len(content) == out.usage.completion_tokens
    for tok in content:
        tops = tok.top_logprobs
        assert len(tops) == 4
        assert [t.logprob for t in tops] == sorted((t.logprob for t in tops), reverse=True)
        assert tops[0].token == tok.token and tops[0].logprob == pytest.approx(tok.logprob)
        assert tok.logprob <= 0.0 and tok.bytes == list(tok.token.encode())
    assert "".join(t.token for t in content) == out.choices[0].message.content
    streamed = [
        t
        for chunk in client.chat.completions.create(
            **args, stream=True, extra_body=from_scratch(agent_server)
        )  # type: ignore[call-overload]
        if chunk.choices and chunk.choices[0].logprobs
        for t in chunk.choices[0].logprobs.content
    ]
    assert [t.token for t in streamed] == [t.token for t in content]


def test_n_probs_top_is_the_greedy_choice(agent_server: ServerProcess) -> None:
    body = {
        "prompt": chat_prompt(("user", PROMPTS[0])),
        "n_predict": 16,
        "temperature": 0,
        "n_probs": 3,
    }
    out = agent_server.post("/completion", body).json()
    for tok in out["completion_probabilities"]:
        assert tok["top_logprobs"][0]["id"] == tok["id"]
        assert tok["top_logprobs"][0]["logprob"] == pytest.approx(tok["logprob"])
    legacy = oai(agent_server).completions.create(
        model="m", prompt=body["prompt"], max_tokens=8, temperature=0, logprobs=2
    )
    raw = legacy.choices[0].logprobs.model_extra["content"]  # llama-server's shape
    assert all(t["top_logprobs"][0]["id"] == t["id"] for t in raw)


def test_post_sampling_probs_follow_the_chain(agent_server: ServerProcess) -> None:
    base = {
        "prompt": "The capital of France is",
        "n_predict": 6,
        "n_probs": 5,
        "post_sampling_probs": True,
    }
    greedy = agent_server.post("/completion", {**base, "temperature": 0}).json()
    for tok in greedy["completion_probabilities"]:
        assert tok["prob"] == 1.0
        assert [t["id"] for t in tok["top_probs"]] == [tok["id"]]
    sampled = agent_server.post(
        "/completion", {**base, "temperature": 1.0, "top_k": 3, "seed": 11}
    ).json()
    for tok in sampled["completion_probabilities"]:
        probs = [t["prob"] for t in tok["top_probs"]]
        assert 1 <= len(probs) <= 3 and probs == sorted(probs, reverse=True)
        assert math.fsum(probs) == pytest.approx(1.0, abs=1e-5)  # top_k 3: all candidates
        assert tok["prob"] == next(t["prob"] for t in tok["top_probs"] if t["id"] == tok["id"])


def test_include_usage_ends_the_stream_with_usage(agent_server: ServerProcess) -> None:
    client = oai(agent_server)
    args = {
        "model": "m",
        "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 8,
        "stream": True,
    }
    with_usage = list(
        client.chat.completions.create(**args, stream_options={"include_usage": True})  # type: ignore[call-overload]
    )
    assert with_usage[-1].choices == [] and with_usage[-1].usage is not None
    assert with_usage[-1].usage.completion_tokens == 8
    assert all(c.usage is None for c in with_usage[:-1])
    without = list(client.chat.completions.create(**args))  # type: ignore[call-overload]
    assert all(c.usage is None for c in without) and without[-1].choices
