"""A server under benchmark: `kvswap serve` (or a llama-server binary) as a subprocess.

Owns the process and its HTTP client; used by benchmarks only.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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
        self.proc = subprocess.Popen(
            [*cmd, "--port", str(self.port), *args],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env=env,
        )
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
            time.sleep(0.1)

    def completion(self, body: dict[str, Any]) -> dict[str, Any]:
        resp = self.client.post("/completion", json=body)
        resp.raise_for_status()
        return json.loads(resp.content)

    def close(self) -> None:
        self.client.close()
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()

    def __enter__(self) -> BenchServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
