"""The cluster's external processes on this machine: redis-server, haproxy, kvswap replicas.

`ManagedProcess` starts a program in its own session (a Ctrl-C in the terminal reaches only
`kvswap cluster up`, which then stops its children in order), with its output in a log file, and
stops it with SIGTERM, then SIGKILL after a grace period. A child gets SIGTERM when the process
that started it dies (`PR_SET_PDEATHSIG`): a `cluster up` killed with SIGKILL leaves no
replica, Redis or HAProxy behind. (The signal follows the *thread* that started the child:
start children from a thread that lives as long as they should.) `wait_for` polls a condition with a
deadline and fails early, with the log's tail, when the process exits. Used by `cluster up` and
by the tests' fixtures.

Owns the children it starts (`stop` ends them; nothing else signals them). No Redis or HTTP
client logic beyond readiness probes.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Final

import redis

POLL_S: Final = 0.05
_PR_SET_PDEATHSIG: Final = 1  # linux/prctl.h


class ProcessError(RuntimeError):
    """A child failed to start, exited early or did not become ready."""


def find_binary(name: str) -> str:
    """The path of `name` on PATH (or /usr/sbin), or a ProcessError saying how to install it."""
    found = shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/bin:/sbin")
    if found is None:
        raise ProcessError(
            f"{name} is not installed: run scripts/setup.sh (Debian: apt-get install "
            f"{'redis-server' if name.startswith('redis') else name})"
        )
    return found


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


class ManagedProcess:
    """One child process, its log file, and its orderly stop."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        log_path: Path,
        *,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        libc = ctypes.CDLL(None, use_errno=True)  # loaded here: the child only calls it

        def die_with_parent() -> None:  # in the child, before exec
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)

        with open(log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **(env or {})},
                cwd=cwd,
                start_new_session=True,
                preexec_fn=die_with_parent,
            )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self, n_bytes: int = 4000) -> str:
        try:
            data = self.log_path.read_bytes()
        except FileNotFoundError:
            return ""
        return data[-n_bytes:].decode("utf-8", "replace")

    def wait_for(self, ready: Callable[[], bool], timeout_s: float, what: str) -> None:
        """Poll `ready()` until true; ProcessError when the child exits or time runs out."""
        deadline = time.monotonic() + timeout_s
        while True:
            if not self.alive():
                raise ProcessError(
                    f"{self.name} exited with status {self.proc.returncode} before {what}; "
                    f"{self.log_path}:\n{self.log_tail()}"
                )
            if ready():
                return
            if time.monotonic() > deadline:
                raise ProcessError(
                    f"{self.name} not {what} after {timeout_s:.0f} s; {self.log_path}:\n"
                    f"{self.log_tail()}"
                )
            time.sleep(POLL_S)

    def signal(self, sig: int) -> None:
        if self.alive():
            self.proc.send_signal(sig)

    def stop(self, grace_s: float = 10.0) -> int:
        """SIGTERM, then SIGKILL after `grace_s`; the exit status."""
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        return self.proc.wait()


def redis_argv(
    port: int, data_dir: Path, *, persistent: bool, host: str = "127.0.0.1"
) -> list[str]:
    """redis-server as the shared tier wants it: noeviction, AOF when `persistent`."""
    persistence = ["--appendonly", "yes", "--appendfsync", "everysec"]
    if not persistent:
        persistence = ["--appendonly", "no"]
    return [
        find_binary("redis-server"),
        "--port", str(port),
        "--bind", host,
        "--dir", str(data_dir),
        "--save", "",
        *persistence,
        "--maxmemory-policy", "noeviction",
        "--daemonize", "no",
        "--protected-mode", "yes",
    ]  # fmt: skip


def start_redis(
    port: int, data_dir: Path, log_path: Path, *, persistent: bool, timeout_s: float = 30
) -> ManagedProcess:
    """Start redis-server and wait until it answers PING."""
    data_dir.mkdir(parents=True, exist_ok=True)
    proc = ManagedProcess(
        "redis-server", redis_argv(port, data_dir, persistent=persistent), log_path
    )
    client = redis.Redis(host="127.0.0.1", port=port, socket_connect_timeout=1, socket_timeout=1)

    def pings() -> bool:
        try:
            return bool(client.ping())
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
            return False
        except redis.exceptions.BusyLoadingError:
            return False

    try:
        proc.wait_for(pings, timeout_s, "answering PING")
    except ProcessError:
        proc.stop()
        raise
    finally:
        client.close()
    return proc


def haproxy_check(config_path: Path) -> str:
    """`haproxy -c -f config`: its output when valid, else ProcessError with its output."""
    done = subprocess.run(
        [find_binary("haproxy"), "-c", "-f", str(config_path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    output = done.stdout + done.stderr
    if done.returncode != 0:
        raise ProcessError(f"haproxy refused {config_path}:\n{output}")
    return output


def start_haproxy(config_path: Path, log_path: Path) -> ManagedProcess:
    """Start haproxy in the foreground (`-db`) on a checked config."""
    haproxy_check(config_path)
    return ManagedProcess(
        "haproxy", [find_binary("haproxy"), "-db", "-f", str(config_path)], log_path
    )
