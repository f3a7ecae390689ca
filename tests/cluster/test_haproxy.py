"""The generated HAProxy config in a real haproxy in front of stand-in replicas: minds stay on
one replica, spread evenly, move only when their replica drains or dies; requests naming no
mind are balanced; every answer names its replica."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from kvswap.cluster.haproxy import (
    REPLICA_HEADER,
    HaproxyConfig,
    HaproxyConfigError,
    Replica,
    parse_replica,
    render,
    server_status,
    set_state,
)
from kvswap.cluster.procs import ManagedProcess, free_port, haproxy_check, start_haproxy
from tests.cluster.util import wait_until

pytestmark = pytest.mark.timeout(120)
REPO = Path(__file__).resolve().parents[2]
IDS = ("r1", "r2", "r3")
MINDS = [f"mind-{i}" for i in range(30)]
KEY = {"Authorization": "Bearer tenant-a"}


@dataclass
class Cluster:
    url: str
    socket: str
    standins: dict[str, subprocess.Popen[str]]
    ports: dict[str, int]
    haproxy: ManagedProcess
    http: httpx.Client

    def ask(self, mind: str | None = None, headers: dict[str, str] | None = None) -> str:
        """The replica that answers a request (and checks the header names it truly)."""
        h = {**KEY, **(headers or {})}
        if mind is not None:
            h["X-Mind-Id"] = mind
        r = self.http.post("/v1/chat/completions", headers=h, json={"messages": []})
        assert r.status_code == 200, r.text
        assert r.headers[REPLICA_HEADER] == r.json()["replica"]
        return str(r.json()["replica"])

    def placement(self, minds: list[str]) -> dict[str, str]:
        return {m: self.ask(m) for m in minds}

    def wait_status(self, replica_id: str, status: str) -> None:
        wait_until(
            lambda: server_status(self.socket).get(replica_id, "").startswith(status),
            30,
            f"haproxy to see {replica_id} {status}",
        )


@pytest.fixture()
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    replicas, standins = [], {}
    for replica_id in IDS:
        port = free_port()
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.cluster.standin", replica_id, str(port)],
            stdout=subprocess.PIPE,
            cwd=REPO,
            text=True,
        )
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        standins[replica_id] = proc
        replicas.append(Replica(replica_id, "127.0.0.1", port))
    port = free_port()
    sock = str(tmp_path / "haproxy.sock")
    cfg = HaproxyConfig(tuple(replicas), port=port, socket_path=sock, check_inter_ms=200)
    (tmp_path / "haproxy.cfg").write_text(render(cfg))
    haproxy = start_haproxy(tmp_path / "haproxy.cfg", tmp_path / "haproxy.log")
    url = f"http://127.0.0.1:{port}"
    ports = {r.replica_id: r.port for r in replicas}
    c = Cluster(url, sock, standins, ports, haproxy, httpx.Client(base_url=url, timeout=30))
    try:
        haproxy.wait_for(lambda: Path(sock).exists(), 30, "listening on its runtime socket")
        for replica_id in IDS:
            c.wait_status(replica_id, "UP")
        yield c
    finally:
        c.http.close()
        haproxy.stop()
        for proc in standins.values():
            proc.kill()
            proc.wait(10)


def test_configs_are_valid_haproxy(tmp_path: Path) -> None:
    local = HaproxyConfig(
        tuple(parse_replica(f"r{i}=http://127.0.0.1:{8080 + i}") for i in (1, 2, 3))
    )
    dns = HaproxyConfig(
        (
            parse_replica("kvswap-0=http://kvswap-0.kvswap:8080"),
            parse_replica("kvswap-1=kvswap-1.kvswap:8080"),
        ),
        bind="0.0.0.0",
        dns=True,
    )
    for name, cfg in (("local", local), ("dns", dns)):
        path = tmp_path / f"{name}.cfg"
        path.write_text(render(cfg))
        assert "Configuration file is valid" in haproxy_check(path)


def test_server_ids_follow_replica_ids_not_their_order() -> None:
    a = [parse_replica(f"r{i}=127.0.0.1:{9000 + i}") for i in range(5)]
    assert [r.server_id for r in a] == [r.server_id for r in reversed(a)][::-1]
    assert len({r.server_id for r in a}) == 5
    with pytest.raises(HaproxyConfigError, match="--replica 'r1'"):
        parse_replica("r1")
    with pytest.raises(HaproxyConfigError, match="http://host:port"):
        parse_replica("r1=https://h:1")
    with pytest.raises(HaproxyConfigError, match="repeat"):
        HaproxyConfig((a[0], a[0]))


def test_a_mind_stays_on_one_replica_and_minds_spread(cluster: Cluster) -> None:
    first = cluster.placement(MINDS)
    for _ in range(2):
        assert cluster.placement(MINDS) == first
    counts = Counter(first.values())
    print("minds per replica:", dict(counts))
    mean = len(MINDS) / len(IDS)
    assert set(counts) == set(IDS)
    assert max(counts.values()) <= 1.5 * mean and min(counts.values()) >= mean / 1.5, counts
    # the API key is part of the route: the same mind names of another tenant land elsewhere
    other = {m: cluster.ask(m, {"Authorization": "Bearer tenant-b"}) for m in MINDS}
    assert sum(other[m] != first[m] for m in MINDS) >= len(MINDS) // 4


def test_the_body_mind_routes_small_bodies_and_no_mind_is_balanced(cluster: Cluster) -> None:
    for mind in MINDS[:10]:
        r = cluster.http.post("/completion", headers=KEY, json={"prompt": "hi", "mind": mind})
        assert r.headers[REPLICA_HEADER] == cluster.ask(mind)
    anonymous = Counter(cluster.ask() for _ in range(30))
    assert set(anonymous) == set(IDS) and min(anonymous.values()) >= 5, anonymous
    # past HAProxy's 16 KiB buffer the body is not parsed: still answered; the header routes it
    big = {"prompt": "x" * 40_000, "mind": MINDS[0]}
    assert cluster.http.post("/completion", headers=KEY, json=big).status_code == 200
    r = cluster.http.post("/completion", headers={**KEY, "X-Mind-Id": MINDS[0]}, json=big)
    assert r.headers[REPLICA_HEADER] == cluster.ask(MINDS[0])


def test_a_session_key_routes_as_the_mind_it_names(cluster: Cluster) -> None:
    """Defect caught: a client that names no mind but sends a session key (Codex's
    prompt_cache_key, X-Conversation-Id, Claude Code's session header) balanced round robin,
    so each turn lands on another replica and is forwarded to its mind's owner (a hop a turn).
    Each routes as the mind of that name, in kvswap's order; Codex's 40 KB bodies, whose key
    HAProxy cannot read, by the `session-id` header it sends with them."""
    for mind in MINDS[:8]:
        home = cluster.ask(mind)
        body = {"messages": [], "prompt_cache_key": mind}
        for headers, json in [
            ({}, body),
            ({"X-Conversation-Id": mind}, {"messages": []}),
            ({"x-claude-code-session-id": mind}, {"messages": []}),
            ({"X-Conversation-Id": "another-conversation"}, body),  # the body's key first
            # Codex: a body past HAProxy's buffer, its key last, the same id in a header
            ({"session-id": mind}, {"input": "x" * 40_000, "prompt_cache_key": mind}),
        ]:
            r = cluster.http.post("/v1/chat/completions", headers={**KEY, **headers}, json=json)
            assert r.headers[REPLICA_HEADER] == home, (mind, headers)


def test_draining_a_replica_moves_only_its_minds(cluster: Cluster) -> None:
    before = cluster.placement(MINDS)
    set_state(cluster.socket, "r2", "drain")
    cluster.wait_status("r2", "DRAIN")
    during = cluster.placement(MINDS)
    for mind in MINDS:
        if before[mind] == "r2":
            assert during[mind] != "r2"
        else:
            assert during[mind] == before[mind]
    set_state(cluster.socket, "r2", "ready")
    cluster.wait_status("r2", "UP")
    assert cluster.placement(MINDS) == before  # back home: the ring did not change


def test_a_dead_replicas_minds_move_and_no_request_fails(cluster: Cluster) -> None:
    before = cluster.placement(MINDS)
    cluster.standins["r3"].kill()
    cluster.standins["r3"].wait(10)
    # before the health check notices, connection failures are retried on another replica
    during = cluster.placement(MINDS)
    assert "r3" not in during.values()
    cluster.wait_status("r3", "DOWN")
    after = cluster.placement(MINDS)
    for mind in MINDS:
        assert (after[mind] != "r3") if before[mind] == "r3" else (after[mind] == before[mind])


def test_a_request_that_reached_a_replica_is_never_replayed(cluster: Cluster) -> None:
    """The replica read the turn and hung up: HAProxy answers 502 and sends it nowhere else."""
    r = cluster.http.post("/hangup", headers={**KEY, "X-Mind-Id": MINDS[0]}, json={"prompt": "x"})
    assert r.status_code == 502
    seen = {
        rid: httpx.get(f"http://127.0.0.1:{port}/hangups").json()["n"]
        for rid, port in cluster.ports.items()
    }
    assert sum(seen.values()) == 1 and seen[cluster.ask(MINDS[0])] == 1, seen
