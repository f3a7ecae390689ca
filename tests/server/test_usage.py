"""Honest usage on every API family, through the real server: a property test over random
conversations (random turns, session keys that return with an extended or an edited history,
`cache_control` breakpoints, streamed or not) checks that each family's usage adds up to the
tokenized prompt and agrees with `timings.cache_n`. A tiny random model: only counts matter.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvswap.tiny import tiny_model_path
from tests.server.harness import ServerProcess

pytestmark = pytest.mark.model

ARGS = ("-c", "4096", "-np", "2", "-t", "1", "-tb", "1", "-ub", "64")
WORDS = ["waves", "keeper", "light", "storm", "gull", "rope", "tide", "stone"]
FAMILIES = ["chat", "responses", "anthropic"]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    model = tiny_model_path("llama", seed=7, vocab="tiny")
    log = tmp_path_factory.mktemp("usage") / "server.log"
    proc = ServerProcess(["-m", str(model), *ARGS], log)
    yield proc
    proc.stop()


texts = st.lists(st.sampled_from(WORDS), min_size=1, max_size=12).map(" ".join)


@st.composite
def cases(draw: st.DrawFn) -> dict[str, Any]:
    n_turns = draw(st.integers(1, 4))
    turns = [draw(texts) for _ in range(2 * n_turns - 1)]  # user, assistant, ..., user
    return {
        "family": draw(st.sampled_from(FAMILIES)),
        "stream": draw(st.booleans()),
        "key": draw(st.sampled_from([None, "s1", "s2"])),
        "system": draw(st.one_of(st.none(), texts)),
        "turns": turns,
        "marks": draw(st.sets(st.integers(0, len(turns) - 1), max_size=2)),
        "ttl": draw(st.sampled_from([None, "5m", "1h"])),
        "auto": draw(st.booleans()),
    }


def _anthropic_body(case: dict[str, Any]) -> dict[str, Any]:
    cc = {"type": "ephemeral", **({"ttl": case["ttl"]} if case["ttl"] else {})}
    messages = []
    for i, text in enumerate(case["turns"]):
        block: dict[str, Any] = {"type": "text", "text": text}
        if i in case["marks"]:
            block["cache_control"] = cc
        messages.append({"role": "user" if i % 2 == 0 else "assistant", "content": [block]})
    body: dict[str, Any] = {"model": "m", "max_tokens": 3, "messages": messages}
    body["timings_per_token"] = True  # llama-server's timings, which Anthropic's shape lacks
    if case["system"] is not None:
        body["system"] = [{"type": "text", "text": case["system"], "cache_control": cc}]
    if case["auto"]:
        body["cache_control"] = cc
    return body


def _messages(case: dict[str, Any]) -> list[dict[str, str]]:
    system = [{"role": "system", "content": case["system"]}] if case["system"] else []
    roles = ["user", "assistant"]
    return system + [{"role": roles[i % 2], "content": t} for i, t in enumerate(case["turns"])]


def _request(case: dict[str, Any]) -> tuple[str, str, dict[str, Any], dict[str, str]]:
    """(route, its count route, body, headers) for the case's family."""
    key = case["key"]
    if case["family"] == "anthropic":
        headers = {"x-claude-code-session-id": key} if key else {}
        return "/v1/messages", "/v1/messages/count_tokens", _anthropic_body(case), headers
    extra = {"prompt_cache_key": key} if key else {}
    if case["family"] == "responses":
        body = {"input": _messages(case), "max_output_tokens": 3, **extra}
        return "/v1/responses", "/v1/responses/input_tokens", body, {}
    body = {"messages": _messages(case), "max_tokens": 3, **extra}
    return "/v1/chat/completions", "/v1/chat/completions/input_tokens", body, {}


def _events(server: ServerProcess, route: str, body: dict[str, Any], headers: dict[str, str]):
    with server.client.stream("POST", route, json={**body, "stream": True}, headers=headers) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                yield json.loads(line[len("data: ") :])


def _answer(case: dict[str, Any], server: ServerProcess) -> tuple[list[dict[str, Any]], int]:
    """The usages the answer reports (every one of a stream that carries one) and its
    `timings.cache_n`."""
    route, _, body, headers = _request(case)
    if case["family"] == "chat" and case["stream"]:
        body = {**body, "stream_options": {"include_usage": True}}
    if not case["stream"]:
        resp = server.post(route, {**body, "temperature": 0}, headers=headers)
        assert resp.status_code == 200, resp.text
        out = resp.json()
        return [out["usage"]], out["timings"]["cache_n"]
    usages, cache_n = [], -1
    for ev in _events(server, route, {**body, "temperature": 0}, headers):
        if "timings" in ev:
            cache_n = ev["timings"]["cache_n"]
        usage = ev.get("usage") or ev.get("message", {}).get("usage")
        usage = usage or (ev.get("response") or {}).get("usage")
        if usage:
            usages.append(usage)
    return usages, cache_n


def _check(case: dict[str, Any], usage: dict[str, Any], n_prompt: int, cache_n: int) -> None:
    family = case["family"]
    if family == "chat":
        assert usage["prompt_tokens"] == n_prompt
        assert usage["prompt_tokens_details"]["cached_tokens"] == cache_n
    elif family == "responses":
        assert usage["input_tokens"] == n_prompt
        assert usage["input_tokens_details"]["cached_tokens"] == cache_n
        written = n_prompt - cache_n if case["key"] else 0  # kept by the session's mind
        assert usage["input_tokens_details"]["cache_write_tokens"] == written
    else:
        read, created = usage["cache_read_input_tokens"], usage["cache_creation_input_tokens"]
        assert usage["input_tokens"] + created + read == n_prompt
        assert read == cache_n
        split = usage["cache_creation"]
        assert split["ephemeral_5m_input_tokens"] + split["ephemeral_1h_input_tokens"] == created
        if case["key"] is None:
            assert created == 0  # no mind keeps an anonymous prompt under a floor


@settings(
    max_examples=24,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(case=cases())
def test_usage_adds_up_to_the_prompt_and_agrees_with_cache_n(
    server: ServerProcess, case: dict[str, Any]
) -> None:
    """Defects caught: a family's usage counting another prompt than the one run (a count
    route and the generation rendering differently), cached tokens that are not the KV reused
    (`timings.cache_n`: from a slot, a RAM page or disk), Anthropic's read + created + uncached
    not adding up to the prompt in `message_start` or in the cumulative `message_delta`, and
    tokens reported created where no mind keeps them."""
    _, count_route, body, _ = _request(case)
    n_prompt = server.post(count_route, body).json()["input_tokens"]
    usages, cache_n = _answer(case, server)
    assert usages and cache_n >= 0
    for usage in usages:
        _check(case, usage, n_prompt, cache_n)
