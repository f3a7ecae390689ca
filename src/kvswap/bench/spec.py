"""`kvswap bench spec`: decode speed and acceptance with and without speculative decoding.

One run, side by side, SmolLM2 as the target on one slot: no draft; `draft-simple` with SmolLM2
drafting for itself (every draft accepted: the ceiling of what drafting saves in decode steps,
at the cost of a same-size draft); `draft-simple` with a tiny random draft sharing SmolLM2's
vocabulary (almost nothing accepted: the overhead); `ngram-simple` (no draft model). Each on a
free-form prompt and on a prompt whose answer quotes itself. Servers are measured in rotating
order with a pause between them (libgomp threads spin after a decode on 2 cores). Then what a
verification costs: the CPU time of one target decode by its number of rows.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import time
from dataclasses import dataclass, field

import psutil

from kvswap.backend.liblog import route_libllama_logs
from kvswap.bench.server import BenchServer

FREE = (
    "<|im_start|>user\nExplain how a bicycle works, step by step.<|im_end|>\n"
    "<|im_start|>assistant\n"
)
_LIST = (
    "apples, bread, carrots, dates, eggs, flour, grapes, honey, ice cream, jam, kale, lemons, "
    "milk, nuts, oats, pears, quinoa, rice, salt, tea"
)
QUOTING = (
    f"<|im_start|>user\nHere is my shopping list: {_LIST}.<|im_end|>\n<|im_start|>assistant\n"
    f"Your shopping list: {_LIST}.<|im_end|>\n<|im_start|>user\nPlease write the whole list "
    "again, exactly as before.<|im_end|>\n<|im_start|>assistant\n"
)


@dataclass
class Side:
    label: str
    args: list[str]
    tok_s: dict[str, list[float]] = field(default_factory=dict)
    cpu_ms: dict[str, list[float]] = field(default_factory=dict)  # server CPU per token
    drafted: dict[str, int] = field(default_factory=dict)
    accepted: dict[str, int] = field(default_factory=dict)
    n_predicted: dict[str, int] = field(default_factory=dict)


def _sides(smollm2: str, tiny_draft: str, n_max: int, threads: int) -> list[Side]:
    spec = ["--spec-draft-n-max", str(n_max), "-td", str(threads), "-tbd", str(threads)]
    return [
        Side("no draft", []),
        Side(f"draft-simple, SmolLM2 for itself, n_max {n_max}",
             ["--spec-type", "draft-simple", "-md", smollm2, *spec]),
        Side(f"draft-simple, tiny random draft, n_max {n_max}",
             ["--spec-type", "draft-simple", "-md", tiny_draft, *spec]),
        Side("ngram-simple (n 4, m 16)",
             ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "4",
              "--spec-ngram-simple-size-m", "16"]),
    ]  # fmt: skip


def rows_cost(model_path: str, threads: int) -> list[str]:
    """CPU ms of one target decode by its rows (all with logits): what verifying costs."""
    import numpy as np

    from kvswap.backend.batch import Batch
    from kvswap.backend.context import Context, ContextParams
    from kvswap.backend.model import Model

    model = Model.load(model_path)
    params = ContextParams(
        n_ctx=1024, n_seq_max=1, n_batch=512, n_ubatch=512, kv_unified=True,
        n_threads=threads, n_threads_batch=threads,
    )  # fmt: skip
    ctx, batch = Context(model, params), Batch(64)
    lines = ["| rows in the decode | CPU ms per decode | vs 1 row |", "|---|---|---|"]
    try:
        batch.add_span(np.arange(100, 164, dtype=np.int32), 0, 0, True)
        ctx.decode(batch)
        ms: dict[int, float] = {}
        for rows in (1, 2, 4, 8, 16):
            samples = []
            for _ in range(15):
                batch.clear()
                batch.add_outputs(np.full(rows, 300, dtype=np.int32), 64, 0)
                t0 = time.process_time()
                ctx.decode(batch)
                samples.append((time.process_time() - t0) * 1e3)
                ctx.seq_rm(0, 64, -1)
            ms[rows] = statistics.median(samples)
            lines.append(f"| {rows} | {ms[rows]:.1f} | {ms[rows] / ms[1]:.2f}x |")
    finally:
        batch.close()
        ctx.close()
        model.close()
    return lines


def _parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="kvswap bench spec",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("-t", "--threads", type=int, default=1)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--n-predict", type=int, default=96)
    p.add_argument("--n-max", type=int, default=3, help="--spec-draft-n-max of the draft sides")
    return p.parse_args(argv)


def _measure(
    sides: list[Side], servers: list[BenchServer], prompts: dict[str, str], args: argparse.Namespace
) -> None:
    """Each run asks every side every prompt, the sides in a rotated order (no side always
    runs first), and records its decode rate, server CPU per token and drafts."""
    for run in range(args.runs):
        order = list(range(len(sides)))
        order = order[run % len(order) :] + order[: run % len(order)]
        for i in order:
            side, server = sides[i], servers[i]
            proc = psutil.Process(server.proc.pid)
            for name, prompt in prompts.items():
                body = {"prompt": prompt, "n_predict": args.n_predict, "temperature": 0}
                # A first pass caches the prompt (and the draft's): the measured pass then
                # evaluates one prompt token, so its CPU time is the generation's.
                server.completion({**body, "id_slot": 0, "n_predict": 1})
                time.sleep(0.5)
                cpu0 = proc.cpu_times()
                t = server.completion({**body, "id_slot": 0})["timings"]
                cpu1 = proc.cpu_times()
                cpu_s = (cpu1.user + cpu1.system) - (cpu0.user + cpu0.system)
                side.cpu_ms.setdefault(name, []).append(1e3 * cpu_s / t["predicted_n"])
                side.tok_s.setdefault(name, []).append(t["predicted_per_second"])
                side.drafted[name] = side.drafted.get(name, 0) + t.get("draft_n", 0)
                side.accepted[name] = side.accepted.get(name, 0) + t.get("draft_n_accepted", 0)
                side.n_predicted[name] = t["predicted_n"]


def _report(sides: list[Side], prompts: dict[str, str], args: argparse.Namespace) -> None:
    print(
        f"# kvswap bench spec: SmolLM2-135M target, 1 slot, {args.threads} threads, "
        f"{args.n_predict} tokens, temperature 0, median of {args.runs} runs"
    )
    print(
        "| speculative | prompt | decode tok/s | vs no draft | server CPU ms/token | vs no draft "
        "| tokens per target step | drafted | accepted | acceptance |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name in prompts:
        ref = statistics.median(sides[0].tok_s[name])
        ref_cpu = statistics.median(sides[0].cpu_ms[name])
        for side in sides:
            tok_s = statistics.median(side.tok_s[name])
            cpu_ms = statistics.median(side.cpu_ms[name])
            drafted, accepted = side.drafted[name], side.accepted[name]
            rate = f"{100 * accepted / drafted:.0f}%" if drafted else "-"
            # Each target decode after the first token yields 1 + its accepted drafts.
            n_steps = side.n_predicted[name] - 1
            per_step = n_steps / max(1, n_steps - accepted // args.runs)
            print(
                f"| {side.label} | {name} ({side.n_predicted[name]} tokens) | {tok_s:.1f} | "
                f"{tok_s / ref:.2f}x | {cpu_ms:.1f} | {cpu_ms / ref_cpu:.2f}x | {per_step:.2f} | "
                f"{drafted // args.runs} | "
                f"{accepted // args.runs} | {rate} |"
            )


def main(argv: list[str]) -> int:
    from kvswap.models import default_model_path
    from kvswap.tiny import tiny_model_path

    args = _parse(argv)
    route_libllama_logs(logging.WARNING)
    smollm2 = str(default_model_path())
    tiny = str(tiny_model_path("llama", vocab="smollm2", n_embd=32, seed=3))
    base = ["-m", smollm2, "-c", "2048", "-np", "1", "-t", str(args.threads)]
    base += ["-tb", str(args.threads)]
    sides = _sides(smollm2, tiny, args.n_max, args.threads)
    prompts = {"free": FREE, "quoting": QUOTING}
    servers = [BenchServer([*base, *s.args]) for s in sides]
    try:
        _measure(sides, servers, prompts, args)
    finally:
        for server in servers:
            server.close()
    _report(sides, prompts, args)
    print()
    print(f"# what a verification costs: one SmolLM2 decode by rows, {args.threads} threads")
    for line in rows_cost(smollm2, args.threads):
        print(line)
    return 0
