"""`kvswap cluster up` as the tests run it: the real command in a subprocess, on a tiny model,
its output in a log file; `ClusterUp.start` returns once it printed its banner, `stop` sends it
SIGTERM and waits. Whatever happens, no child is left behind (they live in their own sessions:
`close` kills any that survived by pid).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil

from kvswap.tiny import tiny_model_path
from tests.cluster.util import wait_until
from tests.server.harness import free_block

REPO = Path(__file__).resolve().parents[2]
READY = "kvswap cluster up: ready"


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


class ClusterUp:
    """One `kvswap cluster up` process (see the module docstring)."""

    def __init__(
        self,
        state_dir: Path,
        n_replicas: int,
        serve_flags: list[str],
        *,
        port: int | None = None,
        redis_port: int | None = None,
        model: Path | None = None,
    ) -> None:
        self.state_dir = state_dir
        self.port = port or free_block(n_replicas + 1)
        self.redis_port = redis_port or free_block(1)
        while self.port <= self.redis_port <= self.port + n_replicas:
            self.redis_port = free_block(1)
        model = model or tiny_model_path("llama", seed=7, vocab="tiny")
        self.argv = [
            sys.executable, "-m", "kvswap", "cluster", "up", "--replicas", str(n_replicas),
            "--port", str(self.port), "--redis-port", str(self.redis_port),
            "--dir", str(state_dir), "--check-inter-ms", "200",
            "-m", str(model), "-t", "1", "-tb", "1", *serve_flags,
        ]  # fmt: skip
        self.out = state_dir.parent / f"{state_dir.name}-up.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.pids: set[int] = set()  # every child pid seen, for `close`

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def output(self) -> str:
        return self.out.read_text() if self.out.exists() else ""

    def start(self, timeout_s: float = 240) -> dict[str, Any]:
        """Start it and wait for its banner; its cluster.json."""
        offset = len(self.output())
        with open(self.out, "ab") as log:
            self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
        proc = self.proc
        wait_until(
            lambda: READY in self.output()[offset:] or proc.poll() is not None,
            timeout_s,
            "the cluster to come up",
        )
        assert proc.poll() is None, self.output()
        return self.state()

    def state(self) -> dict[str, Any]:
        doc: dict[str, Any] = json.loads((self.state_dir / "cluster.json").read_text())
        children = [doc["haproxy"], doc["redis"], *doc["replicas"]]
        self.pids.update(c["pid"] for c in children if c["pid"] is not None)
        return doc

    def status(self) -> dict[str, Any]:
        """`kvswap cluster status --json`, as a user runs it."""
        done = subprocess.run(
            [sys.executable, "-m", "kvswap", "cluster", "status", "--json",
             "--dir", str(self.state_dir)],
            capture_output=True, text=True, timeout=60, cwd=REPO, check=False,
        )  # fmt: skip
        assert done.returncode in (0, 3), done.stderr
        doc: dict[str, Any] = json.loads(done.stdout)
        return doc

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        """`kvswap cluster ARGS... --dir DIR`."""
        return subprocess.run(
            [sys.executable, "-m", "kvswap", "cluster", *args, "--dir", str(self.state_dir)],
            capture_output=True, text=True, timeout=60, cwd=REPO, check=False,
        )  # fmt: skip

    def replica(self, replica_id: str) -> dict[str, Any]:
        return next(r for r in self.state()["replicas"] if r["id"] == replica_id)

    def stop(self, timeout_s: float = 120) -> int:
        """SIGTERM, and its exit status once it has stopped every child."""
        assert self.proc is not None
        self.state()
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout_s)

    def close(self) -> None:
        """After a failure too: stop it, then kill any child that outlived it."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(30)
        for pid in self.pids:
            if not gone(pid):
                psutil.Process(pid).kill()
