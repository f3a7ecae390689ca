"""`kvswap bench stateful`: a returning conversation's TTFT with server-kept state against a full
re-send, on the same engine, and against llama-server.

N agents (default 8) each hold a chain of T turns (default 20); each turn adds one user message
of about W tokens and asks for a few greedy tokens, streamed through POST /v1/responses. The
ways, one after the other, each on a fresh server with the same RAM budget:
- `kvswap stored`: each request carries only `previous_response_id` and its new message;
- `kvswap re-send`: each request carries the whole conversation (`store: false`), naming the
  agent's mind (`X-Mind-Id`), kvswap's best case for a client that re-sends;
- `llama-server re-send` (`--llama-server BIN`): the same bodies; its prompt cache
  (`--cache-ram`, set to kvswap's `--page-ram-bytes`) finds what it can. With
  `--llama-server-from T` it joins at turn T, each chain's earlier exchanges taken from the
  first way's: its re-send of a long chain (`--long` to 32k) for scale, without the hours of
  re-prefilling every turn before it;
- `kvswap resident`: the stored requests on a server with a slot for each agent, so no mind
  ever leaves its slot: the stored turn's floor (the new message's prefill over the history).
Every way's server runs at once and the ways play side by side: each agent's turn is sent to
every way, one after the other (the order rotating from one turn to the next), so a drift in the
machine's load falls on every way alike and each stored turn has its floor measured beside it.
One client plays the agents round robin, so every returning turn finds its mind out of its slot
(8 agents, 2 slots), in RAM or on disk past `--page-ram-bytes`. Per turn: TTFT (to the first
output delta), the request's bytes, the server's CPU time over the request, the tokens it
prefilled, and on kvswap what the server measured (`/metrics`): its prefill, the milliseconds it
spent moving minds for it (the engine's switches, reads from disk, restores) and the request's
wait for room to start. `stateful_report` writes the table, the targets and the plot.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from contextlib import ExitStack
from typing import Any

import httpx

from kvswap.bench.minds_script import Probe, kvswap_probe
from kvswap.bench.progress import progress
from kvswap.bench.server import BenchServer, process_cpu_s
from kvswap.bench.stateful_report import WAYS, ByWay, TurnFigures, report
from kvswap.models import default_model_path


def message(agent: int, turn: int, n_tokens: int) -> str:
    """A new user message of about `n_tokens` tokens, different for every agent and turn."""
    facts = " ".join(
        f"Note {turn}.{i} of agent {agent}: item {agent * 1000 + turn * 31 + i} costs "
        f"{(agent + 3) * (i + 7) % 97} coins."
        for i in range(max(1, n_tokens // 24))
    )
    return f"{facts} Which item costs the most? Answer briefly."


class Agents:
    """Plays the chains of every agent against one server, one way, a turn at a time."""

    def __init__(self, server: BenchServer, a: argparse.Namespace, way: str) -> None:
        self.server, self.a, self.way = server, a, way
        self.stored = way in (WAYS[0], WAYS[3])  # the resident way's requests are stored too
        self.previous: dict[int, str | None] = dict.fromkeys(range(a.agents))
        self.history: dict[int, list[dict[str, str]]] = {m: [] for m in range(a.agents)}
        self.figures: list[TurnFigures] = []
        self.moves: Probe | None = kvswap_probe(server) if way.startswith("kvswap") else None

    def play(self, http: httpx.Client, agent: int, turn: int) -> None:
        self.figures.append(self._turn(http, agent, turn))

    def _body(self, agent: int, text: str) -> tuple[dict[str, Any], dict[str, str]]:
        body: dict[str, Any] = {
            "model": "m",
            "max_output_tokens": self.a.n_predict,
            "temperature": 0,
            "stream": True,
        }
        if self.stored:
            body["input"] = [{"role": "user", "content": text}]
            body["previous_response_id"] = self.previous[agent]
            return body, {}
        body["input"] = [*self.history[agent], {"type": "message", "role": "user", "content": text}]
        if self.way.startswith("kvswap"):
            body["store"] = False
            return body, {"X-Mind-Id": f"agent-{agent}"}
        return body, {}

    def _turn(self, http: httpx.Client, agent: int, turn: int) -> TurnFigures:
        text = message(agent, turn, self.a.message_tokens)
        body, headers = self._body(agent, text)
        # A connection per request, for every way alike: llama-server closes one after a
        # stream, and a reused one then fails.
        headers = {**headers, "Connection": "close"}
        raw = json.dumps(body).encode()
        cpu0, t0 = process_cpu_s(self.server.proc.pid), time.perf_counter()
        ttft_ms, answer, final = 0.0, "", {}
        with http.stream("POST", "/v1/responses", content=raw, headers=headers) as resp:
            if resp.status_code != 200:
                resp.read()
                error = resp.text[:200]
                return TurnFigures(self.way, agent, turn, 0, 0, len(raw), 0, 0, 0, error=error)
            for line in resp.iter_lines():
                if not line.startswith("data: "):
                    continue
                event = json.loads(line[len("data: ") :])
                if event.get("type") == "response.output_text.delta" and not ttft_ms:
                    ttft_ms = (time.perf_counter() - t0) * 1e3
                if event.get("type") == "response.output_text.delta":
                    answer += event.get("delta", "")
                if event.get("type") in ("response.completed", "response.incomplete"):
                    final = event["response"]
        total_ms = (time.perf_counter() - t0) * 1e3
        cpu_ms = (process_cpu_s(self.server.proc.pid) - cpu0) * 1e3
        parts = self.moves() if self.moves else {}
        moved_ms = sum(parts.get(k, 0.0) for k in ("switch", "read", "restore"))
        usage = final.get("usage") or {}
        n_prompt = int(usage.get("input_tokens", 0))
        cached = int((usage.get("input_tokens_details") or {}).get("cached_tokens", 0))
        self.previous[agent] = final.get("id")
        self.history[agent] += [  # typed items: llama-server needs `type` on an answer
            {"type": "message", "role": "user", "content": text},
            {"type": "message", "role": "assistant", "content": answer},
        ]
        return TurnFigures(
            self.way, agent, turn, ttft_ms or total_ms, total_ms, len(raw), cpu_ms,
            n_prompt, n_prompt - cached, moved_ms, parts.get("wait", 0.0),
            parts.get("prefill", 0.0),
        )  # fmt: skip


def _model(a: argparse.Namespace) -> str:
    if a.model:
        return str(a.model)
    if not a.long:
        return str(default_model_path())
    from kvswap.tiny import realistic_kv_params, tiny_model_path

    params = realistic_kv_params("smollm2-135m")  # SmolLM2's KV bytes per token
    # A slot's window is padded to 256 cells: one past the training context would be
    # YaRN-extended, which llama-server would cap instead.
    params["n_ctx_train"] = max(params["n_ctx_train"], -(-a.ctx_slot // 256) * 256)
    return str(tiny_model_path("llama", clean_text=True, **params))


def _args(a: argparse.Namespace, model: str, way: str, save: str) -> list[str]:
    slots = a.agents if way == WAYS[3] else a.slots  # a slot each: no mind ever leaves its slot
    common = ["-m", model, "-c", str(a.ctx_slot * slots), "-np", str(slots)]
    common += ["-t", str(a.threads), "-tb", str(a.threads)]
    if way.startswith("llama-server"):
        return [*common, "--cache-ram", str(a.page_ram_mib)]
    save_flags = ["--slot-save-path", save, "--metrics"]
    return [*common, "--page-ram-bytes", f"{a.page_ram_mib}M", *save_flags]


def _joins_late(player: Agents, a: argparse.Namespace) -> bool:
    """llama-server's re-send from turn `--llama-server-from` on, each chain's earlier exchanges
    being the first way's."""
    return player.way == WAYS[2] and a.llama_server_from > 1


def run(a: argparse.Namespace, ways: list[str]) -> ByWay:
    """Every way's server at once; each agent's turn played on every way in a rotating order."""
    model = _model(a)
    with ExitStack() as stack:
        players: list[tuple[Agents, httpx.Client]] = []
        for way in ways:
            save = stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-stateful-"))
            binary = a.llama_server if way.startswith("llama-server") else None
            server = stack.enter_context(BenchServer(_args(a, model, way, save), binary=binary))
            http = stack.enter_context(httpx.Client(base_url=server.url, timeout=3600))
            players.append((Agents(server, a, way), http))
        chains = players[0][0]  # whose chains a llama-server joining late takes up
        step, n_steps = 0, a.agents * a.turns
        for turn in range(a.turns):
            for agent in range(a.agents):
                for k in range(len(players)):
                    player, http = players[(step + k) % len(players)]
                    if _joins_late(player, a) and turn < a.llama_server_from - 1:
                        continue
                    if _joins_late(player, a) and turn == a.llama_server_from - 1:
                        player.history[agent] = chains.history[agent][: 2 * turn]
                    player.play(http, agent, turn)
                step += 1
                progress("stateful", step, n_steps, "turns of every way")
        return {player.way: player.figures for player, _ in players}


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="kvswap bench stateful",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--agents", type=int, default=8, help="chains, played round robin")
    p.add_argument("--turns", type=int, default=20, help="turns of each chain")
    p.add_argument(
        "--message-tokens",
        type=int,
        default=280,
        help="tokens of each new message "
        "(SmolLM2's vocabulary; the --long model's cuts the same text into 1.6x as many)",
    )
    p.add_argument("--n-predict", type=int, default=16, help="greedy tokens a turn")
    p.add_argument("--slots", type=int, default=2, help="-np of every server")
    p.add_argument(
        "--ctx-slot", type=int, default=8192, help="each slot's window (-c = slots x it)"
    )
    p.add_argument("--page-ram-mib", type=int, default=256, help="kvswap's RAM page budget, "
                   "llama-server's --cache-ram")  # fmt: skip
    p.add_argument("-t", "--threads", type=int, default=2, help="-t and -tb of every server")
    p.add_argument("-m", "--model", default=None, help="GGUF model (default: the embedded SmolLM2)")
    p.add_argument("--long", action="store_true", help="a generated model with SmolLM2's KV "
                   "bytes per token (give --ctx-slot and --message-tokens for 32k chains)")  # fmt: skip
    p.add_argument("--llama-server", default="", help="the pinned llama-server binary")
    p.add_argument("--llama-server-from", type=int, default=1, metavar="TURN",
                   help="llama-server re-sends from this turn on, each chain's earlier exchanges "
                   "taken from the first way's (its re-send of a long chain, for scale, without "
                   "re-prefilling every turn before it)")  # fmt: skip
    p.add_argument("--ways", default=",".join((WAYS[0], WAYS[1], WAYS[3])),
                   help="comma-separated ways to run (--llama-server adds llama-server's)")  # fmt: skip
    p.add_argument("--out", default="docs", help="folder for bench-stateful.md and its plot")
    a = p.parse_args(argv)
    ways = [w.strip() for w in a.ways.split(",") if w.strip()]
    unknown = [w for w in ways if w not in WAYS]
    if unknown or not ways:
        p.error(f"--ways: {', '.join(unknown) or 'none'} not among {', '.join(WAYS)}")
    if a.llama_server and WAYS[2] not in ways:
        ways.append(WAYS[2])
    if ways[0] == WAYS[2] and a.llama_server_from > 1:
        p.error("--llama-server-from: the first way plays the chains llama-server takes up")
    if not 1 <= a.llama_server_from <= a.turns:
        p.error(f"--llama-server-from: {a.llama_server_from} is not a turn of 1 to {a.turns}")
    return report(a, argv, run(a, ways))
