"""`kvswap bench stalls`: the worst gap in a stream while other work runs beside it, side by side
in one run against another checkout of kvswap (`--baseline-src`), so that a before/after figure
shares the machine's load.

Case `cache`: a stream decodes on slot 0 while an anonymous client rotates long prompts (already
cached) through slot 1, so every turn saves the slot's state into the anonymous cache and pages
the next cached state in: the engine thread copies twice per turn, and the question is whether it
also faults fresh memory in (it should not: the cache saves into buffers prepared ahead). It runs
a generated model with SmolLM2's KV bytes per token (`--kv-like`), so a step costs about a
millisecond and a stall of the engine thread stands out of the stream's gaps.

Case `loop`: a stream decodes while another client sends a 100k-token conversation to
/v1/chat/completions (refused as larger than the context after it is rendered and tokenized):
the question is whether that work blocks the event loop, and so every stream's events.

Each reports the stream's median gap and its worst gap while the other work runs.
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kvswap.bench.server import BenchServer


@dataclass(frozen=True)
class Gaps:
    median_ms: float  # the stream's, over its whole run
    p90_ms: float  # while the work ran
    worst_ms: float  # while the work ran
    n_events: int  # while the work ran
    note: str = ""


def _stream(
    server: BenchServer, stamps: list[float], started: threading.Event, stop: threading.Event
) -> None:
    body = {"prompt": "Once upon a time", "n_predict": -1, "ignore_eos": True, "stream": True,
            "id_slot": 0, "temperature": 0}  # fmt: skip
    with server.client.stream("POST", "/completion", json=body) as resp:
        for line in resp.iter_lines():
            if stop.is_set():
                return  # hanging up cancels the request
            if line.startswith("data: "):
                stamps.append(time.monotonic())
                if len(stamps) == 20:
                    started.set()


def _measure(server: BenchServer, work: Callable[[], None]) -> Gaps:
    """Stream on slot 0; once it runs, do `work` (in this thread); the gaps while it ran."""
    stamps: list[float] = []
    started, stop = threading.Event(), threading.Event()
    t = threading.Thread(target=_stream, args=(server, stamps, started, stop))
    t.start()
    if not started.wait(300):
        raise RuntimeError("the stream did not start")
    a = time.monotonic()
    work()
    b = time.monotonic()
    stop.set()
    t.join()
    gaps = [y - x for x, y in itertools.pairwise(stamps)]
    inside = [y - x for x, y in itertools.pairwise(stamps) if y >= a and x <= b]
    if len(inside) < 2:
        raise RuntimeError("the stream ended before the work did (a window too small)")
    p90 = statistics.quantiles(inside, n=10)[-1]
    return Gaps(statistics.median(gaps) * 1e3, p90 * 1e3, max(inside) * 1e3, len(inside))


def _metric(server: BenchServer, name: str) -> float:
    for line in server.client.get("/metrics").text.splitlines():
        if line.startswith(f"llamacpp:{name} "):
            return float(line.split()[1])
    return float("nan")


def _tokens(server: BenchServer, n: int, tag: str) -> list[int]:
    text = " ".join(f"{tag}{j} is true." for j in range(n))
    out: list[int] = server.client.post("/tokenize", json={"content": text}).json()["tokens"]
    return out[:n]


def cache_case(server: BenchServer, n_tokens: int, n_turns: int) -> Gaps:
    prompts = [_tokens(server, n_tokens, tag) for tag in ("alpha", "beta", "gamma")]
    for p in prompts * 2:  # each is prefilled once, saved to the cache by the next; then warm
        server.completion({"prompt": p, "n_predict": 1, "id_slot": 1})

    def rotate() -> None:
        for i in range(n_turns):
            server.completion({"prompt": prompts[i % 3], "n_predict": 1, "id_slot": 1})

    gaps = _measure(server, rotate)
    note = (
        f"{_metric(server, 'anon_cache_hits_total'):.0f} cache hits, "
        f"{_metric(server, 'anon_cache_saved_total'):.0f} saves, "
        f"{_metric(server, 'anon_cache_skipped_total'):.0f} skipped"
    )
    return Gaps(gaps.median_ms, gaps.p90_ms, gaps.worst_ms, gaps.n_events, note)


def loop_case(server: BenchServer, n_tokens: int) -> Gaps:
    words = " ".join(f"word{j}" for j in range(n_tokens // 2))
    messages = [{"role": "user", "content": words}]

    def send() -> None:
        for _ in range(3):
            resp = server.client.post("/v1/chat/completions", json={"messages": messages})
            if resp.status_code != 400:
                raise RuntimeError(f"expected a 400 (too long), got {resp.status_code}")

    return _measure(server, send)


def _cache_model(n_tokens: int) -> str:
    from kvswap.tiny import realistic_kv_params, tiny_model_path

    params = realistic_kv_params("smollm2-135m")
    params["n_ctx_train"] = max(params["n_ctx_train"], 2 * n_tokens + 1024)
    return str(tiny_model_path("llama", **params))


def run_case(case: str, src: str | None, model: str | None, args: argparse.Namespace) -> Gaps:
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = os.path.join(src, "src")
    flags = ["-t", str(args.threads), "-tb", str(args.threads), "-ub", "64", "--metrics"]
    if case == "cache" and model is None:
        model = _cache_model(args.cache_tokens)
    if model:
        flags = ["-m", model, *flags]
    if case == "cache":
        n_ctx = 2 * (args.cache_tokens + 256)
        flags += ["-c", str(n_ctx), "-np", "2", "--cache-ram", "2048", "--page-ram-bytes", "2G"]
    else:
        flags += ["-c", "8192", "-np", "2"]
    with BenchServer(flags, env=env) as server:
        if case == "cache":
            return cache_case(server, args.cache_tokens, args.turns)
        return loop_case(server, args.loop_tokens)


def main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(
        prog="kvswap bench stalls",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "-m",
        "--model",
        default=None,
        help="GGUF model (default: SmolLM2; for case cache, a generated one with its KV size)",
    )
    p.add_argument("-t", "--threads", type=int, default=1)
    p.add_argument("--cases", default="cache,loop")
    p.add_argument("--cache-tokens", type=int, default=4000, help="each rotated prompt's tokens")
    p.add_argument("--turns", type=int, default=30, help="rotations in case cache")
    p.add_argument("--loop-tokens", type=int, default=100_000, help="the conversation's tokens")
    p.add_argument(
        "--baseline-src", default=None, help="another kvswap checkout, measured first (before)"
    )
    p.add_argument("--rounds", type=int, default=3, help="runs of each tree, taking turns")
    args = p.parse_args(list(argv))
    load = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    print(f"# kvswap bench stalls: {args.threads} thread(s); {load}", flush=True)
    print("| case | tree | median gap ms | during the work: p90 gap ms | worst gap ms | events | |")
    print("|---|---|---|---|---|---|---|")
    trees: list[tuple[str, str | None]] = [("this", None)]
    if args.baseline_src:
        trees.insert(0, (f"baseline ({args.baseline_src})", args.baseline_src))
    for case in args.cases.split(","):
        runs: dict[str, list[Gaps]] = {label: [] for label, _ in trees}
        for _ in range(args.rounds):  # the trees take turns, so both see the same load
            for label, src in trees:
                g = run_case(case, src, args.model, args)
                runs[label].append(g)
                print(f"| {case} | {label} | {g.median_ms:.1f} | {g.p90_ms:.1f} | "
                      f"{g.worst_ms:.1f} | {g.n_events} | {g.note} |", flush=True)  # fmt: skip
        for label, gs in runs.items():
            p90 = statistics.median(g.p90_ms for g in gs)
            worst = statistics.median(g.worst_ms for g in gs)
            print(f"| {case} | {label}: median of {len(gs)} | | {p90:.1f} | {worst:.1f} | | |",
                  flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
