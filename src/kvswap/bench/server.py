"""A server under benchmark: `kvswap serve` (or a llama-server binary) as a subprocess.

Owns the process and its HTTP client; used by benchmarks only. `ready_s` is how long the process
took from its start to a first `/health` 200; `stop` ends it by SIGTERM or SIGKILL.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from kvswap.cluster.procs import free_port

_POLL_S = 0.02  # how often start-up polls /health


def process_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) of every thread of process `pid` so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def peak_rss_bytes(pid: int) -> int:
    """The peak resident set of process `pid` so far (Linux /proc: VmHWM); 0 if unknown."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


class RssPeaks:
    """The peaks of a process's anonymous and file-backed resident memory, sampled on a thread
    every `every_s` until `stop` (Linux /proc). The kernel's VmHWM keeps only their sum's peak,
    and a file's pages the process maps (the weights, a mind's file being restored) are page
    cache the kernel may drop, not memory the process holds; anonymous memory is."""

    def __init__(self, pid: int, every_s: float = 0.02) -> None:
        self.pid = pid
        self.anon_bytes = 0
        self.file_bytes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(every_s,), daemon=True)
        self._thread.start()

    def _run(self, every_s: float) -> None:
        while not self._stop.wait(every_s):
            try:
                anon, file = self.now()
            except OSError:
                return  # the process has ended
            self.anon_bytes = max(self.anon_bytes, anon)
            self.file_bytes = max(self.file_bytes, file)

    def now(self) -> tuple[int, int]:
        """The process's anonymous and file-backed resident bytes now."""
        lines = Path(f"/proc/{self.pid}/status").read_text().splitlines()
        fields = dict(line.split(":", 1) for line in lines if ":" in line)
        return _kib(fields.get("RssAnon")), _kib(fields.get("RssFile"))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def _kib(field: str | None) -> int:
    """Bytes of a /proc status field such as " 1024 kB" (0 when absent)."""
    return int(field.split()[0]) * 1024 if field else 0


class BenchServer:
    """Starts `kvswap serve ARGS`, or `BIN ARGS` when `binary` is given; waits for /health."""

    def __init__(
        self,
        args: Sequence[str],
        binary: str | None = None,
        timeout_s: float = 300,
        env: dict[str, str] | None = None,
    ) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [binary] if binary else [sys.executable, "-m", "kvswap", "serve"]
        self.log = tempfile.NamedTemporaryFile(prefix="bench-server-", suffix=".log", delete=False)  # noqa: SIM115
        t0 = time.perf_counter()
        self.proc = subprocess.Popen(
            [*cmd, "--port", str(self.port), *args],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env=env,
        )
        self.rss = RssPeaks(self.proc.pid)
        self.client = httpx.Client(base_url=self.url, timeout=3600)
        deadline = time.monotonic() + timeout_s
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited; see {self.log.name}")
            try:
                if self.client.get("/health").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"server not ready; see {self.log.name}")
            time.sleep(_POLL_S)
        self.ready_s = time.perf_counter() - t0
        # what it holds before any work: the KV pool, compute buffers, the runtime
        self.anon_at_ready_bytes = self.rss.now()[0]

    def completion(self, body: dict[str, Any]) -> dict[str, Any]:
        resp = self.client.post("/completion", json=body)
        if resp.status_code != 200:
            raise RuntimeError(f"/completion answered {resp.status_code}: {resp.text[:500]}")
        return json.loads(resp.content)

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 60) -> None:
        """End the process with `sig` (SIGKILL after `timeout_s` if it lingers)."""
        self.rss.stop()
        self.client.close()
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()

    def close(self) -> None:
        self.stop(signal.SIGTERM)

    def __enter__(self) -> BenchServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
