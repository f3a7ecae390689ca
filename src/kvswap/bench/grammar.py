"""`kvswap bench grammar`: what a grammar costs per generated token, beside free decoding.

Through the HTTP server, alternated and side by side (median of `--runs`): decode tokens/s of
one stream generating freely, under a GBNF grammar that the model mostly follows (the fast path:
the chain samples, the grammar checks one token), under a GBNF grammar it often breaks (the
second pass filters every candidate), and under a JSON schema. Printed as ratios to free
decoding. With `--llama-server BIN` the same requests also run against that binary, so both
servers' grammar costs read side by side.

Figures come from the server's own `timings.predicted_per_second`.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from kvswap.bench.server import BenchServer

_SETTLE_S = 0.3  # let libgomp's spinning threads go idle between measured runs

PROMPT = "<|im_start|>user\nWrite a long story about a cat.<|im_end|>\n<|im_start|>assistant\n"
SCHEMA = {
    "type": "object",
    "properties": {
        "title": {"type": "string"},
        "chapters": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["title", "chapters"],
}
CASES: dict[str, dict[str, Any]] = {
    "free": {},
    "gbnf, mostly followed": {"grammar": "root ::= [a-zA-Z0-9 ,.;:!?'\"\\n-]+"},
    "gbnf, often refused": {"grammar": "root ::= [a-z ]+"},
    "json_schema": {"json_schema": SCHEMA},
}


def _run(server: BenchServer, extra: dict[str, Any], n_predict: int) -> tuple[float, int]:
    body = {
        "prompt": PROMPT,
        "n_predict": n_predict,
        "temperature": 0,
        "cache_prompt": True,
        **extra,
    }
    out = server.completion(body)
    return float(out["timings"]["predicted_per_second"]), int(out["timings"]["predicted_n"])


def measure(server: BenchServer, n_predict: int, runs: int) -> dict[str, tuple[float, int]]:
    """Median tokens/s and the tokens generated, per case, the cases alternated."""
    speeds: dict[str, list[float]] = {name: [] for name in CASES}
    counts: dict[str, int] = {}
    _run(server, {}, 4)  # warm: the prompt is cached for every measured run
    for _ in range(runs):
        for name, extra in CASES.items():
            time.sleep(_SETTLE_S)
            speed, n = _run(server, extra, n_predict)
            speeds[name].append(speed)
            counts[name] = n
    return {name: (statistics.median(speeds[name]), counts[name]) for name in CASES}


def main(argv: list[str]) -> int:
    from kvswap.models import default_model_path

    p = argparse.ArgumentParser(
        prog="kvswap bench grammar",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("-m", "--model", default=None, help="GGUF model (default: SmolLM2-135M)")
    p.add_argument("-t", "--threads", type=int, default=1)
    p.add_argument("-n", "--n-predict", type=int, default=96)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--llama-server", default=None, metavar="BIN")
    args = p.parse_args(argv)
    model = args.model or str(default_model_path())
    server_args = ["-m", model, "-c", "2048", "-np", "1", "-t", str(args.threads)]
    server_args += ["-tb", str(args.threads)]
    sides: dict[str, str | None] = {"kvswap": None}
    if args.llama_server:
        sides["llama-server"] = args.llama_server
    results: dict[str, dict[str, tuple[float, int]]] = {}
    for side, binary in sides.items():
        with BenchServer(server_args, binary=binary) as server:
            results[side] = measure(server, args.n_predict, args.runs)
    print(
        f"# kvswap bench grammar: {model.rsplit('/', 1)[-1]}, {args.threads} thread(s), "
        f"n_predict {args.n_predict}, median of {args.runs}"
    )
    print("| case | " + " | ".join(f"{s} tok/s (n) | {s} vs free" for s in sides) + " |")
    print("|---|" + "---|---|" * len(sides))
    for name in CASES:
        cells = []
        for side in sides:
            speed, n = results[side][name]
            free = results[side]["free"][0]
            cells.append(f"{speed:.1f} ({n}) | {speed / free:.2f}")
        print(f"| {name} | " + " | ".join(cells) + " |")
    return 0
