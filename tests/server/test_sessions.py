"""Session keys through the real server: a client that never names a mind gets one from the key
it sends anyway (OpenAI's `prompt_cache_key`, llama-server's `X-Conversation-Id`), an edited
history re-seats its mind at the longest common prefix, and one API key's anonymous prompts are
never a cache hit for another key. A tiny random model: only token counts are asserted.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from kvswap.tiny import tiny_model_path
from tests.server.harness import ServerProcess

pytestmark = pytest.mark.model

ARGS = ("-c", "2048", "-np", "1", "-t", "1", "-tb", "1", "-ub", "64")
STORY = "Once upon a time there was a lighthouse keeper who counted the waves. " * 4


@pytest.fixture()
def start(tmp_path: Path) -> Iterator[Callable[..., ServerProcess]]:
    started: list[ServerProcess] = []

    def get(*args: str, env: dict[str, str] | None = None) -> ServerProcess:
        model = tiny_model_path("llama", seed=7, vocab="tiny")
        log = tmp_path / f"s{len(started)}.log"
        server = ServerProcess(["-m", str(model), *ARGS, *args], log, env)
        started.append(server)
        return server

    yield get
    for server in started:
        server.stop()


def _chat(
    server: ServerProcess, messages: list[dict[str, str]], headers: dict[str, str], **extra: Any
) -> dict[str, Any]:
    body = {"messages": messages, "max_tokens": 4, "temperature": 0, **extra}
    resp = server.post("/v1/chat/completions", body, headers=headers)
    assert resp.status_code == 200, resp.text
    return dict(resp.json())


def _prompt_tokens(server: ServerProcess, messages: list[dict[str, str]]) -> list[int]:
    prompt = server.post("/apply-template", {"messages": messages}).json()["prompt"]
    tokens = server.post("/tokenize", {"content": prompt, "add_special": True}).json()["tokens"]
    return [int(t) for t in tokens]


def _minds(server: ServerProcess, headers: dict[str, str] | None = None) -> dict[str, Any]:
    views = server.client.get("/pages", headers=headers).json()["minds"]
    return {v["mind"]: v for v in views}


def _common(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def test_x_conversation_id_names_a_mind_and_an_edited_history_reseats_it(
    start: Callable[..., ServerProcess],
) -> None:
    """Defects caught: a client sending only llama-server's X-Conversation-Id getting no mind
    (its conversation lost to the next anonymous request on the one slot), and a history the
    client edited served with the KV of the old one: the edited turn must reuse exactly the
    common prefix of its prompt with what the mind holds, no token more."""
    server = start()
    conv = {"X-Conversation-Id": "conv-1"}
    first = [{"role": "user", "content": STORY + "How many waves?"}]
    one = _chat(server, first, conv)
    assert set(_minds(server)) == {"conv-1"}
    _chat(server, [{"role": "user", "content": "Something else entirely, " * 20}], {})
    second = [*first, {"role": "assistant", "content": "Ten."}, {"role": "user", "content": "Why?"}]
    two = _chat(server, second, conv)  # the anonymous request took the slot: paged back in
    assert two["timings"]["cache_n"] >= one["usage"]["prompt_tokens"] - 1
    edited = [{"role": "user", "content": STORY.replace("waves", "gulls") + "How many?"}]
    edited += second[1:]
    three = _chat(server, edited, conv)
    lcp = _common(_prompt_tokens(server, edited), _prompt_tokens(server, second))
    assert lcp < one["usage"]["prompt_tokens"] // 2  # the edit is early in the conversation
    assert three["timings"]["cache_n"] == lcp
    assert three["usage"]["prompt_tokens_details"]["cached_tokens"] == lcp


def test_prompt_cache_key_names_a_mind_on_responses(start: Callable[..., ServerProcess]) -> None:
    """Defect caught: Codex's prompt_cache_key (its conversation id) ignored, so each turn of
    a conversation interleaved with another client's re-prefills its whole history. Its
    second turn reads the first turn's prompt back from the mind (usage says so)."""
    server = start()
    items: list[dict[str, Any]] = [{"role": "user", "content": STORY + "Count them."}]
    body = {"input": items, "max_output_tokens": 4, "temperature": 0, "prompt_cache_key": "cx-1"}
    one = server.post("/v1/responses", body).json()
    _chat(server, [{"role": "user", "content": "Unrelated, " * 30}], {})
    items += [{"role": "assistant", "content": "Ten."}, {"role": "user", "content": "More?"}]
    two = server.post("/v1/responses", {**body, "input": items}).json()
    assert two["usage"]["input_tokens_details"]["cached_tokens"] >= (
        one["usage"]["input_tokens"] - 1
    )
    assert _minds(server)["cx-1"]["n_tokens"] > one["usage"]["input_tokens"]


def test_no_session_minds_leaves_session_keys_anonymous(
    start: Callable[..., ServerProcess],
) -> None:
    """Defect caught: --no-session-minds still making minds of session keys."""
    server = start("--no-session-minds")
    _chat(server, [{"role": "user", "content": STORY}], {"X-Conversation-Id": "conv-1"})
    _chat(server, [{"role": "user", "content": STORY}], {}, prompt_cache_key="pck")
    assert _minds(server) == {}


def test_one_keys_prompt_is_never_a_cache_hit_for_another(
    start: Callable[..., ServerProcess],
) -> None:
    """Defect caught: the anonymous prefix cache (the slot's and the RAM cache's) shared across
    API keys, so `cache_n` tells kb how much of its guess ka already sent: the second key
    sending ka's long prompt reads 0 cached tokens, from the slot and from the RAM cache,
    while each key still finds its own prompt."""
    server = start("--api-key", "ka,kb")
    ka, kb = {"Authorization": "Bearer ka"}, {"Authorization": "Bearer kb"}
    body = {"prompt": STORY, "n_predict": 1, "temperature": 0}

    def cached(headers: dict[str, str]) -> int:
        resp = server.post("/completion", body, headers=headers)
        assert resp.status_code == 200, resp.text
        return int(resp.json()["timings"]["cache_n"])

    assert cached(ka) == 0
    assert cached(kb) == 0  # the slot holds ka's prompt: not kb's to reuse
    assert cached(kb) > 0  # kb's own, from the slot
    assert cached(ka) > 0  # ka's own, from the RAM cache (kb's prompt took the slot)
    assert cached(ka) > 0


def test_a_new_session_mind_starts_from_the_cached_prefix(
    start: Callable[..., ServerProcess],
) -> None:
    """Defect caught: a session key's first turn re-prefilling a system prompt an anonymous
    request of the same key just computed (every new Claude Code session, every new agent),
    because a new mind started from an empty slot."""
    server = start()
    system = {"role": "system", "content": STORY}
    anonymous = [system, {"role": "user", "content": "Count the waves."}]
    _chat(server, anonymous, {})
    session = [system, {"role": "user", "content": "Name the keeper."}]
    first = _chat(server, session, {"X-Conversation-Id": "conv-new"})
    lcp = _common(_prompt_tokens(server, anonymous), _prompt_tokens(server, session))
    assert first["timings"]["cache_n"] == lcp > 50
    assert set(_minds(server)) == {"conv-new"}


def test_a_new_session_starts_from_its_own_keys_sessions_only(
    start: Callable[..., ServerProcess],
) -> None:
    """A new session's first turn reads the opening that another session of its own API key
    holds in RAM (no anonymous request ran, so only a mind can hold it), and never another
    key's: kb sending ka's system prompt under a new session reads 0 cached tokens."""
    server = start("--api-key", "ka,kb")
    ka, kb = {"Authorization": "Bearer ka"}, {"Authorization": "Bearer kb"}
    system = {"role": "system", "content": STORY}
    _chat(
        server,
        [system, {"role": "user", "content": "Count the waves."}],
        {**ka, "X-Conversation-Id": "ka-1"},
    )
    other = [system, {"role": "user", "content": "Name the keeper."}]
    theirs = _chat(server, other, {**kb, "X-Conversation-Id": "kb-1"})
    assert theirs["timings"]["cache_n"] == 0, theirs["timings"]
    mine = _chat(server, other, {**ka, "X-Conversation-Id": "ka-2"})
    assert mine["timings"]["cache_n"] > 50, mine["timings"]  # ka-1's opening, from its page
    assert mine["timings"]["cache_n"] < mine["usage"]["prompt_tokens"] - 1


NOOP = {"type": "function", "function": {"name": "noop", "parameters": {"type": "object"}}}


def test_switching_tool_choice_keeps_the_conversations_prefix(
    start: Callable[..., ServerProcess],
) -> None:
    """Defect caught: `tool_choice: "required"` rendering a system line `"auto"` does not (or
    a response format hiding the tools), so an agent turn that switched re-prefilled everything
    after the system prompt (a new user's agent reused 145 of 211 tokens on its second turn).
    Each turn, auto, required, a named function, none, a response format, then auto again,
    reuses the whole previous prompt."""
    server = start()
    key = {"X-Conversation-Id": "agent-1"}
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": STORY},
        {"role": "user", "content": "Check something."},
    ]
    schema = {"type": "json_schema", "json_schema": {"schema": {"type": "object"}}}
    named = {"tool_choice": {"type": "function", "function": {"name": "noop"}}}
    turns: list[dict[str, Any]] = [
        {"tool_choice": "auto"}, {"tool_choice": "required"}, named, {"tool_choice": "none"},
        {"tool_choice": "auto", "response_format": schema}, {"tool_choice": "auto"},
    ]  # fmt: skip
    previous: list[int] | None = None
    for turn, choice in enumerate(turns):
        body = {"tools": [NOOP], "max_tokens": 2, **choice}
        prompt = server.post("/apply-template", {"messages": messages, **body}).json()["prompt"]
        tokens = server.post("/tokenize", {"content": prompt, "add_special": True}).json()
        out = _chat(server, messages, key, **body)
        if previous is not None:
            assert out["timings"]["cache_n"] >= len(previous), (turn, choice)
        previous = tokens["tokens"]
        call = {
            "id": f"c{turn}",
            "type": "function",
            "function": {"name": "noop", "arguments": "{}"},
        }
        messages += [
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"c{turn}", "content": "done"},
        ]


def _pages_until(server: ServerProcess, cond: Callable[[dict[str, Any]], bool]) -> dict:
    deadline = time.monotonic() + 30
    while True:
        minds = _minds(server)
        if cond(minds):
            return minds
        assert time.monotonic() < deadline, minds
        time.sleep(0.1)


def test_a_5m_breakpoint_keeps_a_claude_code_session_through_pressure_and_6_minutes(
    start: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    """Decision (cache_control as a retention floor): a Claude Code session whose turn set a
    5-minute breakpoint keeps its state under memory and disk pressure: while other minds
    push it out of RAM and a full disk tier (--page-disk-drop-lru) drops the least recently
    used spilled minds, it keeps its copy though it is the oldest. Six minutes later (the
    floors' clock moved ahead, KVSWAP_CLOCK_SKEW_FILE) its prefix is still read back from
    disk, and the usage says so: the whole last prompt read, only the new turn created.
    Defect caught: the oldest mind dropped for room before its TTL, or a return from disk
    reported as a cache miss."""
    save, skew = tmp_path / "slots", tmp_path / "skew"
    save.mkdir()
    server = start(
        "--slot-save-path", str(save), "--metrics",
        "--page-ram-bytes", "400K", "--page-disk-bytes", "350K", "--page-disk-drop-lru",
        env={"KVSWAP_CLOCK_SKEW_FILE": str(skew)},
    )  # fmt: skip
    claude = {"x-claude-code-session-id": "cc-1"}
    cc = {"type": "ephemeral", "ttl": "5m"}
    system = [{"type": "text", "text": STORY * 2, "cache_control": cc}]
    messages: list[dict[str, Any]] = [{"role": "user", "content": "How many waves?"}]
    body = {"model": "m", "max_tokens": 3, "system": system, "timings_per_token": True}
    one = server.post("/v1/messages", {**body, "messages": messages}, headers=claude).json()
    assert one["usage"]["cache_creation_input_tokens"] > 0
    n_first = one["usage"]["input_tokens"] + one["usage"]["cache_creation_input_tokens"]
    for m in range(6):  # each pushes the one before out of its slot, and RAM to disk
        other = {"prompt": f"Mind {m} counts. " + STORY * 2, "n_predict": 2, "mind": f"m{m}"}
        assert server.post("/completion", other).status_code == 200
    minds = _pages_until(server, lambda v: len(v) < 7 and v.get("cc-1", {}).get("tier") == "disk")
    assert server.metrics()["llamacpp:mind_disk_dropped_total"] >= 1
    assert "cc-1" in minds  # the oldest, kept by its floor while others were dropped
    skew.write_text("360")  # six minutes idle
    messages += [
        {"role": "assistant", "content": one["content"] or "Ten."},
        {"role": "user", "content": [{"type": "text", "text": "Why?", "cache_control": cc}]},
    ]
    two = server.post("/v1/messages", {**body, "messages": messages}, headers=claude).json()
    usage = two["usage"]
    assert usage["cache_read_input_tokens"] >= n_first
    assert usage["cache_read_input_tokens"] == two["timings"]["cache_n"]
    assert usage["cache_creation_input_tokens"] < 40  # the new turn only
    assert server.metrics()["llamacpp:mind_hits_disk_total"] >= 1


def test_floored_sessions_past_both_budgets_never_wedge_the_server(
    start: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    """Audit F1: Claude Code sessions, each its own session id and a 1-hour `cache_control`
    floor, until their minds fill RAM and disk many times over (--page-disk-drop-lru). Every
    turn answers (floors past half the disk budget give way, least recently used first), and
    another key's anonymous request between them answers at once. Defect caught: the 14th
    session and every later request hung, with no error, until the floors passed."""
    save = tmp_path / "slots"
    save.mkdir()
    server = start(
        "--slot-save-path", str(save), "--metrics", "--api-key", "ka,kb",
        "--page-ram-bytes", "400K", "--page-disk-bytes", "350K", "--page-disk-drop-lru",
    )  # fmt: skip
    server.client.timeout = httpx.Timeout(60)
    server.client.headers["Authorization"] = "Bearer ka"  # /metrics; bob's turns send kb
    cc = {"type": "ephemeral", "ttl": "1h"}
    for i in range(16):
        body = {
            "model": "m",
            "max_tokens": 2,
            "system": [{"type": "text", "text": f"Session {i}. " + STORY * 2, "cache_control": cc}],
            "messages": [{"role": "user", "content": "How many waves?"}],
        }
        headers = {"x-claude-code-session-id": f"bob-{i}", "Authorization": "Bearer kb"}
        answer = server.post("/v1/messages", body, headers=headers)
        assert answer.status_code == 200, (i, answer.text)
        t0 = time.monotonic()
        other = server.post("/completion", {"prompt": "Hello", "n_predict": 2})
        assert other.status_code == 200 and time.monotonic() - t0 < 10, other.text
    assert server.metrics()["llamacpp:mind_disk_dropped_total"] >= 1
    minds = _minds(server, {"Authorization": "Bearer kb"})
    assert "bob-15" in minds and "bob-0" not in minds  # the oldest floors gave way
