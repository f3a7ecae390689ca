"""A kvswap cluster of real processes for the cluster tests: redis-server, `kvswap serve`
replicas on a tiny model (`-t 1`, one slot each) joined through the shared tier, and HAProxy in
front with the generated config. Every replica runs with integrity checks on and appends its
lease events to one fence log (`KVSWAP_FENCE_LOG`), which `check_fence_log` reads.

Processes are started from the test's main thread (their parent-death signal follows the
thread that started them) and stopped by `Cluster.stop`.
"""

from __future__ import annotations

import itertools
import json
import signal
import sys
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from kvswap.cluster.haproxy import HaproxyConfig, Replica, render, server_status
from kvswap.cluster.procs import ManagedProcess, free_port, start_haproxy
from kvswap.cluster.up import healthy
from kvswap.tiny import tiny_model_path
from tests.cluster.faultproxy import FaultProxy
from tests.cluster.util import RedisServer, wait_until

# One slot each: a turn's batches are its own, so text matches across replicas and restores.
SERVE = ("-c", "2048", "-np", "1", "-t", "1", "-tb", "1", "--metrics", "--cache-ram", "0")
LEASE_MS = 1500


def tiny_model() -> Path:
    return tiny_model_path("llama", seed=7, vocab="tiny")


class KvswapReplica:
    """One `kvswap serve` replica of the cluster (restartable on its port)."""

    def __init__(self, replica_id: str, root: Path, redis_url: str, flags: list[str]) -> None:
        self.replica_id = replica_id
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.slots = root / replica_id / "slots"
        self.slots.mkdir(parents=True)
        self.log_path = root / "logs" / f"{replica_id}.log"
        self.fence_log = root / "fence.log"
        self.argv = [
            sys.executable, "-m", "kvswap", "serve", "-m", str(tiny_model()), *flags,
            "--host", "127.0.0.1", "--port", str(self.port), "--slot-save-path", str(self.slots),
            "--shared-tier", redis_url, "--replica-id", replica_id, "--advertise-url", self.url,
        ]  # fmt: skip
        self.proc: ManagedProcess | None = None
        self.http = httpx.Client(base_url=self.url, timeout=120)

    def start(self) -> None:
        env = {"KVSWAP_CHECK_INTEGRITY": "1", "KVSWAP_FENCE_LOG": str(self.fence_log)}
        self.proc = ManagedProcess(self.replica_id, self.argv, self.log_path, env=env)

    def wait_healthy(self) -> None:
        assert self.proc is not None
        self.proc.wait_for(lambda: healthy(self.url), 180, "healthy")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.alive()

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.signal(sig)

    def kill(self) -> None:
        """kill -9, and reap it."""
        assert self.proc is not None
        self.proc.signal(signal.SIGKILL)
        self.proc.proc.wait(30)

    def stop(self) -> int:
        return self.proc.stop(60) if self.proc is not None else 0

    def wait_exit(self, timeout_s: float = 60) -> int:
        """Its exit status, once it has exited by itself (after a signal)."""
        assert self.proc is not None
        return self.proc.proc.wait(timeout_s)

    def log(self) -> str:
        return self.proc.log_tail(6000) if self.proc is not None else ""

    def metrics(self) -> dict[str, float]:
        out = {}
        for line in self.http.get("/metrics").text.splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                out[name.removeprefix("llamacpp:")] = float(value)
        return out

    def shared(self) -> dict[str, Any]:
        """/pages' shared-tier part."""
        body: dict[str, Any] = self.http.get("/pages").json()["shared_tier"]
        return body


class Cluster:
    """Redis, the replicas and HAProxy; see the module docstring."""

    def __init__(
        self,
        root: Path,
        n_replicas: int,
        flags: list[str],
        *,
        persistent_redis: bool = False,
        proxied: bool = False,
    ) -> None:
        """`proxied`: each replica reaches Redis through a fault proxy of its own
        (`proxies[replica_id]`), so a test can cut one off, delay or reset its link."""
        self.root = root
        self.redis = RedisServer.start(root / "redis", persistent=persistent_redis)
        (root / "logs").mkdir(parents=True, exist_ok=True)
        self.fence_log = root / "fence.log"
        flags = [*SERVE, "--shared-tier-lease-ms", str(LEASE_MS), *flags]
        ids = [f"r{i}" for i in range(1, n_replicas + 1)]
        self.proxies = {rid: FaultProxy(self.redis.port).start() for rid in ids if proxied}
        self.replicas = {
            rid: KvswapReplica(
                rid, root, self.proxies[rid].url if proxied else self.redis.url, flags
            )
            for rid in ids
        }
        peers = ",".join(r.url for r in self.replicas.values())
        for r in self.replicas.values():
            r.argv += ["--shared-tier-peers", peers]
        self.haproxy: ManagedProcess | None = None
        self.socket = str(root / "haproxy.sock")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        for r in self.replicas.values():
            r.start()
        for r in self.replicas.values():
            r.wait_healthy()
        cfg = HaproxyConfig(
            tuple(Replica(r.replica_id, "127.0.0.1", r.port) for r in self.replicas.values()),
            port=self.port,
            socket_path=self.socket,
            check_inter_ms=200,
        )
        (self.root / "haproxy.cfg").write_text(render(cfg))
        self.haproxy = start_haproxy(self.root / "haproxy.cfg", self.root / "logs" / "haproxy.log")
        self.haproxy.wait_for(lambda: Path(self.socket).exists(), 30, "listening")
        for rid in self.replicas:
            self.wait_status(rid, "UP")

    def wait_status(self, replica_id: str, status: str, timeout_s: float = 60) -> None:
        wait_until(
            lambda: server_status(self.socket).get(replica_id, "").startswith(status),
            timeout_s,
            f"haproxy to see {replica_id} {status}",
        )

    def restart(self, replica_id: str) -> None:
        """Start a replica that died again (a new incarnation), and wait until HAProxy uses it."""
        r = self.replicas[replica_id]
        assert not r.alive()
        r.start()
        r.wait_healthy()
        self.wait_status(replica_id, "UP")

    def ensure_all_up(self) -> None:
        for rid, r in self.replicas.items():
            if not r.alive():
                self.restart(rid)

    def stop(self) -> None:
        if self.haproxy is not None:
            self.haproxy.stop()
        for r in self.replicas.values():
            r.http.close()
            if r.alive():
                r.signal(signal.SIGCONT)  # a test that failed while one was stopped
                r.signal(signal.SIGTERM)
        for r in self.replicas.values():
            r.stop()
        for proxy in self.proxies.values():
            proxy.stop()
        self.redis.stop()

    def logs(self) -> str:
        return "\n".join(f"--- {rid}\n{r.log()}" for rid, r in self.replicas.items())


@contextmanager
def running(root: Path, flags: list[str], *, persistent_redis: bool = False) -> Iterator[Cluster]:
    """A started cluster of three replicas (its logs printed when the block fails)."""
    c = Cluster(root, 3, flags, persistent_redis=persistent_redis)
    try:
        c.start()
        yield c
    except BaseException:
        print(c.logs())
        raise
    finally:
        c.stop()


def check_fence_log(path: Path) -> int:
    """Every mind's lease intervals, on Redis's clock, never overlap and fences only grow: a
    holder holds from its acquisition until its release or its last renewal plus the lease's
    TTL. Returns the number of (mind, fence) intervals checked."""
    events: dict[str, dict[int, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for line in path.read_text().splitlines():
        e = json.loads(line)
        events[e["mind"]][e["fence"]].append(e)
    n = 0
    for mind, fences in events.items():
        intervals = []
        for fence, evs in sorted(fences.items()):
            holders = {(e["replica"], e["token"]) for e in evs}
            assert len(holders) == 1, f"mind {mind} fence {fence} had holders {holders}"
            acquired = [e["t_ms"] for e in evs if e["event"] == "acquire"]
            assert acquired, f"mind {mind} fence {fence} used without an acquisition: {evs}"
            released = [e["t_ms"] for e in evs if e["event"] == "release" and e["t_ms"]]
            renewed = [e["t_ms"] for e in evs if e["event"] in ("acquire", "renew")]
            end = min(released) if released else max(renewed) + evs[0]["ttl_ms"]
            intervals.append((fence, min(acquired), end))
            n += 1
        for (f0, _, end0), (f1, start1, _) in itertools.pairwise(intervals):
            assert f1 > f0
            # 1 ms: a script's TIME and the clock Redis expires keys by are read microseconds
            # apart, each rounded down to milliseconds
            assert start1 >= end0 - 1, f"mind {mind}: fence {f1} taken at {start1} before {end0}"
    return n
