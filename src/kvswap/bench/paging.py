"""`kvswap bench paging`: what a mind switch costs, side by side in one run.

Part 1, per mind size (SmolLM2 minds of 1k, 4k and 8k tokens; a generated model with SmolLM2's
bytes per token at 32k; `--wide-mib 1024,4096`: gigabyte minds on a generated llama with 1 MiB
of KV a token): page_out and page_in time and GB/s against a plain memcpy of the same bytes in
this process (target >= 0.8x), against save and restore through slot files, and against
re-prefilling the mind from its tokens. Then each part of a switch beside its own floor,
measured in this process on the same mind before the server starts (`switch_floors`): slot to
RAM (the engine's copy) against a memcpy; RAM to slot (page_in) against
`llama_state_seq_set_data` alone; slot to disk (a save) against a write of as many bytes with
its fsync; disk to slot (a restore) against reading the file plus `set_data`, from the page
cache and, after `posix_fadvise(DONTNEED)`, from the disk (targets: 1.2x, 1.2x, -, 1.3x).

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
from pathlib import Path

import numpy as np

from kvswap.backend.liblog import route_libllama_logs
from kvswap.bench.server import BenchServer
from kvswap.bench.switch_floors import (
    CopyFloor,
    Floors,
    WriteFloor,
    drop_cache,
    measure_floors,
)


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


@dataclass(frozen=True)
class Moves:
    """A mind's moves through the server's verbs, ms (median of the runs)."""

    n_bytes: int
    prefill_ms: float  # the mind's first prefill
    page_out_ms: float  # slot to RAM, the verb's whole time
    copy_ms: float  # ... its copy on the engine thread
    page_in_ms: float  # RAM to slot
    spill_ms: float  # RAM to disk (the page written to a file, kept in RAM)
    save_ms: float  # slot to disk (a slot file)
    write_floor_ms: float  # a write of as many bytes with its fsync, taking turns with them
    memcpy_ms: float  # a memcpy of as many bytes, taking turns with the copies
    restore_ms: float  # disk to slot, the file in the page cache
    restore_cold_ms: float  # ... after the file left the page cache


def _moves(server: BenchServer, tokens: list[int], save_dir: Path, runs: int) -> Moves:
    """Page the mind out of slot 0 and into slot 1, save it from there and restore it into slot
    0, warm and then cold, `runs` times."""
    t0 = time.perf_counter()
    _post(server, "/completion", {"prompt": tokens, "n_predict": 1, "id_slot": 0})
    prefill_ms = (time.perf_counter() - t0) * 1e3
    seen: dict[str, list[float]] = {}
    n_bytes = 0
    floor: WriteFloor | None = None
    memcpy: CopyFloor | None = None

    def timed(name: str, path: str, body: dict | None = None, key: str = "") -> dict:
        out = _post(server, path, body)
        seen.setdefault(name, []).append(out["timings"][key or f"{name}_ms"])
        return out

    for run in range(runs):
        if memcpy is not None:
            seen.setdefault("memcpy", []).append(memcpy())
        out = timed("page_out", "/slots/0?action=page_out&page=mind")
        n_bytes = out["n_bytes"]
        memcpy = memcpy or CopyFloor(n_bytes)
        seen.setdefault("copy", []).append(out["timings"]["copy_ms"])
        floor = floor or WriteFloor(save_dir, n_bytes)
        if run % 2 == 0:  # the floor's write first on even runs, last on odd ones
            seen.setdefault("write_floor", []).append(floor())
        timed("spill", "/slots/0?action=spill&page=mind", {"filename": "spill.bin", "drop": False})
        timed("page_in", "/slots/1?action=page_in&page=mind")
        timed("save", "/slots/1?action=save", {"filename": "mind.bin"})
        if run % 2 == 1:
            seen.setdefault("write_floor", []).append(floor())
        timed("restore", "/slots/0?action=restore", {"filename": "mind.bin"})
        drop_cache(save_dir / "mind.bin")
        timed("restore_cold", "/slots/0?action=restore", {"filename": "mind.bin"}, "restore_ms")
    assert memcpy is not None and floor is not None
    seen.setdefault("memcpy", []).append(memcpy())  # a run's worth after the last page_out
    floor.clear()
    med = {name: statistics.median(v) for name, v in seen.items()}
    return Moves(
        n_bytes, prefill_ms, med["page_out"], med["copy"], med["page_in"], med["spill"],
        med["save"], med["write_floor"], med["memcpy"], med["restore"], med["restore_cold"],
    )  # fmt: skip


def part1(cases: list[MindCase], threads: int, runs: int) -> list[str]:
    """Each mind's moves beside the floors of their parts (`switch_floors`)."""
    lines = [
        "| mind | state MB | page_out ms (copy on engine) | copy GB/s | page_in ms | page_in GB/s | memcpy GB/s | copy / memcpy | page_in / memcpy | save ms | restore ms | re-prefill ms | re-prefill / page_in |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    floor_lines = [
        "| mind | state MB | slot to RAM: copy / memcpy ms | x | RAM to slot: page_in / set_data ms | x | RAM to disk: spill / write+fsync ms | x | slot to disk: save / write+fsync ms | x | disk to slot warm: restore / read+set_data ms | x | cold | x | slot to RAM apart ms |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for case in cases:
        with tempfile.TemporaryDirectory(prefix="kvswap-bench-") as save_dir:
            n_ctx = case.n_tokens + 256
            args = ["-m", case.model, "-c", str(2 * n_ctx), "-np", "2", "-t", str(threads),
                    "-tb", str(threads), "--slot-save-path", save_dir]  # fmt: skip
            with BenchServer(args) as server:
                tokens = _mind_tokens(server, case.n_tokens)
            f = measure_floors(case.model, tokens, n_ctx, threads, Path(save_dir), runs)
            with BenchServer(args) as server:
                m = _moves(server, tokens, Path(save_dir), runs)
        lines.append(_moves_row(case, m))
        floor_lines.append(_floors_row(case, m, f))
    return [*lines, "", *floor_lines]


def _moves_row(case: MindCase, m: Moves) -> str:
    copy_gbps = m.n_bytes / (m.copy_ms / 1e3) / 1e9
    in_gbps = m.n_bytes / (m.page_in_ms / 1e3) / 1e9
    mem_gbps = _memcpy_gbps(m.n_bytes)
    return (
        f"| {case.label} | {m.n_bytes / 1e6:.1f} | {m.page_out_ms:.1f} ({m.copy_ms:.1f}) | "
        f"{copy_gbps:.2f} | {m.page_in_ms:.1f} | {in_gbps:.2f} | {mem_gbps:.2f} | "
        f"{copy_gbps / mem_gbps:.2f} | {in_gbps / mem_gbps:.2f} | {m.save_ms:.1f} | "
        f"{m.restore_ms:.1f} | {m.prefill_ms:.0f} | {m.prefill_ms / m.page_in_ms:.0f}x |"
    )


def _floors_row(case: MindCase, m: Moves, f: Floors) -> str:
    pairs = [
        (m.copy_ms, m.memcpy_ms),
        (m.page_in_ms, f.set_data_ms),
        (m.spill_ms, m.write_floor_ms),
        (m.save_ms, m.write_floor_ms),
        (m.restore_ms, f.read_warm_ms + f.set_data_ms),
        (m.restore_cold_ms, f.read_cold_ms + f.set_data_ms),
    ]
    cells = " | ".join(f"{ms:.1f} / {floor:.1f} | {ms / floor:.2f}" for ms, floor in pairs)
    libllama = f"get_data {f.get_data_ms:.1f}, memcpy {f.memcpy_ms:.1f} apart"
    return f"| {case.label} | {m.n_bytes / 1e6:.1f} | {cells} | {libllama} |"


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


def _sizes(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def wide_model(n_tokens: int) -> Path:
    """A generated llama with 1 MiB of f16 KV a token (32 layers x 64 KV heads x 128) and
    almost no weights, trained on enough tokens for a mind of `n_tokens`."""
    from kvswap.tiny import tiny_model_path

    return tiny_model_path(
        "llama", seed=3, n_embd=8, n_layer=32, n_head=64, n_head_kv=64, head_dim=128, n_ff=8,
        n_ctx_train=max(4096, n_tokens + 1024),
    )  # fmt: skip


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
    p.add_argument(
        "--sizes", default="1024,4096,8000", help="mind sizes in tokens for the model ('': none)"
    )
    p.add_argument(
        "--wide-mib",
        default="",
        help="mind sizes in MiB on a generated llama with 1 MiB of KV a token (e.g. 1024,4096)",
    )
    p.add_argument(
        "--long-tokens", type=int, default=32000, help="the generated model's mind (0: skip)"
    )
    args = p.parse_args(argv)
    route_libllama_logs(logging.WARNING)
    model = args.model or str(default_model_path())
    cases = [MindCase(f"SmolLM2 {n} tok", model, n) for n in _sizes(args.sizes)]
    if args.long_tokens:
        params = realistic_kv_params("smollm2-135m")
        params["n_ctx_train"] = max(params.get("n_ctx_train", 0), args.long_tokens + 1024)
        tiny = tiny_model_path("llama", **params)
        cases.append(
            MindCase(
                f"tiny, SmolLM2 bytes/token, {args.long_tokens} tok", str(tiny), args.long_tokens
            )
        )
    for mib in _sizes(args.wide_mib):
        cases.append(MindCase(f"wide, 1 MiB/token, {mib} tok", str(wide_model(mib)), mib))
    print(f"# kvswap bench paging: {args.threads} threads, median of {args.runs}")
    for line in part1(cases, args.threads, args.runs):
        print(line, flush=True)
    print()
    for line in part2(model, 4000):
        print(line, flush=True)
    return 0
