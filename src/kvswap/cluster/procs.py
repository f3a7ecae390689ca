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
import functools
import os
import random
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import redis

POLL_S: Final = 0.05
_PR_SET_PDEATHSIG: Final = 1  # linux/prctl.h


class ProcessError(RuntimeError):
    """A child failed to start, exited early or did not become ready."""


class Interrupted(ProcessError):
    """A stop was asked for (a signal) while waiting for a child."""


def exit_text(status: int | None) -> str:
    """`status 1`, `status -9 (SIGKILL)`: how a child's exit status reads in a log line."""
    if status is None:
        return "no status (still running)"
    if status < 0:
        try:
            return f"status {status} ({signal.Signals(-status).name})"
        except ValueError:
            return f"status {status}"
    return f"status {status}"


def find_binary(name: str) -> str:
    """The path of `name` on PATH (or /usr/sbin), or a ProcessError saying how to install it."""
    found = shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/bin:/sbin")
    if found is None:
        raise ProcessError(
            f"{name} is not installed: run scripts/setup.sh (Debian: apt-get install "
            f"{'redis-server' if name.startswith('redis') else name})"
        )
    return found


_HANDED_OUT: set[int] = set()  # ports this process has handed out, never handed twice


def ephemeral_low() -> int:
    """The first port the kernel hands to outgoing connections and `bind(port 0)`."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_block(n_ports: int, host: str = "127.0.0.1") -> int:
    """A port P with P..P+n_ports-1 all free, below the kernel's ephemeral range, none of them
    handed out before by this process.

    A port the OS chose with `bind(port 0)` lies inside the ephemeral range: between the choice
    and the listener's bind, any outgoing connection (a client, a replica's call to Redis) may
    take it ("Address already in use"). Below the range only a listener can hold a port.
    """
    low = ephemeral_low()
    top = low - n_ports if low > 12000 else 65536 - n_ports
    base = 10000 if low > 12000 else low + 1
    rng = random.Random()
    for _ in range(500):
        port = rng.randrange(base, top)
        block = range(port, port + n_ports)
        if _HANDED_OUT.isdisjoint(block) and all(port_is_free(p, host) for p in block):
            _HANDED_OUT.update(block)
            return port
    raise ProcessError(f"no {n_ports} free ports in a row between {base} and {top}")


def free_port(host: str = "127.0.0.1") -> int:
    """One free port for a listener this process is about to start (see `free_block`)."""
    return free_block(1, host)


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    """No socket listens on `port`. Bound with SO_REUSEADDR, as redis-server, HAProxy and the
    replicas bind theirs: connections of a cluster just stopped, in TIME-WAIT, do not count."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
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
        self.env = {**os.environ, **(env or {})}
        self.cwd = cwd
        self.proc = self._spawn()

    def _spawn(self) -> subprocess.Popen[bytes]:
        libc = ctypes.CDLL(None, use_errno=True)  # loaded here: the child only calls it

        def die_with_parent() -> None:  # in the child, before exec
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)

        with open(self.log_path, "ab") as log:
            return subprocess.Popen(
                self.argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.env,
                cwd=self.cwd,
                start_new_session=True,
                preexec_fn=die_with_parent,
            )

    def respawn(self) -> None:
        """Start the same program again (same argv, environment and log) after it exited."""
        assert not self.alive(), f"{self.name} is still running"
        self.proc = self._spawn()

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

    def wait_for(
        self,
        ready: Callable[[], bool],
        timeout_s: float,
        what: str,
        stopped: threading.Event | None = None,
    ) -> None:
        """Poll `ready()` until true; ProcessError when the child exits or time runs out,
        `Interrupted` as soon as `stopped` is set (Ctrl-C while the cluster starts)."""
        deadline = time.monotonic() + timeout_s
        stopped = stopped or threading.Event()
        while True:
            if not self.alive():
                raise ProcessError(
                    f"{self.name} exited with {exit_text(self.proc.returncode)} before {what}; "
                    f"{self.log_path}:\n{self.log_tail()}"
                )
            if ready():
                return
            if time.monotonic() > deadline:
                raise ProcessError(
                    f"{self.name} not {what} after {timeout_s:.0f} s; {self.log_path}:\n"
                    f"{self.log_tail()}"
                )
            if stopped.wait(POLL_S):
                raise Interrupted(f"stopped while waiting for {self.name} to be {what}")

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


@dataclass(frozen=True)
class RedisOptions:
    """How the shared tier's redis-server runs: AOF when `persistent`; `password`: AUTH
    required (written to a 0600 config file, never to argv, which `ps` shows); past
    `maxmemory_bytes` writes are refused (`noeviction`: Redis never evicts a lease or a chunk
    by itself; the tier's own budget degrades minds below it)."""

    persistent: bool = False
    password: str | None = None
    maxmemory_bytes: int | None = None


def redis_argv(
    port: int, data_dir: Path, options: RedisOptions, *, host: str = "127.0.0.1"
) -> list[str]:
    """redis-server's command line; with a password, its config file is `data_dir/redis.conf`
    (`write_redis_conf`)."""
    persistence = ["--appendonly", "yes", "--appendfsync", "everysec"]
    if not options.persistent:
        persistence = ["--appendonly", "no"]
    conf = [str(data_dir / "redis.conf")] if options.password is not None else []
    memory = []
    if options.maxmemory_bytes is not None:  # plain bytes: Redis reads `1g` as 10^9
        memory = ["--maxmemory", str(options.maxmemory_bytes)]
    return [
        find_binary("redis-server"), *conf,
        "--port", str(port),
        "--bind", host,
        "--dir", str(data_dir),
        "--save", "",
        *persistence,
        *memory,
        "--maxmemory-policy", "noeviction",
        "--daemonize", "no",
        "--protected-mode", "yes",
    ]  # fmt: skip


def write_redis_conf(data_dir: Path, password: str) -> Path:
    """The config file holding `requirepass`, readable by this user only."""
    if any(c.isspace() or c in "\"'" for c in password) or not password:
        raise ProcessError("the Redis password must be a non-empty word (no spaces or quotes)")
    path = data_dir / "redis.conf"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(f"# written by kvswap at each start\nrequirepass {password}\n")
    path.chmod(0o600)  # an older file kept its mode
    return path


def start_redis(
    port: int,
    data_dir: Path,
    log_path: Path,
    *,
    persistent: bool,
    password: str | None = None,
    maxmemory_bytes: int | None = None,
    timeout_s: float = 30,
    stopped: threading.Event | None = None,
) -> ManagedProcess:
    """Start redis-server (see `RedisOptions`) and wait until it answers PING (authenticated
    when it has a password)."""
    options = RedisOptions(persistent, password, maxmemory_bytes)
    data_dir.mkdir(parents=True, exist_ok=True)
    if options.password is not None:
        write_redis_conf(data_dir, options.password)
    proc = ManagedProcess("redis-server", redis_argv(port, data_dir, options), log_path)
    try:
        proc.wait_for(
            functools.partial(redis_pings, port, options.password), timeout_s, "answering PING",
            stopped,
        )  # fmt: skip
    except ProcessError:
        proc.stop()
        raise
    return proc


def redis_pings(port: int, password: str | None, timeout_s: float = 1.0) -> bool:
    """The redis-server on loopback `port` answers PING (a wrong password raises)."""
    client = redis.Redis(
        host="127.0.0.1",
        port=port,
        password=password,
        socket_connect_timeout=timeout_s,
        socket_timeout=timeout_s,
    )
    try:
        return bool(client.ping())
    except redis.exceptions.AuthenticationError as err:  # a ConnectionError by class
        raise ProcessError(f"redis-server on port {port} refused the password: {err}") from err
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
        return False  # not listening yet; BusyLoadingError (replaying its AOF) included
    finally:
        client.close()


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
