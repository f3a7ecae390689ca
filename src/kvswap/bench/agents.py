"""`kvswap bench agents`: an agent workload at the servers' default flags, kvswap against the
pinned llama-server, side by side in one run.

N chat agents (minds), each with a long system prompt of its own, take turns for R rounds from C
concurrent clients (client c serves agents c, c+C, ...); each turn sends the whole conversation
to /v1/chat/completions and asks for a few greedy tokens. kvswap gets `X-Mind-Id: agent-N` (a
mind per agent); llama-server gets the same bodies without the header and finds each agent's
prefix itself (its slot similarity and `--cache-ram`). Both run `-c CTX` with no other geometry
flag: 4 slots sharing one unified KV pool, where 8 agents cannot all stay resident.

Per server: the whole run's wall time; the first round (every prompt cold: a plain prefill of
each agent's system prompt, so its time is prefill speed) apart from the returning turns (the
cache a server kept for each agent), each as the sum of its turns' times and their p50; failed
turns (with their first error), returning turns that prefilled more than their new tokens (their
cache held less than the previous prompt), tokens prefilled, and the decodes libllama failed for
want of KV cells (its `failed to find a memory slot` lines in the server's log). Then each
figure of kvswap's over llama-server's (above 1: kvswap took less time). The report goes to
stdout and `--out`/bench-agents.md.
"""

from __future__ import annotations

import argparse
import os
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
    n_slot_failures: int = 0  # libllama's "failed to find a memory slot" lines in the log

    @property
    def failed(self) -> list[Turn]:
        return [t for t in self.turns if t.status != 200]

    def first(self) -> list[Turn]:
        """The first round: every prompt cold."""
        return [t for t in self.turns if t.round == 0]

    def returning(self) -> list[Turn]:
        return [t for t in self.turns if t.round > 0]

    def wall(self, q: float, turns: list[Turn] | None = None) -> float:
        values = sorted(t.wall_ms for t in (self.turns if turns is None else turns))
        return values[min(len(values) - 1, int(q * len(values)))] if values else 0.0


def sum_s(turns: list[Turn]) -> float:
    """The turns' times added up (what every agent waited, in all)."""
    return sum(t.wall_ms for t in turns) / 1e3


def system_prompt(agent: int, n_tokens: int) -> str:
    """An agent's instructions: about `n_tokens` tokens of SmolLM2's vocabulary."""
    rules = " ".join(
        f"Rule {j}: when asked about ticket {agent * 100 + j}, answer with code {j * 37 % 101}."
        for j in range(n_tokens // 22)
    )
    return f"You are support agent {agent}. Follow these rules. {rules}"


class Agents:
    """Plays the workload against one server, from several client threads."""

    def __init__(self, server: BenchServer, a: argparse.Namespace, label: str, header: bool):
        self.server, self.a, self.label, self.header = server, a, label, header
        self.lock = threading.Lock()
        self.result = Result(label)
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
        body = {"messages": messages, "max_tokens": self.a.n_predict, "temperature": 0}
        headers = {"X-Mind-Id": f"agent-{m}"} if self.header else {}
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


SLOT_FAILURE = "failed to find a memory slot"  # libllama: a decode found no free KV cells


def run(a: argparse.Namespace, binary: str | None) -> Result:
    label = "llama-server" if binary else "kvswap"
    with BenchServer(_server_args(a), binary=binary) as server:
        result = Agents(server, a, label, header=binary is None).run()
        log = Path(server.log.name).read_text(errors="replace")
    result.n_slot_failures = log.count(SLOT_FAILURE)
    return result


def table(results: list[Result]) -> list[str]:
    lines = [
        "| server | total s | first round s | first round p50 ms | returning turns s "
        "| returning p50 ms | returning p95 ms | failed turns | returning turns re-prefilled "
        f"| tokens prefilled | '{SLOT_FAILURE}' |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        first, back = r.first(), r.returning()
        n_re = sum(t.reprefilled for t in r.turns)
        lines.append(
            f"| {r.server} | {r.total_s:.1f} | {sum_s(first):.1f} | {r.wall(0.5, first):.0f} "
            f"| {sum_s(back):.1f} | {r.wall(0.5, back):.0f} | {r.wall(0.95, back):.0f} "
            f"| {len(r.failed)} of {len(r.turns)} | {n_re} of {len(back)} "
            f"| {sum(t.prompt_n for t in r.turns)} | {r.n_slot_failures} |"
        )
    return lines


def ratio_lines(kvswap: Result, llama: Result) -> list[str]:
    """llama-server's time over kvswap's (above 1: kvswap took less)."""

    def ratio(theirs: float, ours: float) -> str:
        return f"{theirs / ours:.3f}" if ours > 0 else "-"

    first, back = (kvswap.first(), llama.first()), (kvswap.returning(), llama.returning())
    return [
        "| kvswap vs llama-server | first round | returning turns | total |",
        "|---|---|---|---|",
        f"| time (llama-server / kvswap) | {ratio(sum_s(first[1]), sum_s(first[0]))} "
        f"| {ratio(sum_s(back[1]), sum_s(back[0]))} | {ratio(llama.total_s, kvswap.total_s)} |",
    ]


def _load() -> str:
    return ", ".join(f"{x:.2f}" for x in os.getloadavg())


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
    p.add_argument("--out", default="docs", help="folder for bench-agents.md")
    a = p.parse_args(argv)
    load_start = _load()
    results = [run(a, None)]
    if a.llama_server:
        results.append(run(a, a.llama_server))
    title = (
        f"{a.agents} chat agents, ~{a.system_tokens}-token system prompts, {a.rounds} rounds, "
        f"{a.clients} clients, {a.n_predict} tokens a turn, -c {a.ctx} -t {a.threads}"
    )
    lines = [
        f"# kvswap bench agents: {title}",
        "",
        f"command: `kvswap bench agents {' '.join(argv)}`",
        "",
        f"load average at the start: {load_start}; at the end: {_load()}",
        "",
    ]
    lines += table(results)
    if len(results) == 2:
        lines += ["", *ratio_lines(results[0], results[1])]
    for r in results:
        if r.failed:
            lines.append(f"- {r.server}: first failure: {r.failed[0].error}")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench-agents.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    kvswap = results[0]
    ok = not kvswap.failed and not kvswap.n_slot_failures
    return 0 if ok and not any(t.reprefilled for t in kvswap.turns) else 1
