"""`kvswap bench minds`: many minds taking turns on few slots, under several strategies in one run.

N minds of about T tokens each take turns for R rounds; each turn adds a user message and
generates a short greedy answer. The same script runs under:
- `reprefill`: kvswap with no paging and no prompt cache: a mind that lost its slot is
  prefilled again from its first token;
- `disk`: kvswap, the client saves the outgoing mind to a slot file and restores the incoming one
  at every switch (`/slots?action=save|restore`);
- `minds`: kvswap's automatic minds (`"mind": NAME`): slot, RAM page or disk, chosen by the server;
- `llama-server` (with `--llama-server BIN`): the pinned llama-server with its automatic
  `--cache-ram` prompt cache.

Per strategy: total time, time spent switching (rounds after the first), tokens prefilled, p50/p95
time to first token (client-measured: all the user waits for), a PNG plot and a markdown report,
and a check that every strategy produced the same text as kvswap's minds.

Switching time of a turn, as each server measures it: the prefill of tokens that a mind keeping
its own slot would have found cached (all of `reprefill`'s switch), plus the state moves:
kvswap's engine time seating the mind (`mind_switch_ms_total`), the save and restore verbs'
own timings (`disk`), llama-server's "prompt cache update took" lines (`-lv 4`). The request
overhead outside prompt, generation and moves (HTTP, tokenizing, JSON) is shown apart.
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvswap.bench.server import BenchServer
from kvswap.models import default_model_path


@dataclass
class Turn:
    mind: int
    round: int
    content: str
    wall_ms: float
    ttft_ms: float
    prompt_n: int
    cache_n: int
    switch_ms: float
    overhead_ms: float  # wall time outside prompt, generation and the server's state moves


@dataclass
class Result:
    strategy: str
    turns: list[Turn] = field(default_factory=list)
    total_s: float = 0.0

    def later(self) -> list[Turn]:
        return [t for t in self.turns if t.round > 0]

    @property
    def switch_s(self) -> float:
        return sum(t.switch_ms for t in self.later()) / 1e3

    @property
    def overhead_s(self) -> float:
        return sum(t.overhead_ms for t in self.later()) / 1e3

    @property
    def n_prefilled(self) -> int:
        return sum(t.prompt_n for t in self.turns)

    def ttft(self, q: float) -> float:
        values = sorted(t.ttft_ms for t in self.later())
        return values[min(len(values) - 1, int(q * len(values)))] if values else 0.0


def _opening(m: int, n_tokens: int) -> str:
    facts = " ".join(
        f"Fact {j} of mind {m}: the {j % 7}th lamp of room {m * 31 + j} is lit."
        for j in range(n_tokens // 20)
    )
    return (
        f"<|im_start|>system\nYou are mind {m}. Remember these facts. {facts}<|im_end|>\n"
        f"<|im_start|>user\nWho are you, in a few words?<|im_end|>\n<|im_start|>assistant\n"
    )


def _follow(prompt: str, content: str, turn: int) -> str:
    return (
        prompt
        + content
        + f"<|im_end|>\n<|im_start|>user\nTell me fact {turn} again, briefly.<|im_end|>\n<|im_start|>assistant\n"
    )


# A strategy's turn: the fields it adds to the request, and the state-move time it measured.
Route = Callable[[int], tuple[dict[str, Any], float]]
# After a turn: the state-move time the server measured since the last call (ms).
Probe = Callable[[], float]


def _no_probe() -> float:
    return 0.0


class Runner:
    """Plays the script against one server; `route` adds the strategy's fields to a turn."""

    def __init__(self, server: BenchServer, args: argparse.Namespace, label: str) -> None:
        self.server = server
        self.args = args
        self.label = label
        self.prompts = {m: _opening(m, args.tokens) for m in range(args.minds)}
        self.n_prompt: dict[int, int] = {}  # the mind's previous prompt length

    def run(self, route: Route, probe: Probe = _no_probe) -> Result:
        a = self.args
        result = Result(self.label)
        t0 = time.perf_counter()
        n_turns = a.minds * a.rounds
        for r in range(a.rounds):
            for m in range(a.minds):
                _progress(self.label, r * a.minds + m, n_turns)
                extra, verb_ms = route(m)
                probe()
                body = {"prompt": self.prompts[m], "n_predict": a.n_predict, "temperature": 0}
                t = time.perf_counter()
                out = self.server.completion({**body, **extra})
                wall_ms = (time.perf_counter() - t) * 1e3
                result.turns.append(self._turn(m, r, out, wall_ms, verb_ms, probe()))
                self.prompts[m] = _follow(self.prompts[m], out["content"], r)
        _progress(self.label, n_turns, n_turns)
        result.total_s = time.perf_counter() - t0
        return result

    def _turn(
        self, m: int, r: int, out: dict[str, Any], wall_ms: float, verb_ms: float, moved_ms: float
    ) -> Turn:
        tm = out["timings"]
        prompt_ms, predicted_ms = float(tm["prompt_ms"]), float(tm["predicted_ms"])
        prompt_n, cache_n = int(tm["prompt_n"]), int(tm.get("cache_n", 0))
        # Tokens a mind in its own slot would have found cached, prefilled again here.
        n_lost = max(0, self.n_prompt.get(m, 0) - cache_n)
        self.n_prompt[m] = prompt_n + cache_n
        per_token_ms = prompt_ms / prompt_n if prompt_n else 0.0
        overhead_ms = max(0.0, wall_ms - prompt_ms - predicted_ms - moved_ms)
        return Turn(
            mind=m,
            round=r,
            content=out["content"],
            wall_ms=wall_ms + verb_ms,
            ttft_ms=wall_ms - predicted_ms + verb_ms,
            prompt_n=prompt_n,
            cache_n=cache_n,
            switch_ms=verb_ms + moved_ms + n_lost * per_token_ms,
            overhead_ms=overhead_ms,
        )


def _progress(label: str, done: int, total: int) -> None:
    width = 30
    filled = width * done // max(1, total)
    end = "\n" if done == total else ""
    print(
        f"\r{label:>13} [{'#' * filled}{'.' * (width - filled)}] {done}/{total} turns",
        end=end,
        file=sys.stderr,
        flush=True,
    )


def _kvswap_args(a: argparse.Namespace, *extra: str) -> list[str]:
    n_ctx_slot = a.tokens + a.rounds * (a.n_predict + 40) + 512
    return [
        "-m", a.model, "-c", str(a.slots * n_ctx_slot), "-np", str(a.slots), "-t", str(a.threads), "-tb", str(a.threads),
        *extra,
    ]  # fmt: skip


def _verb_ms(server: BenchServer, path: str, body: dict[str, Any] | None = None) -> float:
    """Run a slot verb; its own duration as the server reports it (ms)."""
    resp = server.client.post(path, json=body)
    resp.raise_for_status()
    timings: dict[str, float] = resp.json().get("timings", {})
    return float(sum(timings.values()))


def run_reprefill(a: argparse.Namespace) -> Result:
    with BenchServer(_kvswap_args(a, "--cache-ram", "0", "--page-ram-bytes", "0")) as server:
        return Runner(server, a, "reprefill").run(lambda m: ({}, 0.0))


def run_disk(a: argparse.Namespace) -> Result:
    with tempfile.TemporaryDirectory(prefix="kvswap-bench-minds-") as save:
        args = _kvswap_args(a, "--cache-ram", "0", "--slot-save-path", save)
        with BenchServer(args) as server:
            seat: dict[int, int] = {}  # slot -> mind
            used: dict[int, float] = {}
            saved: set[int] = set()

            def route(m: int) -> tuple[dict[str, Any], float]:
                home = next((s for s, mind in seat.items() if mind == m), None)
                if home is not None:
                    used[home] = time.monotonic()
                    return {"id_slot": home}, 0.0
                slot = next((s for s in range(a.slots) if s not in seat), None)
                if slot is None:
                    slot = min(seat, key=lambda s: used[s])
                verb_ms = 0.0
                if slot in seat:
                    body = {"filename": f"mind{seat[slot]}.bin"}
                    verb_ms += _verb_ms(server, f"/slots/{slot}?action=save", body)
                    saved.add(seat[slot])
                if m in saved:
                    body = {"filename": f"mind{m}.bin"}
                    verb_ms += _verb_ms(server, f"/slots/{slot}?action=restore", body)
                else:
                    _verb_ms(server, f"/slots/{slot}?action=erase")
                seat[slot], used[slot] = m, time.monotonic()
                return {"id_slot": slot}, verb_ms

            return Runner(server, a, "disk").run(route)


def run_minds(a: argparse.Namespace) -> Result:
    with tempfile.TemporaryDirectory(prefix="kvswap-bench-minds-") as save:
        args = _kvswap_args(a, "--cache-ram", "0", "--slot-save-path", save, "--metrics")
        if a.page_ram_bytes:
            args += ["--page-ram-bytes", a.page_ram_bytes]
        with BenchServer(args) as server:
            seen = [0.0]

            def probe() -> float:
                text = server.client.get("/metrics").text
                found = re.search(r"^llamacpp:mind_switch_ms_total (\S+)$", text, re.M)
                now = float(found.group(1)) if found else 0.0
                delta, seen[0] = now - seen[0], now
                return delta

            route: Route = lambda m: ({"mind": f"mind-{m}"}, 0.0)  # noqa: E731
            result = Runner(server, a, "minds").run(route, probe)
            result.strategy = "kvswap minds"
            return result


def run_llama_server(a: argparse.Namespace) -> Result:
    n_ctx = int(_kvswap_args(a)[3])
    args = ["-m", a.model, "-c", str(n_ctx), "-np", str(a.slots), "-t", str(a.threads),
            "-tb", str(a.threads), "-lv", "4"]  # fmt: skip
    with BenchServer(args, binary=a.llama_server) as server:
        offset = [0]

        def probe() -> float:
            with open(server.log.name, "rb") as f:
                f.seek(offset[0])
                data = f.read()
            offset[0] += len(data)
            text = data.decode("utf-8", "replace")
            return sum(float(x) for x in re.findall(r"prompt cache update took ([0-9.]+) ms", text))

        return Runner(server, a, "llama-server").run(lambda m: ({}, 0.0), probe)


def _identical(results: list[Result]) -> list[str]:
    """One line per strategy whose text differs from the first strategy's."""
    ref = results[0]
    out = []
    for res in results[1:]:
        for a, b in zip(ref.turns, res.turns, strict=True):
            if a.content != b.content:
                out.append(
                    f"{res.strategy}: first difference at round {b.round}, mind {b.mind}: {b.content!r} vs {a.content!r}"
                )
                break
    return out


def table(results: list[Result]) -> list[str]:
    base = next(r for r in results if r.strategy == "kvswap minds")
    lines = [
        "| strategy | total s | switching s | switching / kvswap minds | request overhead s "
        "| tokens prefilled | TTFT p50 ms | TTFT p95 ms |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        ratio = r.switch_s / base.switch_s if base.switch_s > 0 else float("inf")
        lines.append(
            f"| {r.strategy} | {r.total_s:.1f} | {r.switch_s:.3f} | {ratio:.1f}x | {r.overhead_s:.2f} "
            f"| {r.n_prefilled} | {r.ttft(0.5):.0f} | {r.ttft(0.95):.0f} |"
        )
    return lines


def plot(results: list[Result], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [r.strategy for r in results]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    ax1.bar(names, [max(r.switch_s, 1e-3) for r in results], color="tab:blue")
    ax1.set_yscale("log")
    ax1.set_ylabel("time spent switching (s, log)")
    ax1.set_title("switching, rounds after the first")
    x = range(len(results))
    ax2.bar([i - 0.2 for i in x], [r.ttft(0.5) for r in results], width=0.4, label="p50")
    ax2.bar([i + 0.2 for i in x], [r.ttft(0.95) for r in results], width=0.4, label="p95")
    ax2.set_xticks(list(x), names)
    ax2.set_yscale("log")
    ax2.set_ylabel("time to first token (ms, log)")
    ax2.legend()
    ax2.set_title("time to first token")
    for ax in (ax1, ax2):
        ax.tick_params(axis="x", labelrotation=15)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="kvswap bench minds", description=__doc__.split("\n")[0])
    p.add_argument("--minds", type=int, default=8)
    p.add_argument("--tokens", type=int, default=1000, help="tokens of each mind's opening prompt")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--slots", type=int, default=2)
    p.add_argument("--n-predict", type=int, default=8)
    p.add_argument("-t", "--threads", type=int, default=2)
    p.add_argument("-m", "--model", default=str(default_model_path()))
    p.add_argument(
        "--page-ram-bytes", default="", help="kvswap minds' RAM budget (default: the server's)"
    )
    p.add_argument(
        "--llama-server", default="", help="a llama-server binary of the pinned llama.cpp"
    )
    p.add_argument("--strategies", default="reprefill,disk,minds,llama-server")
    p.add_argument("--out", default="docs", help="folder for bench-minds.png and bench-minds.md")
    a = p.parse_args(argv)
    runs: dict[str, Callable[[argparse.Namespace], Result]] = {
        "minds": run_minds, "reprefill": run_reprefill, "disk": run_disk, "llama-server": run_llama_server,
    }  # fmt: skip
    chosen = [
        s for s in a.strategies.split(",") if s in runs and (s != "llama-server" or a.llama_server)
    ]
    chosen.sort(key=lambda s: s != "minds")  # the reference text comes from kvswap's minds
    results = [runs[s](a) for s in chosen]
    title = f"{a.minds} minds of ~{a.tokens} tokens on {a.slots} slots, {a.rounds} rounds, -t {a.threads}"
    lines = [
        f"# kvswap bench minds: {title}",
        "",
        f"command: `kvswap bench minds {' '.join(argv)}`",
        "",
        *table(results),
        "",
    ]
    diffs = _identical(results)
    lines.append("identical text across strategies: " + ("yes" if not diffs else "NO"))
    lines += [f"- {d}" for d in diffs]
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    plot(results, out / "bench-minds.png", title)
    lines += ["", "![bench minds](bench-minds.png)", ""]
    (out / "bench-minds.md").write_text("\n".join(lines))
    print("\n".join(lines))
    return 0 if not diffs else 1
