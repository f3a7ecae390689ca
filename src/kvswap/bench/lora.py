"""`kvswap bench lora`: what serving several LoRA sets at once costs.

libllama applies adapters per context, so a step batches only slots of one set and two sets
take turns. Two slots generate `--tokens` tokens each at the same time, on one server with a
random rank-8 adapter for the model (`kvswap.tiny.lora`), in three mixes: both without the
adapter (one batch per step), both under it (one batch, plus the adapter's matmuls), and one
with and one without (two batches per round). Reported: the wall time until both finish and the
aggregate decode rate, each against "both without", and when the first slot finished (turns
taken fairly: both finish late together; one set starving the other: the first finishes early),
measured side by side in one run (rotated order, median of `--runs`). With `--llama-server BIN`, the pinned llama-server runs the same
mixes for comparison (it also batches only equal sets).
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from pathlib import Path
from typing import Any

from kvswap.bench.server import BenchServer

PROMPT = "Write a short story about a lighthouse keeper and a storm."
MIXES: dict[str, tuple[float, float]] = {  # the two slots' adapter scales
    "both without the adapter": (0.0, 0.0),
    "both under the adapter": (1.0, 1.0),
    "one with, one without": (1.0, 0.0),
}


def _body(slot: int, scale: float, n: int) -> dict[str, Any]:
    return {
        "prompt": PROMPT,
        "n_predict": n,
        "temperature": 0,
        "ignore_eos": True,
        "id_slot": slot,
        "cache_prompt": False,
        "lora": [{"id": 0, "scale": scale}],
    }


def _pair(server: BenchServer, scales: tuple[float, float], n: int) -> tuple[float, float]:
    """Seconds until the first, and until both, slots have generated `n` tokens."""
    errors: list[BaseException] = []
    done: list[float] = []

    def one(slot: int) -> None:
        try:
            server.completion(_body(slot, scales[slot], n))
            done.append(time.perf_counter())
        except BaseException as err:  # reported after the join
            errors.append(err)

    threads = [threading.Thread(target=one, args=(slot,)) for slot in (0, 1)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return min(done) - t0, max(done) - t0


def measure(
    args: list[str], n: int, runs: int, binary: str | None
) -> dict[str, tuple[float, float]]:
    """Median (first done, both done) seconds per mix, the mixes rotated between runs."""
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in MIXES}
    names = list(MIXES)
    with BenchServer(args, binary=binary) as server:
        _pair(server, (0.0, 0.0), 8)  # warm-up
        for run in range(runs):
            for name in names[run % len(names) :] + names[: run % len(names)]:
                times[name].append(_pair(server, MIXES[name], n))
    return {
        name: (statistics.median(t[0] for t in ts), statistics.median(t[1] for t in ts))
        for name, ts in times.items()
    }


def main(argv: list[str]) -> int:
    from kvswap.models import default_model_path
    from kvswap.tiny.lora import tiny_lora_path

    p = argparse.ArgumentParser(
        prog="kvswap bench lora",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("-m", "--model", help="base model (default: the embedded SmolLM2-135M)")
    p.add_argument("-t", "--threads", type=int, default=2)
    p.add_argument("--tokens", type=int, default=64, help="tokens each slot generates")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--llama-server", help="also run the pinned llama-server binary")
    args = p.parse_args(argv)
    model = args.model or str(default_model_path())
    lora = tiny_lora_path(Path(model), seed=1, rank=8)
    serve = ["-m", model, "-c", "2048", "-np", "2", "-t", str(args.threads)]
    serve += ["-tb", str(args.threads), "--lora", str(lora), "--lora-init-without-apply"]
    servers = {"kvswap": None} | ({"llama-server": args.llama_server} if args.llama_server else {})
    print(f"# kvswap bench lora: {Path(model).name}, 2 slots x {args.tokens} tokens, ", end="")
    print(f"rank-8 random adapter, {args.threads} threads, median of {args.runs}")
    print("| server | mix | first done s | both done s | tokens/s (both) | vs both without |")
    print("|---|---|---|---|---|---|")
    for label, binary in servers.items():
        medians = measure(serve, args.tokens, args.runs, binary)
        base = medians["both without the adapter"][1]
        for name, (first, s) in medians.items():
            rate = 2 * args.tokens / s
            row = f"| {label} | {name} | {first:.2f} | {s:.2f} | {rate:.1f} | {s / base:.2f}x |"
            print(row, flush=True)
    return 0
