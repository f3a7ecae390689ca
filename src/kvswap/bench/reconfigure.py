"""`kvswap bench reconfigure`: a live reconfigure against a restart, side by side in one run.

Two resident minds of `--mind-tokens` tokens on a 2-slot server; the geometry then changes
(n_ctx doubled, one more slot). Live: POST /reconfigure, then each mind's next turn. Restart:
stop the server, start it with the new flags, wait for /health, re-prefill both minds, then the
same next turns. Printed: the pause, the next turns' prompt tokens, and the total until both
minds answer again.
"""

from __future__ import annotations

import argparse
import logging
import time

from kvswap.backend.liblog import route_libllama_logs
from kvswap.bench.server import BenchServer


def _mind(server: BenchServer, i: int, n: int) -> list[int]:
    text = " ".join(f"mind{i} remembers fact {j}." for j in range(n))
    tokens: list[int] = server.client.post(
        "/tokenize", json={"content": text, "add_special": True}
    ).json()["tokens"]
    return tokens[:n]


def _turn(server: BenchServer, prompt: list[int], slot: int) -> dict:
    return server.completion({"prompt": prompt, "n_predict": 4, "temperature": 0, "id_slot": slot})[
        "timings"
    ]


def run(model: str, n_tokens: int, threads: int) -> list[str]:
    base = ["-m", model, "-t", str(threads), "-tb", str(threads)]
    old = [*base, "-c", str(2 * (n_tokens + 512)), "-np", "2"]
    new = [*base, "-c", str(6 * (n_tokens + 512)), "-np", "3"]
    lines = [
        "| path | pause ms | next-turn prompt tokens (both minds) | until both minds answered ms |",
        "|---|---|---|---|",
    ]
    server = BenchServer(old)
    try:
        minds = [_mind(server, i, n_tokens) for i in range(2)]
        for i, m in enumerate(minds):
            _turn(server, m, i)
        follow = [m + _mind(server, 9, 16) for m in minds]
        t0 = time.perf_counter()
        resp = server.client.post(
            "/reconfigure", json={"n_ctx": 6 * (n_tokens + 512), "n_parallel": 3}
        )
        resp.raise_for_status()
        pause_ms = resp.json()["timings"]["total_ms"]
        turns = [_turn(server, f, i) for i, f in enumerate(follow)]
        total = (time.perf_counter() - t0) * 1e3
        lines.append(
            f"| live reconfigure | {pause_ms:.0f} | {sum(t['prompt_n'] for t in turns)} | {total:.0f} |"
        )
    finally:
        server.close()
    t0 = time.perf_counter()
    server = BenchServer(new)  # stop (above) and start again with the new flags
    try:
        ready = (time.perf_counter() - t0) * 1e3
        turns = [_turn(server, f, i) for i, f in enumerate(follow)]
        total = (time.perf_counter() - t0) * 1e3
        lines.append(
            f"| stop, start, re-prefill | {ready:.0f} (start) | {sum(t['prompt_n'] for t in turns)} | {total:.0f} |"
        )
    finally:
        server.close()
    return lines


def main(argv: list[str]) -> int:
    from kvswap.models import default_model_path

    p = argparse.ArgumentParser(
        prog="kvswap bench reconfigure",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("-m", "--model", default=None)
    p.add_argument("-t", "--threads", type=int, default=2)
    p.add_argument("--mind-tokens", type=int, default=2000)
    args = p.parse_args(argv)
    route_libllama_logs(logging.WARNING)
    model = args.model or str(default_model_path())
    print(
        f"# kvswap bench reconfigure: two {args.mind_tokens}-token minds, 2 -> 3 slots, n_ctx x3, {args.threads} threads"
    )
    for line in run(model, args.mind_tokens, args.threads):
        print(line, flush=True)
    return 0
