"""Agent sessions that never name a mind, through the official client libraries: a Claude Code
like session (the `anthropic` SDK, `x-claude-code-session-id`, tools and tool results, a moving
`cache_control` breakpoint, the whole history every turn) and a Codex like one (the `openai` SDK
on /v1/responses, `prompt_cache_key`, function calls and their outputs). Between turns the mind
is moved to disk (`POST /minds/{name}?action=spill`); each returning turn must read back at
least 95% of the previous turn's prompt and prefill at most its new tokens + 64. A tiny random
model: its answers are whatever the tool grammar lets it write; only token counts are asserted.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest

from kvswap.tiny import tiny_model_path
from tests.server.harness import ServerProcess

pytestmark = pytest.mark.model

N_TURNS = 30
ARGS = ("-c", "8192", "-np", "2", "-t", "1", "-tb", "1", "-ub", "128", "--metrics")
SYSTEM = "You are a coding agent in a small repository. Read before you write. " * 6
TOOLS = [
    {
        "name": "read_file",
        "description": "Read a file of the repository",
        "input_schema": {
            "type": "object",
            "properties": {"path": {"type": "string", "maxLength": 12}},
            "required": ["path"],
        },
    },
    {
        "name": "run_tests",
        "description": "Run the test suite",
        "input_schema": {"type": "object", "properties": {}},
    },
]
# TOOLS as OpenAI's chat API takes them
CHAT_TOOLS = [
    {"type": "function", "function": {"name": t["name"], "parameters": t["input_schema"]}}
    for t in TOOLS
]
ASKS = ["Fix the failing test.", "Why?", "Go on.", "Check the parser.", "Done?"]
# The tool choice changes from turn to turn (a random model calls a tool only when made to).
CHOICES: list[Any] = [{"type": "tool", "name": "run_tests"}, {"type": "auto"}, {"type": "any"}]
OAI_CHOICES: list[Any] = [{"type": "function", "name": "run_tests"}, "auto", "required"]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    model = tiny_model_path("llama", seed=7, vocab="tiny")
    folder = tmp_path_factory.mktemp("agents")
    (folder / "slots").mkdir()
    args = ["-m", str(model), *ARGS, "--slot-save-path", str(folder / "slots")]
    proc = ServerProcess(args, folder / "server.log")
    yield proc
    proc.stop()


def _to_disk(server: ServerProcess, mind: str) -> None:
    """The pool moves the mind out: from its slot (or RAM) to disk (the verb says where)."""
    resp = server.post(f"/minds/{mind}?action=spill")
    assert resp.status_code == 200 and resp.json()["tier"] == "disk", resp.text


class Turns:
    """Each turn's prompt tokens, and the checks a returning turn must pass."""

    def __init__(self) -> None:
        self.prompts: list[int] = []

    def check(self, n_prompt: int, n_read: int) -> None:
        if self.prompts:
            previous = self.prompts[-1]
            n_new = n_prompt - previous
            assert n_read >= 0.95 * previous, (len(self.prompts), n_read, previous)
            assert n_prompt - n_read <= n_new + 64, (len(self.prompts), n_prompt, n_read)
        self.prompts.append(n_prompt)


def test_a_claude_code_session_returns_from_disk_every_turn(server: ServerProcess) -> None:
    """Defect caught: Claude Code's session (no mind named, the whole history resent each
    turn) re-prefilling its history after its state left the slot: through the official
    SDK, streamed and not, 30 turns with tool calls and results, each read back from disk."""
    session = "0d9c6a51-claude-code-session"
    claude = anthropic.Anthropic(
        base_url=server.url,
        api_key="none",
        max_retries=0,
        default_headers={"x-claude-code-session-id": session},
    )
    system: Any = [{"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral"}}]
    messages: list[dict[str, Any]] = []
    turns = Turns()
    user: list[dict[str, Any]] = [{"type": "text", "text": ASKS[0]}]
    n_calls = 0
    for t in range(N_TURNS):
        user[-1] = {**user[-1], "cache_control": {"type": "ephemeral"}}  # the moving marker
        messages.append({"role": "user", "content": user})
        args: dict[str, Any] = {"model": "claude", "max_tokens": 96, "system": system}
        args |= {"tools": TOOLS, "messages": messages, "tool_choice": CHOICES[t % 3]}
        if t % 2:
            with claude.messages.stream(**args) as stream:
                msg = stream.get_final_message()
        else:
            msg = claude.messages.create(**args)
        u = msg.usage
        read, created = u.cache_read_input_tokens or 0, u.cache_creation_input_tokens or 0
        turns.check(u.input_tokens + created + read, read)
        content = [b.model_dump(exclude_none=True) for b in msg.content] or [
            {"type": "text", "text": "..."}
        ]
        messages[-1]["content"] = [  # the marker moves on: earlier blocks lose it
            {k: v for k, v in b.items() if k != "cache_control"} for b in messages[-1]["content"]
        ]
        messages.append({"role": "assistant", "content": content})
        calls = [b for b in msg.content if b.type == "tool_use"]
        n_calls += len(calls)
        user = [
            {"type": "tool_result", "tool_use_id": c.id, "content": f"ok {t}"} for c in calls
        ] or [{"type": "text", "text": ASKS[t % len(ASKS)]}]
        _to_disk(server, session)
    assert n_calls >= N_TURNS // 3  # a tool was called (a forced choice every third turn)
    assert server.metrics()["llamacpp:mind_hits_disk_total"] >= N_TURNS - 1


def test_a_codex_session_on_responses_returns_from_disk_every_turn(
    server: ServerProcess,
) -> None:
    """Defect caught: Codex over HTTP (prompt_cache_key = its conversation id, the whole
    input every request, function calls and outputs) re-prefilling its history after its
    state left the slot: 30 turns through the official SDK, each read back from disk."""
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0)
    tools: Any = [
        {"type": "function", "name": t["name"], "description": t["description"],
         "parameters": t["input_schema"]}
        for t in TOOLS
    ]  # fmt: skip
    items: list[Any] = [{"role": "developer", "content": SYSTEM}]
    items.append({"role": "user", "content": ASKS[0]})
    turns = Turns()
    n_calls = 0
    for t in range(N_TURNS):
        resp = client.responses.create(
            model="codex",
            input=items,
            tools=tools,
            prompt_cache_key="codex-conv-1",
            max_output_tokens=96,
            temperature=0,
            tool_choice=OAI_CHOICES[t % 3],
        )
        usage = resp.usage
        assert usage is not None
        turns.check(usage.input_tokens, usage.input_tokens_details.cached_tokens)
        items += [o.model_dump(exclude_none=True) for o in resp.output]
        calls = [o for o in resp.output if o.type == "function_call"]
        n_calls += len(calls)
        items += [
            {"type": "function_call_output", "call_id": c.call_id, "output": f"ok {t}"}
            for c in calls
        ] or [{"role": "user", "content": ASKS[t % len(ASKS)]}]
        _to_disk(server, "codex-conv-1")
    assert n_calls >= N_TURNS // 3  # a function was called (a forced choice every third turn)


def _environment(t: int) -> dict[str, Any]:
    """Claude Code's mid-conversation system turn (its environment, a reminder), marked."""
    text = f"<env>Working directory: /repo\nPlatform: linux\nTurn: {t}</env>"
    block = {"type": "text", "text": text, "cache_control": {"type": "ephemeral"}}
    return {"role": "system", "content": [block]}


def test_claude_codes_whole_request_is_taken_and_its_session_is_a_mind(
    server: ServerProcess,
) -> None:
    """Claude Code 2.1's request as it sends it (issue 41): a system-role turn after the first
    user message (and another after each answer), `thinking` adaptive with its display
    omitted, `context_management`, `output_config`, `metadata.user_id` carrying the session id
    as JSON (no session header here), the billing line and the beta header. Every request is
    a 200 (it was a 400: role must be 'user' or 'assistant'), streamed as the CLI reads it;
    the session id names the mind, and each later turn prefills at most its new input + 64."""
    session = "5d1f0c1e-7a43-4c1b-9a57-claude-meta"
    claude = anthropic.Anthropic(
        base_url=server.url,
        api_key="none",
        max_retries=0,
        default_headers={"anthropic-beta": "claude-code-20250219"},
    )
    system: Any = [
        {
            "type": "text",
            "text": "x-anthropic-billing-header: cc_version=2.1.328; cc_entrypoint=sdk-cli;",
        },
        {"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral"}},
    ]
    extra = {
        "thinking": {"type": "adaptive", "display": "omitted"},
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        "output_config": {"effort": "high"},
        "metadata": {"user_id": json.dumps({"device_id": "d1", "session_id": session})},
    }
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": [{"type": "text", "text": ASKS[0]}]},
        _environment(0),
    ]
    turns = Turns()
    for t in range(4):
        args: dict[str, Any] = {"model": "claude-sonnet-4-5", "max_tokens": 32000}
        args |= {"system": system, "tools": TOOLS, "messages": messages}
        with claude.messages.stream(**args, extra_body={**extra, "max_tokens": 48}) as stream:
            msg = stream.get_final_message()
        u = msg.usage
        read, created = u.cache_read_input_tokens or 0, u.cache_creation_input_tokens or 0
        turns.check(u.input_tokens + created + read, read)
        content = [b.model_dump(exclude_none=True) for b in msg.content] or [
            {"type": "text", "text": "..."}
        ]
        messages += [
            {"role": "assistant", "content": content},
            {"role": "user", "content": [{"type": "text", "text": ASKS[(t + 1) % len(ASKS)]}]},
            _environment(t + 1),
        ]
    minds = {v["mind"] for v in server.client.get("/pages").json()["minds"]}
    assert session in minds


def test_a_long_answer_is_never_prefilled_again(server: ServerProcess) -> None:
    """Issue 41: a client re-sending the whole conversation under a session key echoes each
    answer back as a message, which the template renders otherwise than the model's tokens;
    the mind continues its own tokens, so with answers of 300 tokens (a forced tool call among
    them) each later turn prefills at most its new input + 64 tokens. Defect caught: every
    turn re-prefilled its previous answer (the history diverged where the answer starts)."""
    chat = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0)
    tools: Any = CHAT_TOOLS
    messages: list[Any] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": ASKS[0]},
    ]
    n_before = 0
    for t in range(5):
        raw = chat.chat.completions.with_raw_response.create(
            model="m",
            messages=messages,
            tools=tools,
            tool_choice="required" if t == 2 else "auto",
            max_tokens=300,
            temperature=0,
            prompt_cache_key="chat-long",
            extra_body={"ignore_eos": t != 2},  # a long answer; the call ends itself
        )
        data = json.loads(raw.text)
        timings, usage = data["timings"], data["usage"]
        if t:
            n_new = usage["prompt_tokens"] - n_before
            assert timings["prompt_n"] <= n_new + 64, (t, timings, n_new)
        n_before = usage["prompt_tokens"] + usage["completion_tokens"]
        message = data["choices"][0]["message"]
        assert usage["completion_tokens"] >= 300 or message.get("tool_calls"), usage
        messages.append(message)
        calls = message.get("tool_calls") or []
        messages += [{"role": "tool", "tool_call_id": c["id"], "content": "ok"} for c in calls] or [
            {"role": "user", "content": ASKS[(t + 1) % len(ASKS)]}
        ]


def test_a_call_echoed_under_another_output_rule_continues_the_mind(server: ServerProcess) -> None:
    """An answer that called a tool comes back in a request whose own answer may call none (a
    structured final answer, `response_format`, after the calls; Codex steered by `kvswap bench
    coding`: a forced call, then `tool_choice: none` under a grammar): the next request still
    continues the mind's own tokens, so it prefills only the tool's output and the glue.
    Defect caught: the earlier answer was read with this request's parser, which then parses
    no calls, so the echoed call never matched and was prefilled again (28-54 tokens a turn in
    the bench)."""
    base = {"tools": CHAT_TOOLS, "temperature": 0, "prompt_cache_key": "calls-then-a-schema"}
    messages, usage = _forced_call(server, base)
    schema = {"type": "json_schema", "json_schema": {"name": "r", "schema": {"type": "object"}}}
    _assert_only_new_input(server, {**base, "messages": messages, "response_format": schema}, usage)


FORCED = {"type": "function", "function": {"name": "run_tests"}}


def _forced_call(server: ServerProcess, base: dict[str, Any]) -> tuple[list[Any], dict[str, Any]]:
    """A first turn that calls a tool (forced), and the conversation the client then sends:
    the call echoed back and the tool's output; with the first turn's usage."""
    messages: list[Any] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": ASKS[0]},
    ]
    first = server.post(
        "/v1/chat/completions",
        {**base, "messages": messages, "tool_choice": FORCED, "max_tokens": 200},
    )
    assert first.status_code == 200, first.text
    call = first.json()["choices"][0]["message"]
    assert call["tool_calls"], call
    messages += [
        call,
        {"role": "tool", "tool_call_id": call["tool_calls"][0]["id"], "content": "ok"},
    ]
    return messages, first.json()["usage"]


def _assert_only_new_input(server: ServerProcess, body: dict[str, Any], usage: dict) -> None:
    """The next turn `body` continues the mind: no divergence, and it prefills only what the
    conversation added after the first turn's prompt and answer (`usage`)."""
    second = server.post("/v1/chat/completions", {**body, "max_tokens": 4})
    assert second.status_code == 200, second.text
    assert "x-kvswap-diverged-at" not in second.headers, dict(second.headers)
    n_new = second.json()["usage"]["prompt_tokens"] - usage["prompt_tokens"]
    n_new -= usage["completion_tokens"]
    assert second.json()["timings"]["prompt_n"] <= n_new + 1, (second.json()["timings"], n_new)


def test_a_new_session_starts_from_its_tenants_sessions_in_ram(server: ServerProcess) -> None:
    """Every session of an agent opens with the same system prompt and tools (Claude Code's
    6-13k tokens): a new session's first turn reads that opening from the tenant's mind in RAM
    that shares it, instead of prefilling it again; the mind it came from is left as it was.
    Defect caught (`kvswap bench coding`): each new session prefilled the whole opening, where
    llama-server's prompt cache found it."""
    opening = [{"role": "system", "content": SYSTEM * 4}]

    def first_turn(session: str, ask: str) -> dict[str, Any]:
        body = {
            "messages": [*opening, {"role": "user", "content": ask}],
            "max_tokens": 4,
            "temperature": 0,
            "prompt_cache_key": session,
        }
        resp = server.post("/v1/chat/completions", body)
        assert resp.status_code == 200, resp.text
        return dict(resp.json())

    one = first_turn("seed-one", ASKS[0])
    moved = server.post("/minds/seed-one?action=page_out")
    assert moved.status_code == 200 and moved.json()["tier"] == "ram", moved.text
    seeds = _metric(server, "mind_seeds_total")
    two = first_turn("seed-two", ASKS[1])
    n_opening = 0.9 * one["usage"]["prompt_tokens"]  # the system prompt, and little more
    assert two["timings"]["cache_n"] >= n_opening, (two["timings"], one["usage"])
    assert _metric(server, "mind_seeds_total") == seeds + 1
    again = first_turn("seed-one", ASKS[0])  # the page it seeded from is the same mind still
    assert again["timings"]["cache_n"] == again["usage"]["prompt_tokens"] - 1, again["timings"]


def _metric(server: ServerProcess, name: str) -> float:
    for line in server.client.get("/metrics").text.splitlines():
        if line.startswith(f"llamacpp:{name} "):
            return float(line.split()[1])
    raise AssertionError(f"{name} is not in /metrics")


def test_a_forced_call_with_ignore_eos_ends_and_the_server_lives(server: ServerProcess) -> None:
    """A forced tool call under `ignore_eos`: once the call's grammar is complete it admits
    only the end of generation, which `ignore_eos` bans. The answer ends with the call (200),
    and the server keeps serving. Defect caught: libllama's grammar threw on the token the
    sampler drew instead ('Unexpected empty grammar stack'), which aborted the process."""
    body = {
        "messages": [{"role": "user", "content": ASKS[0]}],
        "tools": CHAT_TOOLS,
        "tool_choice": "required",
        "ignore_eos": True,
        "max_tokens": 200,
    }
    answer = server.post("/v1/chat/completions", body)
    assert answer.status_code == 200, answer.text
    assert answer.json()["choices"][0]["message"]["tool_calls"]
    assert server.post("/completion", {"prompt": "Hi", "n_predict": 2}).status_code == 200


def test_a_side_request_and_a_new_stamp_leave_the_session_whole(server: ServerProcess) -> None:
    """Claude Code sends other conversations on its session id (title generation, subagents:
    another system prompt) and a billing line whose `cc_version` suffix changes with each
    `claude` run and, interactively, whose `cch=` stamp changes every request. Neither may cost
    the session its mind: the side request runs on a mind of its own (its answer names it), and
    the next turn of the session, under a new stamp, prefills at most its new input + 64
    tokens; the side conversation's own next turn reads its first turn back from its mind.
    Defects caught: the side request ran on the session's mind and dropped its history past the
    few tokens they share; then it ran on no mind, so a subagent's every turn re-prefilled."""
    session = "9b2e-claude-code-side-requests"
    claude = anthropic.Anthropic(
        base_url=server.url,
        api_key="none",
        max_retries=0,
        default_headers={"x-claude-code-session-id": session},
    )
    stamp = "x-anthropic-billing-header: cc_version=2.1.328.{}; cc_entrypoint=cli; cch={};"

    def system(version: str, cch: str) -> Any:
        line = stamp.format(version, cch)
        return [{"type": "text", "text": line}, {"type": "text", "text": SYSTEM}]

    messages: list[dict[str, Any]] = [{"role": "user", "content": ASKS[0]}]
    first = claude.messages.create(
        model="m",
        max_tokens=40,
        system=system("593", "a5145"),
        messages=messages,  # type: ignore[arg-type]
    )
    n_first = first.usage.input_tokens + (first.usage.cache_read_input_tokens or 0)
    n_first += first.usage.cache_creation_input_tokens or 0
    side_system = "You are a subagent: find the failing test and report its name. " * 4
    side_messages: list[dict[str, Any]] = [{"role": "user", "content": ASKS[3]}]
    side = claude.messages.with_raw_response.create(
        model="m",
        max_tokens=8,
        system=side_system,
        messages=side_messages,  # type: ignore[arg-type]
    )
    side_mind = side.headers.get("x-kvswap-mind", "")
    assert side_mind.startswith(session + "~side-"), side.headers
    content = [b.model_dump(exclude_none=True) for b in first.content] or [
        {"type": "text", "text": "..."}
    ]
    messages += [{"role": "assistant", "content": content}, {"role": "user", "content": "Why?"}]
    second = claude.messages.create(
        model="m",
        max_tokens=8,
        system=system("281", "0f9e2"),
        messages=messages,  # type: ignore[arg-type]
    )
    read = second.usage.cache_read_input_tokens or 0
    n_prompt = second.usage.input_tokens + read + (second.usage.cache_creation_input_tokens or 0)
    assert read >= n_first, (read, n_first)
    assert n_prompt - read <= (n_prompt - n_first - first.usage.output_tokens) + 64
    first_side = side.parse()
    answer = [b.model_dump(exclude_none=True) for b in first_side.content]
    side_messages += [
        {"role": "assistant", "content": answer or [{"type": "text", "text": "..."}]},
        {"role": "user", "content": ASKS[4]},
    ]
    again = claude.messages.with_raw_response.create(
        model="m",
        max_tokens=8,
        system=side_system,
        messages=side_messages,  # type: ignore[arg-type]
    )
    assert again.headers.get("x-kvswap-mind") == side_mind, again.headers
    usage = again.parse().usage
    assert (usage.cache_read_input_tokens or 0) >= first_side.usage.input_tokens, usage


def test_the_first_turn_after_a_restart_continues_the_last_answer(
    start: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    """A session's last answer (a tool call, which the chat template renders otherwise than
    the model wrote it) comes back after the server restarted: its mind is read back from disk
    and the echoed call still matches the model's own tokens, so the turn prefills only the
    tool's output and the glue. Defect caught: the last turns lived in memory only, so the
    first turn after a restart diverged where the answer began and prefilled it again."""
    args = ("-m", str(tiny_model_path("llama", seed=7, vocab="tiny")), *ARGS)
    server = start(*args, save=tmp_path / "slots")
    base = {"tools": CHAT_TOOLS, "temperature": 0, "prompt_cache_key": "across-a-restart"}
    messages, usage = _forced_call(server, base)
    server.stop()  # SIGTERM: the mind goes to disk, its last turn beside it
    again = start(*args, save=tmp_path / "slots")
    _assert_only_new_input(again, {**base, "messages": messages, "tool_choice": FORCED}, usage)
