"""`kvswap bench paging`: what a mind switch costs, side by side in one run.

Part 1, per mind size (SmolLM2 minds of 1k, 4k and 8k tokens; a generated model with SmolLM2's
bytes per token at 32k): page_out and page_in time and GB/s against a plain memcpy of the same
bytes in this process (target >= 0.8x), against save and restore through slot files, and
against re-prefilling the mind from its tokens.

Part 2, one decode thread: the worst gap between tokens of a streaming slot while another mind
pages out and then spills, next to the stream's median gap and the engine's own copy time
(target: a spill adds no engine stall; a page_out stalls no longer than its copy).
"""

from __future__ import annotations

import argparse
import itertools
import logging
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from kvswap.backend.liblog import route_libllama_logs
from kvswap.bench.server import BenchServer


@dataclass(frozen=True)
class MindCase:
    label: str
    model: str
    n_tokens: int


def _memcpy_gbps(n_bytes: int, runs: int = 5) -> float:
    src = np.ones(n_bytes, dtype=np.uint8)
    dst = np.empty_like(src)
    best = min(_timed(lambda: np.copyto(dst, src)) for _ in range(runs))
    return n_bytes / best / 1e9


def _timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _mind_tokens(server: BenchServer, n: int) -> list[int]:
    text = " ".join(f"fact{j} is true." for j in range(n))
    tokens: list[int] = server.client.post(
        "/tokenize", json={"content": text, "add_special": True}
    ).json()["tokens"]
    return tokens[:n]


def _post(server: BenchServer, path: str, body: dict | None = None) -> dict:
    resp = server.client.post(path, json=body)
    resp.raise_for_status()
    result: dict = resp.json()
    return result


def part1(cases: list[MindCase], threads: int, runs: int) -> list[str]:
    lines = [
        "| mind | state MB | page_out ms (copy on engine) | copy GB/s | page_in ms | page_in GB/s | memcpy GB/s | copy / memcpy | page_in / memcpy | save ms | restore ms | re-prefill ms | re-prefill / page_in |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for case in cases:
        with tempfile.TemporaryDirectory(prefix="kvswap-bench-") as save_dir:
            n_ctx = case.n_tokens + 256
            args = [
                "-m",
                case.model,
                "-c",
                str(2 * n_ctx),
                "-np",
                "2",
                "-t",
                str(threads),
                "-tb",
                str(threads),
                "--slot-save-path",
                save_dir,
            ]
            with BenchServer(args) as server:
                tokens = _mind_tokens(server, case.n_tokens)
                t0 = time.perf_counter()
                _post(server, "/completion", {"prompt": tokens, "n_predict": 1, "id_slot": 0})
                prefill_ms = (time.perf_counter() - t0) * 1e3
                outs, copies, ins, saves, restores = [], [], [], [], []
                n_bytes = 0
                for _ in range(runs):
                    out = _post(server, "/slots/0?action=page_out&page=mind")
                    n_bytes = out["n_bytes"]
                    outs.append(out["timings"]["page_out_ms"])
                    copies.append(out["timings"]["copy_ms"])
                    ins.append(
                        _post(server, "/slots/1?action=page_in&page=mind")["timings"]["page_in_ms"]
                    )
                    saves.append(
                        _post(server, "/slots/1?action=save", {"filename": "mind.bin"})["timings"][
                            "save_ms"
                        ]
                    )
                    restores.append(
                        _post(server, "/slots/0?action=restore", {"filename": "mind.bin"})[
                            "timings"
                        ]["restore_ms"]
                    )
                out_ms, copy_ms, in_ms = (statistics.median(x) for x in (outs, copies, ins))
                copy_gbps = n_bytes / (copy_ms / 1e3) / 1e9
                in_gbps = n_bytes / (in_ms / 1e3) / 1e9
                mem_gbps = _memcpy_gbps(n_bytes)
                lines.append(
                    f"| {case.label} | {n_bytes / 1e6:.1f} | {out_ms:.1f} ({copy_ms:.1f}) | {copy_gbps:.2f} | {in_ms:.1f} | "
                    f"{in_gbps:.2f} | {mem_gbps:.2f} | {copy_gbps / mem_gbps:.2f} | {in_gbps / mem_gbps:.2f} | "
                    f"{statistics.median(saves):.1f} | {statistics.median(restores):.1f} | {prefill_ms:.0f} | {prefill_ms / in_ms:.0f}x |"
                )
    return lines


def part2(model: str, mind_tokens: int) -> list[str]:
    with tempfile.TemporaryDirectory(prefix="kvswap-bench-") as save_dir:
        n_ctx = mind_tokens + 512
        args = ["-m", model, "-c", str(2 * n_ctx), "-np", "2", "-t", "1", "-tb", "1"]
        with BenchServer([*args, "--slot-save-path", save_dir]) as server:
            _post(
                server,
                "/completion",
                {"prompt": _mind_tokens(server, mind_tokens), "n_predict": 1, "id_slot": 1},
            )
            stamps, marks, out = _verbs_under_stream(server)
    return _gap_table(stamps, marks, out)


def _verbs_under_stream(
    server: BenchServer,
) -> tuple[list[float], dict[str, tuple[float, float]], dict]:
    """Page slot 1's mind out, then spill it, while slot 0 streams: the token arrival times,
    each verb's (start, end), and the page_out's answer."""
    stamps: list[float] = []
    marks: dict[str, tuple[float, float]] = {}
    started = threading.Event()

    def stream() -> None:
        body = {
            "prompt": "Once upon a time",
            "n_predict": 400,
            "ignore_eos": True,
            "stream": True,
            "id_slot": 0,
        }
        with server.client.stream("POST", "/completion", json=body) as resp:
            for line in resp.iter_lines():
                if line.startswith("data: "):
                    stamps.append(time.monotonic())
                    if len(stamps) == 20:
                        started.set()

    t = threading.Thread(target=stream)
    t.start()
    started.wait(120)
    time.sleep(0.5)
    a = time.monotonic()
    out = _post(server, "/slots/1?action=page_out&page=mind")
    marks["page_out"] = (a, time.monotonic())
    time.sleep(0.5)
    a = time.monotonic()
    _post(server, "/slots/1?action=spill&page=mind", {"filename": "mind.bin", "drop": True})
    marks["spill"] = (a, time.monotonic())
    t.join()
    return stamps, marks, out


def _gap_table(stamps: list[float], marks: dict[str, tuple[float, float]], out: dict) -> list[str]:
    """Each verb's duration and the worst gap between tokens streamed while it ran."""
    gaps = [b - a for a, b in itertools.pairwise(stamps)]
    median = statistics.median(gaps) * 1e3

    def worst(window: tuple[float, float]) -> float:
        lo, hi = window
        inside = [b - a for a, b in itertools.pairwise(stamps) if b >= lo and a <= hi]
        return max(inside) * 1e3 if inside else float("nan")

    return [
        "| event | duration ms | worst token gap ms | median token gap ms | engine copy ms |",
        "|---|---|---|---|---|",
        f"| page_out ({out['n_bytes'] / 1e6:.0f} MB) | {(marks['page_out'][1] - marks['page_out'][0]) * 1e3:.1f} | {worst(marks['page_out']):.1f} | {median:.1f} | {out['timings']['copy_ms']:.1f} |",
        f"| spill (drop) | {(marks['spill'][1] - marks['spill'][0]) * 1e3:.1f} | {worst(marks['spill']):.1f} | {median:.1f} | 0 (worker thread) |",
    ]


def main(argv: list[str]) -> int:
    from kvswap.models import default_model_path
    from kvswap.tiny import realistic_kv_params, tiny_model_path

    p = argparse.ArgumentParser(
        prog="kvswap bench paging",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("-m", "--model", default=None, help="GGUF model (default: the embedded SmolLM2)")
    p.add_argument("-t", "--threads", type=int, default=2)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--sizes", default="1024,4096,8000", help="mind sizes in tokens for the model")
    p.add_argument(
        "--long-tokens", type=int, default=32000, help="the generated model's mind (0: skip)"
    )
    args = p.parse_args(argv)
    route_libllama_logs(logging.WARNING)
    model = args.model or str(default_model_path())
    cases = [
        MindCase(f"SmolLM2 {n} tok", model, n) for n in (int(x) for x in args.sizes.split(","))
    ]
    if args.long_tokens:
        params = realistic_kv_params("smollm2-135m")
        params["n_ctx_train"] = max(params.get("n_ctx_train", 0), args.long_tokens + 1024)
        tiny = tiny_model_path("llama", **params)
        cases.append(
            MindCase(
                f"tiny, SmolLM2 bytes/token, {args.long_tokens} tok", str(tiny), args.long_tokens
            )
        )
    print(f"# kvswap bench paging: {args.threads} threads, median of {args.runs}")
    for line in part1(cases, args.threads, args.runs):
        print(line, flush=True)
    print()
    for line in part2(model, 4000):
        print(line, flush=True)
    return 0
