"""A real `kvswap serve` subprocess on a free loopback port, for server tests."""

from __future__ import annotations

import json
import os
import signal
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx

from kvswap.cluster.procs import free_block, free_port

REPO = Path(__file__).resolve().parents[2]

__all__ = ["REPO", "ServerProcess", "free_block", "free_port"]


class ServerProcess:
    """`python -m kvswap serve ARGS` with its output in a log file."""

    def __init__(
        self,
        args: Sequence[str],
        log_path: Path,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
    ) -> None:
        self.port = free_port()
        # With --ssl-cert-file the server speaks HTTPS; the client trusts that certificate.
        cert = args[list(args).index("--ssl-cert-file") + 1] if "--ssl-cert-file" in args else None
        self.url = f"{'https' if cert else 'http'}://127.0.0.1:{self.port}"
        self.args = list(args)
        self.log_path = log_path
        self._log = open(log_path, "wb")  # noqa: SIM115 (closed in stop)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "kvswap", "serve", "--port", str(self.port), *args],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            # Every byte owner checks its integrity whenever the engine idles (debug mode).
            env={**os.environ, "KVSWAP_CHECK_INTEGRITY": "1", **(env or {})},
            cwd=cwd or REPO,
        )
        verify = ssl.create_default_context(cafile=cert) if cert else True
        self.client = httpx.Client(base_url=self.url, timeout=300, verify=verify)
        self.wait_ready()

    def wait_ready(self, timeout_s: float = 120) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log()}")
            try:
                if self.client.get("/health").status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        raise TimeoutError(f"server not ready:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-5000:]

    def post(self, path: str, body: Any = None, **kw: Any) -> httpx.Response:
        return self.client.post(path, json=body, **kw)

    def stream(self, path: str, body: Any) -> Iterator[dict[str, Any]]:
        """The JSON objects of an SSE response, in order ([DONE] ends it)."""
        with self.client.stream("POST", path, json=body) as resp:
            assert resp.status_code == 200, resp.read()
            for line in resp.iter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[len("data: ") :]
                if data == "[DONE]":
                    return
                yield json.loads(data)

    def metrics(self) -> dict[str, float]:
        out = {}
        for line in self.client.get("/metrics").text.splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                out[name] = float(value)
        return out

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 30) -> int:
        self.client.close()
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode


def chat_prompt(*turns: tuple[str, str]) -> str:
    """SmolLM2's ChatML prompt text for (role, content) turns, ending with an assistant turn."""
    text = "".join(f"<|im_start|>{role}\n{content}<|im_end|>\n" for role, content in turns)
    return text + "<|im_start|>assistant\n"
