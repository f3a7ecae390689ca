"""`kvswap bench checkpoints`: what context checkpoints save, and what they hold.

Part 1: a hybrid and a recurrent model (generated, wide enough that prefill costs something)
prefill a long prompt, then a follow-up that diverges at 75% of it: the follow-up's prefill time
with checkpoints (every `--checkpoint-min-step` tokens) against without (it starts from zero).
Part 2: host bytes held by checkpoints over several slots under the count rule alone
(`--ctx-checkpoints 32`) against a byte budget (`--ctx-checkpoints-bytes`).
"""

from __future__ import annotations

import argparse
import logging
import statistics

from kvswap.backend.liblog import route_libllama_logs
from kvswap.bench.server import BenchServer


def _prompt(n: int, salt: int) -> list[int]:
    return [3 + (i * 37 + salt) % 256 for i in range(n)]


def _run(server: BenchServer, prompt: list[int], slot: int) -> dict:
    return server.completion({"prompt": prompt, "n_predict": 1, "temperature": 0, "id_slot": slot})[
        "timings"
    ]


def _metric(server: BenchServer, name: str) -> float:
    for line in server.client.get("/metrics").text.splitlines():
        if line.startswith(f"llamacpp:{name} "):
            return float(line.split()[1])
    raise KeyError(name)


def part1(
    models: dict[str, str], n_tokens: int, min_step: int, runs: int, threads: int
) -> list[str]:
    lines = [
        "| model | checkpoints | follow-up cache_n | follow-up prompt_n | follow-up prefill ms | vs without |",
        "|---|---|---|---|---|---|",
    ]
    a = _prompt(n_tokens, 0)
    b = a[: n_tokens * 3 // 4] + _prompt(64, 99)
    for label, model in models.items():
        base_ms = 0.0
        for n_ckpt in (0, 32):
            args = [
                "-m",
                model,
                "-c",
                str(2 * (n_tokens + 256)),
                "-np",
                "2",
                "-t",
                str(threads),
                "-tb",
                str(threads),
            ]
            args += [
                "-ub",
                "256",
                "--ctx-checkpoints",
                str(n_ckpt),
                "--checkpoint-min-step",
                str(min_step),
            ]
            with BenchServer(args) as server:
                times, last = [], {}
                for _ in range(runs):
                    server.client.post("/slots/0?action=erase")
                    _run(server, a, 0)
                    last = _run(server, b, 0)
                    times.append(last["prompt_ms"])
            ms = statistics.median(times)
            base_ms = base_ms or ms
            lines.append(
                f"| {label} | {'every ' + str(min_step) if n_ckpt else 'off'} | {last['cache_n']} | "
                f"{last['prompt_n']} | {ms:.0f} | {ms / base_ms:.2f} |"
            )
    return lines


def part2(model: str, n_tokens: int, min_step: int, budget: str, threads: int) -> list[str]:
    lines = [
        "| rule | slots | checkpoint bytes held | evicted (budget) | skipped (budget) |",
        "|---|---|---|---|---|",
    ]
    for label, extra in (
        ("count only (32 per slot)", []),
        (f"byte budget {budget}", ["--ctx-checkpoints-bytes", budget]),
    ):
        args = [
            "-m",
            model,
            "-c",
            str(4 * (n_tokens + 256)),
            "-np",
            "4",
            "-t",
            str(threads),
            "-tb",
            str(threads),
        ]
        args += ["-ub", "256", "--checkpoint-min-step", str(min_step), "--metrics", *extra]
        with BenchServer(args) as server:
            for slot in range(4):
                _run(server, _prompt(n_tokens, slot), slot)
            held = _metric(server, "ctx_checkpoint_bytes")
            evicted = _metric(server, "ctx_checkpoints_evicted_budget_total")
            skipped = _metric(server, "ctx_checkpoints_skipped_budget_total")
        lines.append(f"| {label} | 4 | {held / 1e6:.2f} MB | {evicted:.0f} | {skipped:.0f} |")
    return lines


def main(argv: list[str]) -> int:
    from kvswap.tiny import tiny_model_path

    p = argparse.ArgumentParser(
        prog="kvswap bench checkpoints",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("-t", "--threads", type=int, default=2)
    p.add_argument("--tokens", type=int, default=4096)
    p.add_argument("--min-step", type=int, default=512)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--budget", default="2M")
    args = p.parse_args(argv)
    route_libllama_logs(logging.WARNING)
    geometry = {"n_embd": 256, "n_layer": 6, "n_ctx_train": 2 * args.tokens + 512}
    models = {
        "lfm2 (hybrid), n_embd 256, 6 layers": str(tiny_model_path("lfm2", **geometry)),
        "mamba2 (recurrent), n_embd 256, 6 layers": str(tiny_model_path("mamba2", **geometry)),
    }
    print(
        f"# kvswap bench checkpoints: {args.tokens}-token prompts, divergence at 75%, {args.threads} threads"
    )
    for line in part1(models, args.tokens, args.min_step, args.runs, args.threads):
        print(line, flush=True)
    print()
    for line in part2(
        models["mamba2 (recurrent), n_embd 256, 6 layers"],
        args.tokens,
        args.min_step,
        args.budget,
        args.threads,
    ):
        print(line, flush=True)
    return 0
