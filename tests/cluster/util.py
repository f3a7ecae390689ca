"""Helpers of the cluster tests: a real redis-server, synthetic pages, lease waits."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import redis

from kvswap.cluster.procs import ManagedProcess, free_port, start_redis
from kvswap.core.page import PageGeometry, PageLayout, plan_layout, write_tokens
from kvswap.tiers.shared.connection import connect
from kvswap.tiers.shared.keys import MindKeys
from kvswap.tiers.shared.lease import Incarnation, Leases

GEOMETRY = PageGeometry("sha256:test-model", "f16", "f16", 1, 4096)


@dataclass
class RedisServer:
    """A redis-server process on a free loopback port, as the shared tier runs it (with an
    append-only file when `persistent`: a restart keeps its data)."""

    port: int
    data_dir: Path
    proc: ManagedProcess
    persistent: bool = False

    @classmethod
    def start(cls, data_dir: Path, persistent: bool = False) -> RedisServer:
        port = free_port()
        proc = start_redis(port, data_dir, data_dir / "redis.log", persistent=persistent)
        return cls(port, data_dir, proc, persistent)

    def restart(self) -> None:
        """Start it again on its port and data (after `stop`)."""
        log = self.data_dir / "redis.log"
        self.proc = start_redis(self.port, self.data_dir, log, persistent=self.persistent)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self) -> redis.Redis:
        return connect(self.url)

    def stop(self) -> None:
        self.proc.stop()


def synthetic_page(
    n_tokens: int, target_bytes: int, seed: int = 0
) -> tuple[memoryview, PageLayout]:
    """A page of random state bytes (not a KV layout: stored as one opaque section)."""
    layout = plan_layout(n_tokens, target_bytes, GEOMETRY)
    rng = np.random.default_rng(seed)
    buf = memoryview(bytearray(rng.bytes(layout.n_bytes)))
    write_tokens(buf, layout, np.arange(n_tokens, dtype=np.int32))
    return buf, layout


def grown_page(
    page: memoryview, layout: PageLayout, n_more_tokens: int, n_more_bytes: int, seed: int = 1
) -> tuple[memoryview, PageLayout]:
    """`page` grown by appending: its tokens and state bytes first, new ones after (a
    publication of it is a delta when the growth is small)."""
    grown = plan_layout(
        layout.n_tokens + n_more_tokens, layout.target.n_bytes + n_more_bytes, GEOMETRY
    )
    rng = np.random.default_rng(seed)
    buf = memoryview(bytearray(rng.bytes(grown.n_bytes)))
    write_tokens(buf, grown, np.arange(grown.n_tokens, dtype=np.int32))
    old = page[layout.target.offset : layout.target.end]
    buf[grown.target.offset : grown.target.offset + len(old)] = old
    return buf, grown


def wait_until(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    """Poll a condition with a deadline (never a bare sleep as synchronisation)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.01)


def wait_lease_free(leases: Leases, keys: MindKeys, timeout_s: float = 10) -> None:
    wait_until(lambda: leases.holder(keys) is None, timeout_s, "the lease to expire")


def incarnation(replica_id: str) -> Incarnation:
    """A process incarnation of replica `replica_id` (a fresh random token each call)."""
    return Incarnation.new(replica_id, f"http://127.0.0.1:1/{replica_id}")
