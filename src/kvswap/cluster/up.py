"""`kvswap cluster up`: a whole cluster on this machine, for a first try and for the tests.

Starts redis-server (noeviction, AOF under DIR/redis), N `kvswap serve` replicas on loopback
ports P+1..P+N (each with its own `--slot-save-path` DIR/<id>/slots, the serve flags passed to
every one), then HAProxy on P with the generated config; waits until every replica answers
/health and HAProxy sees them all UP; prints where everything is (also in DIR/cluster.json);
then runs until SIGTERM or Ctrl-C, or until a child dies, and stops the children in order:
HAProxy first (no new requests), the replicas (each finishes its own SIGTERM shutdown), Redis
last (replicas may still write to it while they stop). Logs: DIR/logs/<name>.log.

Every replica joins the cluster through its shared tier: `--shared-tier` (the Redis started
here), `--replica-id` (r1..rN, its HAProxy server name) and `--advertise-url` (its loopback
URL), so a mind survives its replica.

Owns the plan (`ClusterPlan`), the replicas' command lines (`replica_argv`: the one place that
adds the cluster's flags) and the supervision loop.
"""

from __future__ import annotations

import functools
import json
import signal
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from kvswap.cluster import haproxy
from kvswap.cluster.procs import (
    ManagedProcess,
    ProcessError,
    port_is_free,
    start_haproxy,
    start_redis,
)
from kvswap.config.errors import ConfigError, HelpRequested
from kvswap.config.flags import all_flags, parse_serve_args

# Serve flags the cluster sets itself for every replica.
OWNED_FLAGS: Final = ("--port", "--host", "--slot-save-path")
SHARED_TIER_FLAGS: Final = ("--shared-tier", "--replica-id", "--advertise-url")
HOST: Final = "127.0.0.1"


class ClusterUpError(RuntimeError):
    """A flag or a port the cluster cannot start with (the message names it)."""


@dataclass(frozen=True)
class ReplicaPlan:
    replica_id: str
    port: int
    slots_dir: Path
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"


@dataclass(frozen=True)
class ClusterPlan:
    port: int
    redis_port: int
    state_dir: Path
    replicas: tuple[ReplicaPlan, ...]
    serve_flags: tuple[str, ...]
    check_inter_ms: int

    @property
    def redis_url(self) -> str:
        return f"redis://{HOST}:{self.redis_port}/0"

    @property
    def socket_path(self) -> Path:
        return self.state_dir / "haproxy.sock"


def _names_of(flag_names: Sequence[str]) -> set[str]:
    """Every spelling (aliases included) of the serve flags named."""
    out: set[str] = set()
    for entry in all_flags():
        if any(n in entry.names for n in flag_names):
            out.update(entry.names)
    return out


def make_plan(
    n_replicas: int,
    port: int,
    state_dir: Path,
    serve_flags: Sequence[str],
    redis_port: int | None = None,
    check_inter_ms: int = 1000,
) -> ClusterPlan:
    """Validate everything before a process starts; ClusterUpError names what is wrong."""
    if not 1 <= n_replicas <= 64:
        raise ClusterUpError(f"--replicas {n_replicas}: between 1 and 64")
    owned = _names_of(OWNED_FLAGS) | _names_of(SHARED_TIER_FLAGS)
    for word in serve_flags:
        if word in owned:
            raise ClusterUpError(
                f"{word}: set by `kvswap cluster up` for each replica; remove it "
                "(--port sets HAProxy's port, replicas take the ports after it)"
            )
    try:
        parse_serve_args([*serve_flags, "--port", str(port + 1)], {})
    except (ConfigError, HelpRequested) as err:
        raise ClusterUpError(f"serve flags: {err}") from err
    redis_port = port + n_replicas + 1 if redis_port is None else redis_port
    ports = [port, redis_port, *(port + i for i in range(1, n_replicas + 1))]
    if len(set(ports)) != len(ports) or max(ports) > 65535:
        raise ClusterUpError(f"--port {port} / --redis-port {redis_port}: the ports overlap")
    for p in ports:
        if not port_is_free(p):
            raise ClusterUpError(f"port {p} is in use (choose another --port / --redis-port)")
    state_dir = state_dir.resolve()
    replicas = tuple(
        ReplicaPlan(
            f"r{i}", port + i, state_dir / f"r{i}" / "slots", state_dir / "logs" / f"r{i}.log"
        )
        for i in range(1, n_replicas + 1)
    )
    return ClusterPlan(port, redis_port, state_dir, replicas, tuple(serve_flags), check_inter_ms)


def replica_argv(plan: ClusterPlan, replica: ReplicaPlan) -> list[str]:
    """`kvswap serve` for one replica: the user's flags, then what the cluster sets."""
    return [
        sys.executable, "-m", "kvswap", "serve", *plan.serve_flags,
        "--host", HOST, "--port", str(replica.port), "--slot-save-path", str(replica.slots_dir),
        "--shared-tier", plan.redis_url,
        "--replica-id", replica.replica_id,
        "--advertise-url", replica.url,
    ]  # fmt: skip


def haproxy_config(plan: ClusterPlan) -> haproxy.HaproxyConfig:
    return haproxy.HaproxyConfig(
        tuple(haproxy.Replica(r.replica_id, HOST, r.port) for r in plan.replicas),
        bind=HOST,
        port=plan.port,
        socket_path=str(plan.socket_path),
        check_inter_ms=plan.check_inter_ms,
    )


def healthy(url: str) -> bool:
    """The kvswap server at `url` answers /health with 200."""
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
            return bool(r.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def _all_up(socket_path: Path, n: int) -> bool:
    try:
        states = haproxy.server_status(str(socket_path))
    except OSError:
        return False
    return sum(s.startswith("UP") for s in states.values()) == n


class Cluster:
    """The running children of one `cluster up`, in start order."""

    def __init__(self, plan: ClusterPlan) -> None:
        self.plan = plan
        self.redis: ManagedProcess | None = None
        self.replicas: list[ManagedProcess] = []
        self.haproxy: ManagedProcess | None = None

    def start(self, ready_timeout_s: float) -> None:
        plan, logs = self.plan, self.plan.state_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        self.redis = start_redis(
            plan.redis_port, plan.state_dir / "redis", logs / "redis.log", persistent=True
        )
        print(f"cluster: redis-server {plan.redis_url} (pid {self.redis.pid})", flush=True)
        for r in plan.replicas:
            r.slots_dir.mkdir(parents=True, exist_ok=True)
            self.replicas.append(ManagedProcess(r.replica_id, replica_argv(plan, r), r.log_path))
        print(f"cluster: starting {len(plan.replicas)} replicas, logs in {logs}", flush=True)
        config_path = plan.state_dir / "haproxy.cfg"
        config_path.write_text(haproxy.render(haproxy_config(plan)))
        self.haproxy = start_haproxy(config_path, logs / "haproxy.log")
        t0 = time.monotonic()
        for r, proc in zip(plan.replicas, self.replicas, strict=True):
            proc.wait_for(functools.partial(healthy, r.url), ready_timeout_s, "healthy")
            print(
                f"cluster: {r.replica_id} {r.url} healthy after {time.monotonic() - t0:.1f} s",
                flush=True,
            )
        self.haproxy.wait_for(
            lambda: _all_up(plan.socket_path, len(plan.replicas)), 60, "seeing every replica UP"
        )
        self._write_state()

    def _write_state(self) -> None:
        plan = self.plan
        assert self.redis is not None and self.haproxy is not None
        state = {
            "endpoint": f"http://{HOST}:{plan.port}",
            "haproxy": {"pid": self.haproxy.pid, "config": str(plan.state_dir / "haproxy.cfg"),
                        "socket": str(plan.socket_path)},
            "redis": {"url": plan.redis_url, "pid": self.redis.pid},
            "replicas": [
                {"id": r.replica_id, "url": r.url, "pid": p.pid, "slots": str(r.slots_dir),
                 "log": str(r.log_path)}
                for r, p in zip(plan.replicas, self.replicas, strict=True)
            ],
        }  # fmt: skip
        (plan.state_dir / "cluster.json").write_text(json.dumps(state, indent=2) + "\n")

    def children(self) -> list[ManagedProcess]:
        front = [self.haproxy] if self.haproxy else []
        back = [self.redis] if self.redis else []
        return [*front, *self.replicas, *back]

    def dead_child(self) -> ManagedProcess | None:
        return next((c for c in self.children() if not c.alive()), None)

    def stop(self, grace_s: float = 30.0) -> None:
        """HAProxy, then every replica at once, then Redis; SIGKILL past the grace."""
        if self.haproxy is not None:
            self.haproxy.stop(grace_s)
        for proc in self.replicas:
            proc.signal(signal.SIGTERM)
        for proc in self.replicas:
            proc.stop(grace_s)
        if self.redis is not None:
            self.redis.stop(grace_s)


def run(plan: ClusterPlan, ready_timeout_s: float) -> int:
    """Start the cluster, serve until a signal or a child's death, stop everything."""
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    cluster = Cluster(plan)
    status = 0
    try:
        cluster.start(ready_timeout_s)
        _print_ready(cluster)
        while not stop.wait(0.5):
            dead = cluster.dead_child()
            if dead is not None:
                print(
                    f"cluster: {dead.name} exited with status {dead.proc.returncode}; stopping. "
                    f"{dead.log_path}:\n{dead.log_tail()}",
                    file=sys.stderr,
                )
                status = 1
                break
    except ProcessError as err:
        print(f"cluster: {err}", file=sys.stderr)
        status = 1
    finally:
        print("cluster: stopping", flush=True)
        cluster.stop()
        print("cluster: stopped", flush=True)
    return status


def _print_ready(cluster: Cluster) -> None:
    plan = cluster.plan
    lines = [
        "kvswap cluster up: ready",
        f"  endpoint  http://{HOST}:{plan.port}  (HAProxy: send X-Mind-Id; answers name their "
        f"replica in {haproxy.REPLICA_HEADER})",
        *(
            f"  replica   {r.replica_id} {r.url} (pid {p.pid}, slots {r.slots_dir})"
            for r, p in zip(plan.replicas, cluster.replicas, strict=True)
        ),
        f"  redis     {plan.redis_url}",
        f"  haproxy   runtime API {plan.socket_path} ('set server {haproxy.BACKEND}/r1 state "
        "drain' drains r1)",
        f"  state     {plan.state_dir} (cluster.json, logs/)",
        "  stop      Ctrl-C, or kill -TERM this process",
    ]
    print("\n".join(lines), flush=True)
