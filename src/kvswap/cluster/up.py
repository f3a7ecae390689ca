"""`kvswap cluster up`: a whole cluster on this machine, for a first try and for the tests.

Starts redis-server (noeviction, AOF under DIR/redis, a password generated at each start and
a `maxmemory`), N `kvswap serve` replicas on loopback ports P+1..P+N (each with its own
`--slot-save-path` DIR/<id>/slots, the serve flags passed to every one), then HAProxy on P with
the generated config; waits until every replica answers /health and HAProxy sees them all UP;
prints where everything is (also in DIR/cluster.json, `state`); then supervises them
(`supervise`: a child that dies is logged and started again, with back-off and a limit, while
the others keep serving) until SIGTERM or Ctrl-C, and stops the children in order: HAProxy
first (no new requests), the replicas (each finishes its own SIGTERM shutdown), Redis last
(replicas may still write to it while they stop). Logs: DIR/logs/<name>.log. The cluster stops
by itself only when HAProxy or Redis gave up, or every replica did.

Every replica joins the cluster through its shared tier: the Redis URL, its password included,
in the environment (`KVSWAP_ARG_SHARED_TIER`: argv is visible to every user in `ps`),
`--replica-id` (r1..rN, its HAProxy server name) and `--advertise-url` (its loopback URL), so a
mind survives its replica. Unless the serve flags set `--shared-tier-bytes`, the tier's own
budget is 3/4 of Redis's `maxmemory`: kvswap degrades minds to tokens-only below it, and the
rest is headroom for what the budget does not count (token logs, manifests, leases, chunks of
publications in flight), so Redis never refuses a lease for want of memory.

Owns the plan (`ClusterPlan`), the replicas' command lines and environment (`replica_argv`,
`replica_env`: the one place that adds the cluster's flags), the start and the stop order.
"""

from __future__ import annotations

import functools
import os
import secrets
import signal
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from kvswap.cluster import haproxy
from kvswap.cluster.procs import (
    Interrupted,
    ManagedProcess,
    ProcessError,
    port_is_free,
    redis_pings,
    start_haproxy,
    start_redis,
)
from kvswap.cluster.state import ENV_VAR, STATE_FILE, write_state
from kvswap.cluster.supervise import ChildState, RestartPolicy, Supervised
from kvswap.config.errors import ConfigError, HelpRequested
from kvswap.config.flags import all_flags, parse_serve_args
from kvswap.tiers.shared.replica import redacted

# Serve flags the cluster sets itself for every replica.
OWNED_FLAGS: Final = ("--port", "--host", "--slot-save-path")
SHARED_TIER_FLAGS: Final = (
    "--shared-tier", "--replica-id", "--advertise-url", "--shared-tier-peers",
)  # fmt: skip
TIER_ENV: Final = "KVSWAP_ARG_SHARED_TIER"
BUDGET_ENV: Final = "KVSWAP_ARG_SHARED_TIER_BYTES"
HOST: Final = "127.0.0.1"
DEFAULT_REDIS_MAXMEMORY_BYTES: Final = 1 << 30
MIN_REDIS_MAXMEMORY_BYTES: Final = 64 << 20
TICK_S: Final = 0.2  # the supervision loop's period


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
    redis_maxmemory_bytes: int = DEFAULT_REDIS_MAXMEMORY_BYTES
    policy: RestartPolicy = field(default_factory=RestartPolicy)
    redis_password: str = field(default_factory=lambda: secrets.token_hex(24), repr=False)

    @property
    def redis_url(self) -> str:
        """The replicas' tier URL, password included: never print it (`redis_url_shown`)."""
        return f"redis://:{self.redis_password}@{HOST}:{self.redis_port}/0"

    @property
    def redis_url_shown(self) -> str:
        return redacted(self.redis_url)

    @property
    def endpoint(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def socket_path(self) -> Path:
        return self.state_dir / "haproxy.sock"

    @property
    def state_path(self) -> Path:
        return self.state_dir / STATE_FILE


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
    *,
    redis_maxmemory_bytes: int = DEFAULT_REDIS_MAXMEMORY_BYTES,
    policy: RestartPolicy | None = None,
) -> ClusterPlan:
    """Validate everything before a process starts; ClusterUpError names what is wrong."""
    if not 1 <= n_replicas <= 64:
        raise ClusterUpError(f"--replicas {n_replicas}: between 1 and 64")
    if redis_maxmemory_bytes < MIN_REDIS_MAXMEMORY_BYTES:
        raise ClusterUpError(f"--redis-maxmemory {redis_maxmemory_bytes}: at least 64M")
    owned = _names_of(OWNED_FLAGS) | _names_of(SHARED_TIER_FLAGS)
    for word in serve_flags:
        if word.split("=", 1)[0] in owned:
            raise ClusterUpError(
                f"{word.split('=', 1)[0]}: set by `kvswap cluster up` for each replica; remove it "
                "(--port sets HAProxy's port, replicas take the ports after it)"
            )
    as_replica = [  # the flags the cluster adds, so a shared-tier flag given is checked too
        "--port", str(port + 1), "--shared-tier", f"redis://{HOST}:{port}/0",
        "--replica-id", "r1", "--advertise-url", f"http://{HOST}:{port + 1}",
        "--shared-tier-peers", f"http://{HOST}:{port + 1}",
    ]  # fmt: skip
    try:
        parse_serve_args([*serve_flags, *as_replica], {})
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
    return ClusterPlan(
        port, redis_port, state_dir, replicas, tuple(serve_flags), check_inter_ms,
        redis_maxmemory_bytes, policy or RestartPolicy(),
    )  # fmt: skip


def replica_argv(plan: ClusterPlan, replica: ReplicaPlan) -> list[str]:
    """`kvswap serve` for one replica: the user's flags, then what the cluster sets (the tier's
    URL is in `replica_env`)."""
    given = {w.split("=", 1)[0] for w in plan.serve_flags}
    budget: list[str] = []
    if not given & _names_of(["--shared-tier-bytes"]) and BUDGET_ENV not in os.environ:
        budget = ["--shared-tier-bytes", str(plan.redis_maxmemory_bytes * 3 // 4)]
    return [
        sys.executable, "-m", "kvswap", "serve", *plan.serve_flags,
        "--host", HOST, "--port", str(replica.port), "--slot-save-path", str(replica.slots_dir),
        *budget,
        "--replica-id", replica.replica_id,
        "--advertise-url", replica.url,
        "--shared-tier-peers", ",".join(r.url for r in plan.replicas),
    ]  # fmt: skip


def replica_env(plan: ClusterPlan) -> dict[str, str]:
    """The environment a replica gets on top of ours: the tier's URL with its password, and
    where cluster.json is."""
    return {TIER_ENV: plan.redis_url, ENV_VAR: str(plan.state_path)}


def haproxy_config(plan: ClusterPlan) -> haproxy.HaproxyConfig:
    return haproxy.HaproxyConfig(
        tuple(haproxy.Replica(r.replica_id, HOST, r.port) for r in plan.replicas),
        bind=HOST,
        port=plan.port,
        socket_path=str(plan.socket_path),
        check_inter_ms=plan.check_inter_ms,
    )


def healthy(url: str, timeout_s: float = 2.0) -> bool:
    """The kvswap server at `url` answers /health with 200."""
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=timeout_s) as r:
            return bool(r.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def _all_up(socket_path: Path, n: int) -> bool:
    try:
        states = haproxy.server_status(str(socket_path))
    except OSError:
        return False
    return sum(s.startswith("UP") for s in states.values()) == n


def _haproxy_answers(socket_path: Path) -> bool:
    try:
        return "Pid:" in haproxy.runtime(str(socket_path), "show info", timeout_s=1.0)
    except OSError:
        return False


def _redis_ready(port: int, password: str) -> bool:
    try:
        return redis_pings(port, password)
    except ProcessError:
        return False


def ignore_state_dir(state_dir: Path) -> None:
    """A `.gitignore` of `*` in the state folder: wherever --dir points, git ignores it."""
    state_dir.mkdir(parents=True, exist_ok=True)
    marker = state_dir / ".gitignore"
    if not marker.exists():
        marker.write_text("# kvswap cluster up's state and logs\n*\n")


class Cluster:
    """The running children of one `cluster up`, supervised; see the module docstring."""

    def __init__(self, plan: ClusterPlan) -> None:
        self.plan = plan
        self.redis: Supervised | None = None
        self.replicas: list[Supervised] = []
        self.haproxy: Supervised | None = None

    def start(self, ready_timeout_s: float, stopped: threading.Event) -> None:
        """Start every child and wait until the cluster serves; ProcessError (`Interrupted`
        when `stopped` is set) when it does not."""
        plan, logs = self.plan, self.plan.state_dir / "logs"
        ignore_state_dir(plan.state_dir)
        logs.mkdir(parents=True, exist_ok=True)
        redis = start_redis(
            plan.redis_port, plan.state_dir / "redis", logs / "redis.log", persistent=True,
            password=plan.redis_password, maxmemory_bytes=plan.redis_maxmemory_bytes,
            stopped=stopped,
        )  # fmt: skip
        self.redis = self._supervised(
            redis,
            functools.partial(_redis_ready, plan.redis_port, plan.redis_password),
            "replicas keep serving the minds they hold, other minds answer 503 until it is "
            "back (its append-only file keeps the tier)",
        )
        print(f"cluster: redis-server {plan.redis_url_shown} (pid {redis.pid})", flush=True)
        procs = []
        for r in plan.replicas:
            r.slots_dir.mkdir(parents=True, exist_ok=True)
            argv, env = replica_argv(plan, r), replica_env(plan)
            procs.append(ManagedProcess(r.replica_id, argv, r.log_path, env=env))
        print(f"cluster: starting {len(plan.replicas)} replicas, logs in {logs}", flush=True)
        config_path = plan.state_dir / "haproxy.cfg"
        config_path.write_text(haproxy.render(haproxy_config(plan)))
        front = start_haproxy(config_path, logs / "haproxy.log")
        self.haproxy = self._supervised(
            front,
            functools.partial(_haproxy_answers, plan.socket_path),
            f"{plan.endpoint} answers nothing until it is back (the replicas keep their minds)",
        )
        for r, proc in zip(plan.replicas, procs, strict=True):
            self.replicas.append(
                Supervised(
                    proc,
                    functools.partial(healthy, r.url, 1.0),
                    plan.policy,
                    death="HAProxy sends its minds to the other replicas, which take them over "
                    "from the tier",
                    starting=True,
                )
            )
        self.write_state(running=True)  # `status` works while the replicas load
        for r, child in zip(plan.replicas, self.replicas, strict=True):
            child.proc.wait_for(
                functools.partial(healthy, r.url), ready_timeout_s, "healthy", stopped
            )
            child.became_ready()
            self.write_state(running=True)
            print(f"cluster: {r.replica_id} {r.url} healthy", flush=True)
        front.wait_for(
            lambda: _all_up(plan.socket_path, len(plan.replicas)), 60, "seeing every replica UP",
            stopped,
        )  # fmt: skip
        self.write_state(running=True)

    def _supervised(
        self, proc: ManagedProcess, ready: Callable[[], bool], death: str
    ) -> Supervised:
        return Supervised(proc, ready, self.plan.policy, death=death)

    def children(self) -> list[Supervised]:
        front = [self.haproxy] if self.haproxy else []
        back = [self.redis] if self.redis else []
        return [*front, *self.replicas, *back]

    def tick(self) -> None:
        """One supervision step of every child; cluster.json rewritten when one changed."""
        changed = [child.tick() for child in self.children()]
        if any(changed):
            self.write_state(running=True)

    def fatal(self) -> str | None:
        """Why the cluster cannot serve any more, if it cannot: HAProxy or Redis gave up, or
        every replica did."""
        for child in (self.haproxy, self.redis):
            if child is not None and child.state is ChildState.GAVE_UP:
                return f"{child.name} gave up"
        if self.replicas and all(r.state is ChildState.GAVE_UP for r in self.replicas):
            return "every replica gave up"
        return None

    def write_state(self, *, running: bool) -> None:
        plan = self.plan
        if self.redis is None or self.haproxy is None:
            return  # nothing started that anyone could reach
        doc = {
            "running": running,
            "pid": os.getpid(),
            "updated_unix_s": round(time.time(), 3),
            "endpoint": plan.endpoint,
            "haproxy": {**self.haproxy.view(), "config": str(plan.state_dir / "haproxy.cfg"),
                        "socket": str(plan.socket_path)},
            "redis": {**self.redis.view(), "url": plan.redis_url_shown,
                      "conf": str(plan.state_dir / "redis" / "redis.conf"),
                      "maxmemory_bytes": plan.redis_maxmemory_bytes},
            "replicas": [
                {"id": r.replica_id, "url": r.url, **s.view(), "slots": str(r.slots_dir)}
                for r, s in zip(plan.replicas, self.replicas, strict=True)
            ],
        }  # fmt: skip
        write_state(plan.state_path, doc)

    def stop(self, grace_s: float = 30.0) -> None:
        """HAProxy, then every replica at once, then Redis; SIGKILL past the grace."""
        if self.haproxy is not None:
            self.haproxy.proc.stop(grace_s)
        for r in self.replicas:
            r.proc.signal(signal.SIGTERM)
        for r in self.replicas:
            r.proc.stop(grace_s)
        if self.redis is not None:
            self.redis.proc.stop(grace_s)
        for child in self.children():
            child.stopped()
        self.write_state(running=False)


def run(plan: ClusterPlan, ready_timeout_s: float) -> int:
    """Start the cluster, supervise it until a signal (or until it cannot serve), stop it."""
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    cluster = Cluster(plan)
    status = 0
    try:
        cluster.start(ready_timeout_s, stop)
        _print_ready(cluster)
        while not stop.wait(TICK_S):
            cluster.tick()
            reason = cluster.fatal()
            if reason is not None:
                print(f"cluster: {reason}; stopping", file=sys.stderr, flush=True)
                status = 1
                break
    except Interrupted:
        print("cluster: stopped while starting", file=sys.stderr, flush=True)
    except ProcessError as err:
        print(f"cluster: {err}", file=sys.stderr, flush=True)
        status = 1
    finally:
        print("cluster: stopping", flush=True)
        cluster.stop()
        print("cluster: stopped", flush=True)
    return status


def _print_ready(cluster: Cluster) -> None:
    plan = cluster.plan
    d = f" --dir {plan.state_dir}"
    lines = [
        "kvswap cluster up: ready",
        f"  endpoint  {plan.endpoint}  (HAProxy: send X-Mind-Id; answers name their replica in "
        f"{haproxy.REPLICA_HEADER})",
        *(
            f"  replica   {r.replica_id} {r.url} (pid {s.proc.pid}, slots {r.slots_dir})"
            for r, s in zip(plan.replicas, cluster.replicas, strict=True)
        ),
        f"  redis     {plan.redis_url_shown} (password in {plan.state_dir / 'redis' / 'redis.conf'})",
        f"  haproxy   runtime API {plan.socket_path}",
        f"  state     {plan.state_path} (logs in {plan.state_dir / 'logs'})",
        f"  status    kvswap cluster status{d}",
        f"  drain     kvswap cluster drain r1{d}  (and `ready r1` to bring it back)",
        "  dies      a replica, Redis or HAProxy that dies is restarted (logged here)",
        "  stop      Ctrl-C, or kill -TERM this process",
    ]
    print("\n".join(lines), flush=True)
