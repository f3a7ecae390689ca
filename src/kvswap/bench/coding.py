"""`kvswap bench coding`: Claude Code and Codex sessions, captured from the real clients at run
time and replayed against kvswap and llama-server with the same flags.

1. Capture: `kvswap serve` on the model (YaRN to 16k tokens, one slot) behind the recording
   proxy; `--sessions` sessions (Claude Code and Codex in turn, `kvswap.agents.drive`: `claude
   -p` / `--continue`, `codex exec` / `resume --last`, each Codex turn calling a tool once) of
   `--turns` turns each. The requests, as the proxy forwarded them, are kept under
   `.cache/bench-coding/` (the clients' prompts stay out of the repository) and reused by the
   next run with the same shape (`--recapture` takes them again).
2. Replay, each way on a fresh server with the same flags (one slot; a RAM budget that holds
   two of the sessions' minds: kvswap's `--page-ram-bytes` with a disk tier, llama-server's
   `--cache-ram`): turn by turn, every session's requests of that turn in order, so the
   sessions take the slot in turn. Each request's TTFT (its first delta event) and the prompt
   tokens it prefilled and read from cache (the servers' own `/metrics` counters, the same
   series in both).

The report (`coding_report`) prints each turn's figures side by side, the share of prompt tokens
reused after each session's first request, and the `uptime` load before and after.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

from kvswap.agents.clis import CLAUDE_CODE_VERSION, CODEX_VERSION
from kvswap.agents.drive import YARN_16K, claude_turns, codex_turns
from kvswap.agents.recorder import Exchange
from kvswap.bench.coding_report import Sample, report
from kvswap.bench.minds import kv_bytes_per_token, uptime
from kvswap.bench.server import BenchServer
from kvswap.models import default_model_path
from kvswap.tiny.cache import cache_root

CLAUDE_TOPICS = ["a cat who learns to code", "a lighthouse with a robot keeper"]
CLAUDE_ASKS = [
    "Write a short story about {}.",
    "Tell the same story from another character's point of view.",
    "Give the story a different ending.",
    "Which part of the story is weakest, and why?",
    "Rewrite that part.",
    "Summarize the story for a child.",
    "Write a title and a one-line pitch.",
    "Turn the story into a short poem.",
    "What would a sequel be about?",
    "Write the sequel's first scene.",
]
CODEX_ASKS = [
    "What is the goal of this session?",
    "Say it again in one sentence.",
    "What would you do first?",
    "And after that?",
    "Which risk worries you most?",
    "How would you test it?",
    "What would you leave out?",
    "Write the plan as a list.",
    "What did we agree on so far?",
    "Say goodbye.",
]
REPLAYED = ("/v1/messages", "/v1/responses")


@dataclass
class Request:
    """One captured request: what a replay sends, and the answer the capture got."""

    session: str  # "claude-1", "codex-2"
    turn: int
    path: str
    headers: dict[str, str]
    body: str
    answer: str  # the captured answer's text (its deltas), to tell a replay's answer apart
    prompt: int  # its prompt's tokens and its answer's, as the capture's usage said
    output: int

    @classmethod
    def of(cls, session: str, turn: int, x: Exchange) -> Request:
        events = x.events()
        text = delta_text(events)
        return cls(session, turn, x.path, x.headers, x.body.decode(), text, *usage_tokens(events))

    def replayed(self) -> str:
        """The body a replay sends: as captured, its answer capped at the captured answer's
        length (+16): a server that ignores the capture's grammar writes no longer answer."""
        body = json.loads(self.body)
        cap = "max_tokens" if self.path.startswith("/v1/messages") else "max_output_tokens"
        body[cap] = self.output + 16
        return json.dumps(body)


def usage_tokens(events: list[dict[str, Any]]) -> tuple[int, int]:
    """A streamed answer's prompt and output tokens, from its usage (Anthropic's message
    events, or Responses' `response.completed`); 0 when it carries none."""
    n_in = n_out = 0
    for e in events:
        usage = e.get("usage") or (e.get("message") or {}).get("usage")
        if e.get("type") == "response.completed":
            usage = e["response"].get("usage")
        if isinstance(usage, dict):
            fields = ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")
            n_in = max(n_in, sum(int(usage.get(f) or 0) for f in fields))
            n_out = max(n_out, int(usage.get("output_tokens") or 0))
    return n_in, n_out


def delta_text(events: list[dict[str, Any]]) -> str:
    """An answer's text as its stream's deltas carry it (text, tool-call arguments), in
    Anthropic's and OpenAI Responses' events alike."""
    out = []
    for e in events:
        d = e.get("delta")
        if isinstance(d, str):
            out.append(d)
        elif isinstance(d, dict):
            out.append(str(d.get("text") or d.get("partial_json") or ""))
    return "".join(out)


def capture(a: argparse.Namespace) -> list[list[list[Request]]]:
    """Each session's turns' requests: from the cache when it has this shape, else taken from
    the real clients against a fresh kvswap (and cached)."""
    shape = f"claude-{CLAUDE_CODE_VERSION}-codex-{CODEX_VERSION}-{a.sessions}x{a.turns}"
    path = cache_root() / "bench-coding" / f"{shape}.json"
    if path.exists() and not a.recapture:
        print(f"captured sessions: {path} (--recapture takes them again)", flush=True)
        raw = json.loads(path.read_text())
        return [[[Request(**r) for r in turn] for turn in s] for s in raw]
    sessions = []
    with (
        tempfile.TemporaryDirectory(prefix="bench-coding-") as home,
        BenchServer(_flags(a, [])) as server,
    ):
        for s in range(a.sessions):
            name = f"{'claude' if s % 2 == 0 else 'codex'}-{s // 2 + 1}"
            t0 = time.monotonic()
            turns = _drive(server.url, Path(home) / name, s, a.turns)
            sessions.append([[Request.of(name, t, x) for x in xs] for t, xs in enumerate(turns)])
            print(f"captured {name}: {a.turns} turns in {time.monotonic() - t0:.0f} s", flush=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps([[[asdict(r) for r in turn] for turn in s] for s in sessions]))
    return sessions


def _drive(url: str, home: Path, s: int, turns: int) -> list[list[Exchange]]:
    if s % 2 == 0:
        topic = CLAUDE_TOPICS[(s // 2) % len(CLAUDE_TOPICS)]
        asks = [CLAUDE_ASKS[0].format(topic), *CLAUDE_ASKS[1:]]
        return claude_turns(url, home, [asks[t % len(asks)] for t in range(turns)])
    asks = [f"{CODEX_ASKS[0]} (session {s // 2 + 1})", *CODEX_ASKS[1:]]
    return codex_turns(url, home, [asks[t % len(asks)] for t in range(turns)])


def _flags(a: argparse.Namespace, way: list[str]) -> list[str]:
    threads = ["-t", str(a.threads), "-tb", str(a.threads)]
    return ["-m", a.model, *YARN_16K, *threads, "--metrics", *way]


def budget_bytes(a: argparse.Namespace, sessions: list[list[list[Request]]]) -> int:
    """A RAM budget that holds two of the sessions' minds at their largest, not three
    (`--page-ram-mib` overrides): 2.2 times the largest request's tokens (the capture's usage)
    times the model's KV bytes per token."""
    if a.page_ram_mib:
        return int(a.page_ram_mib) << 20
    largest = max(r.prompt + r.output for s in sessions for turn in s for r in turn)
    return largest * kv_bytes_per_token(a.model) * 22 // 10


def replay(
    way: str, binary: str | None, a: argparse.Namespace, sessions: list[list[list[Request]]]
) -> list[Sample]:
    """Every session's requests, turn by turn, on a fresh server of `way`."""
    budget = budget_bytes(a, sessions)
    with tempfile.TemporaryDirectory(prefix="bench-coding-") as save:
        if binary is None:
            extra = ["--page-ram-bytes", str(budget), "--slot-save-path", save]
        else:
            extra = ["--cache-ram", str(budget >> 20), "--slot-save-path", save]
        with BenchServer(_flags(a, extra), binary=binary) as server:
            samples = []
            for t in range(a.turns):
                for s in sessions:
                    for i, r in enumerate(s[t] if t < len(s) else []):
                        if r.path.split("?")[0] in REPLAYED:
                            samples.append(_send(way, server.url, r, i))
            return samples


def _counters(url: str) -> tuple[int, int]:
    """The server's prompt tokens prefilled and read from cache so far (`/metrics`; a new
    connection: llama-server closes a stream's)."""
    values = {}
    for line in httpx.get(url + "/metrics", timeout=60).text.splitlines():
        for name in ("prompt_tokens_total", "prompt_tokens_cached_total"):
            if line.startswith(f"llamacpp:{name} "):
                values[name] = int(float(line.split()[1]))
    return values.get("prompt_tokens_total", 0), values.get("prompt_tokens_cached_total", 0)


def _send(way: str, url: str, r: Request, index: int) -> Sample:
    prefilled0, cached0 = _counters(url)
    t0 = time.perf_counter()
    ttft = 0.0
    events: list[dict[str, Any]] = []
    body = r.replayed()
    with httpx.stream("POST", url + r.path, content=body, headers=r.headers, timeout=3600) as resp:
        for line in resp.iter_lines():
            if not line.startswith("data:"):
                continue
            if not ttft and '"delta"' in line:
                ttft = time.perf_counter() - t0
            with contextlib.suppress(ValueError):  # [DONE]
                events.append(json.loads(line[5:]))
        status = resp.status_code
    wall = time.perf_counter() - t0
    prefilled, cached = _counters(url)
    answer = delta_text(events)
    return Sample(
        way, r.session, r.turn, index, status, prefilled - prefilled0, cached - cached0,
        ttft * 1e3, wall * 1e3, answer == r.answer,
    )  # fmt: skip


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="kvswap bench coding",
        description="Claude Code and Codex sessions captured from the real clients and replayed "
        "against kvswap and llama-server, sharing one slot.",
    )
    p.add_argument("--model", default=str(default_model_path()))
    p.add_argument("--sessions", type=int, default=4, help="sessions (Claude Code, Codex, ...)")
    p.add_argument("--turns", type=int, default=10, help="turns a session")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    p.add_argument("--page-ram-mib", type=int, default=0, help="the RAM budget (default: 2 minds)")
    p.add_argument("--llama-server", default="", help="the pinned llama-server binary")
    p.add_argument("--recapture", action="store_true", help="take the sessions again")
    p.add_argument("--out", default="", help="a folder for bench-coding.md")
    a = p.parse_args(argv)
    sessions = capture(a)
    before = uptime()
    results = replay("kvswap", None, a, sessions)
    if a.llama_server:
        results += replay("llama-server", a.llama_server, a, sessions)
    lines = report(results, a, f"{before} before, {uptime()} after")
    print("\n".join(lines))
    if a.out:
        Path(a.out, "bench-coding.md").write_text("\n".join(lines) + "\n")
    return 0
