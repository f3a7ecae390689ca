"""`kvswap bench startup`: process start to a first completion, kvswap beside llama-server.

What a model swapper (llama-swap) or a `--sleep-idle-seconds` wake makes a user wait for: the
process starts, loads the model and answers its first request. Each run starts the server with
the same flags, sends `POST /completion` (4 greedy tokens) every 10 ms until one answers 200,
and stops it; the servers alternate, and the table gives the median of `--runs` with the load
(`uptime`) of each run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from http.client import HTTPConnection

from kvswap.bench.server import process_cpu_s
from kvswap.cluster.procs import free_port

_POLL_S = 0.01


def first_completion_s(cmd: list[str], timeout_s: float = 300) -> tuple[float, float]:
    """Seconds from the process's start to the first 200 answer of /completion, and the CPU
    seconds the process used meanwhile (which a busy machine does not inflate as much)."""
    port = free_port()
    body = json.dumps({"prompt": "Hello", "n_predict": 4, "temperature": 0})
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [*cmd, "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        while time.perf_counter() - t0 < timeout_s:
            if proc.poll() is not None:
                raise RuntimeError(f"{cmd[0]} exited with {proc.returncode}")
            try:
                conn = HTTPConnection("127.0.0.1", port, timeout=timeout_s)
                conn.request("POST", "/completion", body, {"Content-Type": "application/json"})
                resp = conn.getresponse()
                resp.read()
                if resp.status == 200:
                    return time.perf_counter() - t0, process_cpu_s(proc.pid)
            except OSError:
                pass
            time.sleep(_POLL_S)
        raise TimeoutError(f"{cmd[0]} gave no completion in {timeout_s} s")
    finally:
        proc.terminate()
        proc.wait()


def main(argv: list[str]) -> int:
    from kvswap.models import default_model_path

    p = argparse.ArgumentParser(
        prog="kvswap bench startup",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("-m", "--model", default=None, help="GGUF model (default: the embedded SmolLM2)")
    p.add_argument("-t", "--threads", type=int, default=2)
    p.add_argument("-c", "--ctx-size", type=int, default=8192)
    p.add_argument("-np", "--parallel", type=int, default=4)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--llama-server", default=None, metavar="BIN", help="also start this binary")
    a = p.parse_args(argv)
    flags = ["-m", a.model or str(default_model_path()), "-t", str(a.threads), "-tb",
             str(a.threads), "-c", str(a.ctx_size), "-np", str(a.parallel)]  # fmt: skip
    sides = {"kvswap": [sys.executable, "-m", "kvswap", "serve", *flags]}
    if a.llama_server:
        sides["llama-server"] = [a.llama_server, *flags]
    seconds: dict[str, list[float]] = {side: [] for side in sides}
    cpu: dict[str, list[float]] = {side: [] for side in sides}
    loads: list[float] = []
    print(f"# kvswap bench startup: {' '.join(flags)}, median of {a.runs}", flush=True)
    for run in range(a.runs):
        order = list(sides) if run % 2 == 0 else list(sides)[::-1]
        for side in order:
            wall_s, cpu_s = first_completion_s(sides[side])
            seconds[side].append(wall_s)
            cpu[side].append(cpu_s)
        loads.append(os.getloadavg()[0])
        print(
            f"run {run + 1}: "
            + ", ".join(f"{s} {seconds[s][-1]:.3f} s ({cpu[s][-1]:.2f} s CPU)" for s in sides)
            + f" (load {loads[-1]:.2f})",
            flush=True,
        )
    print("| server | median s | min s | max s | vs llama-server (median of paired runs) | CPU s |")
    print("|---|---|---|---|---|---|")
    for side, values in seconds.items():
        paired = "-"  # no llama-server to compare with
        if "llama-server" in seconds:
            ratios = [k / ls for k, ls in zip(values, seconds["llama-server"], strict=True)]
            paired = f"{statistics.median(ratios):.2f}x"
        print(
            f"| {side} | {statistics.median(values):.3f} | {min(values):.3f} | {max(values):.3f} "
            f"| {paired} | {statistics.median(cpu[side]):.2f} |"
        )
    print(f"load average during the runs: {min(loads):.2f} - {max(loads):.2f}")
    return 0
