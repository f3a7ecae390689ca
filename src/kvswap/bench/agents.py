"""`kvswap bench agents`: an agent workload at the servers' default flags, kvswap against the
pinned llama-server, side by side in one run.

N chat agents (minds), each with a long system prompt of its own, take turns for R rounds from C
concurrent clients (client c serves agents c, c+C, ...); each turn sends the whole conversation
to /v1/chat/completions and asks for a few greedy tokens. Both servers run `-c CTX` with no
other geometry flag: 4 slots sharing one unified KV pool, where 8 agents cannot all stay
resident. The cases (`--cases`):
- `header`: kvswap at its default flags; the agents send `X-Mind-Id: agent-N` (a mind each);
- `key`: kvswap over its RAM budget (`--page-ram-bytes`, a temporary `--slot-save-path`: most
  agents wait on disk); the agents name no mind and send `prompt_cache_key: agent-N` in the
  body, as Codex does, which kvswap turns into a mind;
- `llama-server` (with `--llama-server BIN`): the key case's bodies; it ignores the key and
  finds each agent's prefix itself (its slot similarity and `--cache-ram`).

Per case: the whole run's wall time, failed turns (with their first error), returning turns
that prefilled more than their new tokens (their cache held less than the previous prompt),
tokens prefilled, p50/p95 turn time, the first round's time (every prompt cold: prefill speed),
the p50 of returning turns, and the decodes libllama failed for want of KV cells (its `failed to
find a memory slot` lines in the server's log); then how many times faster kvswap's key case
returns than llama-server, and each case's cold first round against llama-server's. The report
goes to stdout and `--out`/bench-agents.md.
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from kvswap.bench.progress import progress
from kvswap.bench.server import BenchServer
from kvswap.models import default_model_path


@dataclass
class Turn:
    agent: int
    round: int
    status: int
    wall_ms: float
    prompt_n: int = 0
    cache_n: int = 0
    n_before: int = 0  # the agent's previous prompt (what a kept cache holds at least)
    content: str = ""
    error: str = ""

    @property
    def reprefilled(self) -> bool:
        """A returning turn whose cache held less than its previous prompt."""
        return self.status == 200 and self.round > 0 and self.cache_n < self.n_before


@dataclass
class Result:
    server: str
    turns: list[Turn] = field(default_factory=list)
    total_s: float = 0.0
    found: str = "-"  # kvswap: turns that found their mind in a slot/RAM/disk
    n_slot_failures: int = 0  # libllama's "failed to find a memory slot" lines in the log

    @property
    def failed(self) -> list[Turn]:
        return [t for t in self.turns if t.status != 200]

    def wall(self, q: float) -> float:
        return _quantile([t.wall_ms for t in self.turns], q)

    def first_round_s(self) -> float:
        """The first round's turn times added up: every prompt cold, so prefill speed."""
        return sum(t.wall_ms for t in self.turns if t.round == 0) / 1e3

    def returning_p50(self) -> float:
        """The median time of a returning turn (an agent's second turn on)."""
        return _quantile([t.wall_ms for t in self.turns if t.round > 0 and t.status == 200], 0.5)


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def system_prompt(agent: int, n_tokens: int) -> str:
    """An agent's instructions: about `n_tokens` tokens of SmolLM2's vocabulary."""
    rules = " ".join(
        f"Rule {j}: when asked about ticket {agent * 100 + j}, answer with code {j * 37 % 101}."
        for j in range(n_tokens // 22)
    )
    return f"You are support agent {agent}. Follow these rules. {rules}"


@dataclass(frozen=True)
class Case:
    """One server run: its label, the binary (None: kvswap), how agents name themselves
    (`header`: X-Mind-Id; `key`: the body's prompt_cache_key), and flags beyond the defaults."""

    label: str
    binary: str | None
    naming: str
    flags: tuple[str, ...] = ()


def cases(a: argparse.Namespace) -> list[Case]:
    out = []
    if "header" in a.cases:
        out.append(Case("kvswap, X-Mind-Id", None, "header"))
    if "key" in a.cases:
        ram = ("--page-ram-bytes", a.page_ram_bytes)
        out.append(Case(f"kvswap, prompt_cache_key, {a.page_ram_bytes} RAM", None, "key", ram))
    if a.llama_server:
        out.append(Case("llama-server", a.llama_server, "key"))
    return out


class Agents:
    """Plays the workload against one server, from several client threads."""

    def __init__(self, server: BenchServer, a: argparse.Namespace, case: Case):
        self.server, self.a, self.case, self.label = server, a, case, case.label
        self.lock = threading.Lock()
        self.result = Result(case.label)
        self.n_done = 0

    def run(self) -> Result:
        a = self.a
        clients = [
            threading.Thread(target=self._client, args=(c,), name=f"bench-client-{c}")
            for c in range(a.clients)
        ]
        t0 = time.perf_counter()
        for c in clients:
            c.start()
        for c in clients:
            c.join()
        self.result.total_s = time.perf_counter() - t0
        self.result.turns.sort(key=lambda t: (t.round, t.agent))
        return self.result

    def _client(self, c: int) -> None:
        a = self.a
        agents = list(range(c, a.agents, a.clients))
        messages = {
            m: [{"role": "system", "content": system_prompt(m, a.system_tokens)}] for m in agents
        }
        n_prompt = dict.fromkeys(agents, 0)
        with httpx.Client(base_url=self.server.url, timeout=3600) as http:
            for r in range(a.rounds):
                for m in agents:
                    messages[m].append({"role": "user", "content": f"Ticket {m * 100 + r}?"})
                    turn = self._turn(http, m, r, messages[m], n_prompt[m])
                    if turn.status == 200:
                        n_prompt[m] = turn.prompt_n + turn.cache_n
                        messages[m].append({"role": "assistant", "content": turn.content})
                    else:
                        messages[m].pop()  # the client retries that question next round
                    with self.lock:
                        self.result.turns.append(turn)
                        self.n_done += 1
                        progress(self.label, self.n_done, a.agents * a.rounds, "turns")

    def _turn(
        self, http: httpx.Client, m: int, r: int, messages: list[dict[str, str]], n_before: int
    ) -> Turn:
        body: dict[str, Any] = {"messages": messages, "max_tokens": self.a.n_predict}
        body["temperature"] = 0
        headers = {}
        if self.case.naming == "header":
            headers["X-Mind-Id"] = f"agent-{m}"
        else:
            body["prompt_cache_key"] = f"agent-{m}"
        t = time.perf_counter()
        resp = http.post("/v1/chat/completions", json=body, headers=headers)
        wall_ms = (time.perf_counter() - t) * 1e3
        if resp.status_code != 200:
            return Turn(m, r, resp.status_code, wall_ms, n_before=n_before, error=resp.text[:200])
        out: dict[str, Any] = resp.json()
        tm = out.get("timings", {})
        return Turn(
            m, r, 200, wall_ms,
            prompt_n=int(tm.get("prompt_n", 0)), cache_n=int(tm.get("cache_n", 0)),
            n_before=n_before, content=out["choices"][0]["message"].get("content") or "",
        )  # fmt: skip


def _server_args(a: argparse.Namespace) -> list[str]:
    """The default flags: the model, the pool, the threads; nothing else."""
    return ["-m", a.model, "-c", str(a.ctx), "-t", str(a.threads), "-tb", str(a.threads)]


def run(a: argparse.Namespace, case: Case) -> Result:
    with tempfile.TemporaryDirectory(prefix="bench-agents-") as save:
        flags = [*case.flags, "--slot-save-path", save] if case.flags else []
        if case.binary is None:
            flags.append("--metrics")  # where the returning minds were found
        with BenchServer(_server_args(a) + flags, binary=case.binary) as server:
            result = Agents(server, a, case).run()
            if case.binary is None:
                result.found = _found(server.client.get("/metrics").text)
            log = Path(server.log.name).read_text(errors="replace")
        result.n_slot_failures = log.count(SLOT_FAILURE)
        return result


SLOT_FAILURE = "failed to find a memory slot"  # libllama: a decode found no free KV cells


def _found(metrics: str) -> str:
    """kvswap's mind hits by tier (slot/RAM/disk) from its /metrics text."""
    counts = {}
    for line in metrics.splitlines():
        for tier in ("slot", "ram", "disk"):
            if line.startswith(f"llamacpp:mind_hits_{tier}_total "):
                counts[tier] = int(float(line.split()[1]))
    return "/".join(str(counts.get(t, 0)) for t in ("slot", "ram", "disk"))


def table(results: list[Result]) -> list[str]:
    lines = [
        "| case | total s | failed turns | returning turns re-prefilled | tokens prefilled "
        "| turn p50 ms | turn p95 ms | first round s | returning turn p50 ms "
        f"| mind found in slot/RAM/disk | '{SLOT_FAILURE}' |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        n_turns, n_back = len(r.turns), sum(t.round > 0 for t in r.turns)
        n_re = sum(t.reprefilled for t in r.turns)
        lines.append(
            f"| {r.server} | {r.total_s:.1f} | {len(r.failed)} of {n_turns} | {n_re} of {n_back} "
            f"| {sum(t.prompt_n for t in r.turns)} | {r.wall(0.5):.0f} | {r.wall(0.95):.0f} "
            f"| {r.first_round_s():.1f} | {r.returning_p50():.0f} | {r.found} "
            f"| {r.n_slot_failures} |"
        )
    return lines


def speedup(results: list[Result], cases_run: list[Case]) -> list[str]:
    """How many times faster the key case's returning turns are than llama-server's (p50)."""
    by_label = {c.label: c for c in cases_run}
    key = next((r for r in results if by_label[r.server].naming == "key"), None)
    other = next((r for r in results if by_label[r.server].binary is not None), None)
    if key is None or other is None or key.returning_p50() <= 0:
        return []
    ratio = other.returning_p50() / key.returning_p50()
    lines = [
        "",
        f"Returning turns (p50): {key.server} {key.returning_p50():.0f} ms, {other.server} "
        f"{other.returning_p50():.0f} ms: {ratio:.1f}x faster.",
    ]
    for r in results:  # the cold first round: prefill speed, llama-server's over each case's
        if by_label[r.server].binary is None and r.first_round_s() > 0:
            cold = other.first_round_s() / r.first_round_s()
            lines.append(
                f"First round (cold prompts): {r.server} {r.first_round_s():.1f} s, "
                f"{other.server} {other.first_round_s():.1f} s: x{cold:.3f} (above 1: kvswap faster)."
            )
    return lines


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="kvswap bench agents",
        description="Chat agents with long system prompts at the default flags, kvswap against llama-server.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--agents", type=int, default=8, help="chat agents (one mind each)")
    p.add_argument("--system-tokens", type=int, default=1800, help="tokens of each system prompt")
    p.add_argument("--rounds", type=int, default=3, help="turns of each agent")
    p.add_argument("--clients", type=int, default=2, help="concurrent clients")
    p.add_argument("--n-predict", type=int, default=8, help="greedy tokens a turn")
    p.add_argument("--ctx", type=int, default=4096, help="-c of both servers (the KV pool)")
    p.add_argument("-t", "--threads", type=int, default=2, help="-t and -tb of both servers")
    p.add_argument("-m", "--model", default=str(default_model_path()), help="the GGUF model")
    p.add_argument("--llama-server", default="", help="the pinned llama-server binary")
    p.add_argument(
        "--cases",
        default="header,key",
        help="kvswap's cases: header (X-Mind-Id), key (prompt_cache_key over the RAM budget)",
    )
    p.add_argument("--page-ram-bytes", default="64M", help="kvswap's RAM budget in the key case")
    p.add_argument("--out", default="docs", help="folder for bench-agents.md")
    a = p.parse_args(argv)
    a.cases = {c.strip() for c in a.cases.split(",") if c.strip()}
    if not a.cases <= {"header", "key"}:
        p.error(f"--cases: header and/or key, not {sorted(a.cases)}")
    cases_run = cases(a)
    results = [run(a, case) for case in cases_run]
    title = (
        f"{a.agents} chat agents, ~{a.system_tokens}-token system prompts, {a.rounds} rounds, "
        f"{a.clients} clients, {a.n_predict} tokens a turn, -c {a.ctx} -t {a.threads}"
    )
    lines = [
        f"# kvswap bench agents: {title}",
        "",
        f"command: `kvswap bench agents {' '.join(argv)}`",
        "",
    ]
    lines += table(results) + speedup(results, cases_run)
    for r in results:
        if r.failed:
            lines.append(f"- {r.server}: first failure: {r.failed[0].error}")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench-agents.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    ours = [r for r, c in zip(results, cases_run, strict=True) if c.binary is None]
    bad = any(r.failed or any(t.reprefilled for t in r.turns) for r in ours)
    return 1 if bad else 0
