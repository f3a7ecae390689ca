"""A `kvswap cluster up --replicas 2` of real processes keeps serving through a replica's death,
and is steered from another terminal (`kvswap cluster status`, `drain`, `ready`).

- drain/ready: `kvswap cluster drain r1` puts r1 in DRAIN (read back through HAProxy's runtime
  API); while drained, every new mind is served by r2; `ready r1` brings it back to UP, and new
  minds land on r1 again.
- SIGKILL of the replica that served a mind (found by `X-Kvswap-Replica`), after the mind sat
  idle past the default quiet period (`--shared-tier-quiet-seconds`, 2 s: its page published,
  read back on /pages): the other replica's mind keeps getting answers through HAProxy meanwhile;
  the killed replica is restarted by `cluster up` (`status` shows it up again, restarts 1, a new
  pid, last exit -9); the mind's next turn succeeds and prefills only its new tokens (its
  cache_n and prompt_n equal a fault-free run of the same conversation).
- SIGKILL of HAProxy, then of Redis: each is one line on `cluster up`'s output and restarted
  (`status`: up again, restarts 1, a new pid), and minds are served through the endpoint again.
- `cluster up` right after a stop, on the same ports and folder (sockets in TIME-WAIT): it
  comes up and serves.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from kvswap.cluster.haproxy import server_status
from tests.cluster import workload
from tests.cluster.upcluster import ClusterUp
from tests.cluster.util import wait_until
from tests.cluster.workload import ChatClient, Conversation, TurnResult

pytestmark = [pytest.mark.model, pytest.mark.timeout(600)]
SERVE = ["-c", "2048", "-np", "1", "--cache-ram", "0", "--shared-tier-lease-ms", "1500"]


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterUp]:
    cluster = ClusterUp(tmp_path_factory.mktemp("up") / "cluster", 2, SERVE)
    try:
        cluster.start()
        yield cluster
    except BaseException:
        print(cluster.output())
        raise
    finally:
        cluster.close()


def _replica_of_new_mind(up: ClusterUp, name: str) -> str:
    """The replica that serves the first turn of a mind nobody has used yet."""
    client = ChatClient(up.url, retries=0)
    return workload.chat_turn(client, Conversation(99, name), 1, n_predict=2).replica


def test_drain_and_ready_move_new_minds(up: ClusterUp) -> None:
    socket = up.state()["haproxy"]["socket"]
    drained = up.cli("drain", "r1")
    assert drained.returncode == 0 and drained.stdout.strip() == "r1: DRAIN", drained
    assert server_status(socket)["r1"] == "DRAIN"
    while_drained = {_replica_of_new_mind(up, f"drained-{i}") for i in range(6)}
    assert while_drained == {"r2"}
    ready = up.cli("ready", "r1")
    assert ready.returncode == 0 and ready.stdout.strip() == "r1: UP", ready
    assert server_status(socket)["r1"].startswith("UP")
    after = {_replica_of_new_mind(up, f"ready-{i}") for i in range(12)}
    assert "r1" in after
    unknown = up.cli("drain", "r9")
    assert unknown.returncode == 1 and "no replica 'r9'" in unknown.stderr


def _published(up: ClusterUp, replica_id: str, mind: str) -> bool:
    url = up.replica(replica_id)["url"]
    held = httpx.get(f"{url}/pages", timeout=30).json()["shared_tier"]["held"]
    entry = next((h for h in held if h["mind"] == mind), None)
    return entry is not None and entry["n_unpublished"] == 0 and not entry["dirty"]


def _other_mind_on(up: ClusterUp, replica_id: str) -> Conversation:
    for i in range(40):
        conv = Conversation(50 + i, f"other-{i}")
        client = ChatClient(up.url, retries=0)
        if workload.chat_turn(client, conv, 1, n_predict=2).replica == replica_id:
            return conv
    raise AssertionError(f"no mind of 40 landed on {replica_id}")


class Chatter:
    """A mind chatting through HAProxy on a thread until stopped: its answers and failures."""

    def __init__(self, up: ClusterUp, conv: Conversation) -> None:
        self.client = ChatClient(up.url, retries=0)
        self.conv = conv
        self.done: list[TurnResult] = []
        self.failed: list[str] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run)
        self.thread.start()

    def _run(self) -> None:
        turn = 2
        while not self.stop.is_set():
            self.conv.messages = self.conv.messages[:1]  # a short conversation, turn after turn
            try:
                self.done.append(workload.chat_turn(self.client, self.conv, turn, n_predict=2))
            except workload.BrokenTurn as err:
                self.failed.append(str(err))
            turn += 1

    def finish(self) -> None:
        self.stop.set()
        self.thread.join(120)


def test_a_killed_replica_is_restarted_and_its_mind_resumes(up: ClusterUp) -> None:
    control = workload.run(up.url, [Conversation(0, "control")], (1, 2, 3), n_threads=1)
    mind = Conversation(0, "alice")
    client = ChatClient(up.url)
    turns = [workload.chat_turn(client, mind, t) for t in (1, 2)]
    owner = turns[0].replica
    assert turns[1].replica == owner
    survivor = next(r["id"] for r in up.state()["replicas"] if r["id"] != owner)
    wait_until(lambda: _published(up, owner, "alice"), 60, "alice's page to be published")
    victim: dict[str, Any] = up.replica(owner)
    other = Chatter(up, _other_mind_on(up, survivor))
    try:
        wait_until(lambda: len(other.done) >= 1, 60, "the other mind to chat")
        psutil.Process(victim["pid"]).kill()
        n_before = len(other.done)
        resumed = workload.chat_turn(client, mind, 3)

        def restarted() -> bool:
            r = next(r for r in up.status()["replicas"] if r["id"] == owner)
            return r["state"] == "up" and r["haproxy"] is not None and r["haproxy"] == "UP"

        wait_until(restarted, 120, f"{owner} to be restarted")
        n_during = len(other.done) - n_before
    finally:
        other.finish()
    now = next(r for r in up.status()["replicas"] if r["id"] == owner)
    assert now["n_restarts"] == 1 and now["last_exit_status"] == -9
    assert now["pid"] not in (None, victim["pid"]) and psutil.pid_exists(now["pid"])
    assert f"cluster: {owner} (pid {victim['pid']}) exited with status -9 (SIGKILL)" in up.output()
    assert not other.failed, other.failed
    assert n_during >= 1  # the other mind was answered while the victim was down or starting
    assert {t.replica for t in other.done} == {survivor}
    print(
        f"resumed turn 3 on {resumed.replica}: cache_n {resumed.cache_n} prompt_n "
        f"{resumed.prompt_n} (fault-free: {control[(0, 3)].cache_n} / {control[(0, 3)].prompt_n}), "
        f"{resumed.n_attempts} request(s) (a request that reaches the dying replica's listen "
        "queue is cut, and the OpenAI client sends it again)"
    )
    assert (resumed.cache_n, resumed.prompt_n) == (
        control[(0, 3)].cache_n,
        control[(0, 3)].prompt_n,
    )
    assert resumed.text == control[(0, 3)].text
    after = workload.chat_turn(client, mind, 4)  # and the mind goes on
    assert after.cache_n > 0
    holder = next(r for r in up.status()["replicas"] if r["id"] == after.replica)
    assert holder["n_minds_held"] >= 1  # `status` shows the minds each replica holds
    # ... and every replica's /pages (the web page's line) the supervisor's view of each
    seen = httpx.get(f"{holder['url']}/pages", timeout=30).json()["shared_tier"]["replicas"]
    assert {(r["id"], r["state"], r["n_restarts"]) for r in seen} == {
        (owner, "up", 1),
        (survivor, "up", 0),
    }


def _restarted(up: ClusterUp, name: str, old_pid: int) -> bool:
    child = up.status()[name]
    return child["state"] == "up" and child["pid"] not in (None, old_pid)


@pytest.mark.parametrize("name", ["haproxy", "redis"])
def test_haproxy_and_redis_deaths_are_one_line_and_a_restart(up: ClusterUp, name: str) -> None:
    before = up.status()[name]
    psutil.Process(before["pid"]).kill()
    wait_until(lambda: _restarted(up, name, before["pid"]), 120, f"{name} to be restarted")
    after = up.status()[name]
    assert after["n_restarts"] == before["n_restarts"] + 1 and after["last_exit_status"] == -9
    program = "haproxy" if name == "haproxy" else "redis-server"
    deaths = [
        line for line in up.output().splitlines()
        if line.startswith(f"cluster: {program} (pid {before['pid']}) exited")
    ]  # fmt: skip
    assert len(deaths) == 1 and "status -9 (SIGKILL)" in deaths[0], deaths
    socket = up.state()["haproxy"]["socket"]
    wait_until(
        lambda: all(s.startswith("UP") for s in server_status(socket).values()),
        60,
        "HAProxy to see every replica UP",
    )
    conv = Conversation(7, f"after-{name}")
    client = ChatClient(up.url)  # the OpenAI client's one retry: Redis may be loading its AOF
    assert workload.chat_turn(client, conv, 1).text
    assert workload.chat_turn(client, conv, 2).cache_n > 0


def test_cluster_up_starts_again_right_after_a_stop(tmp_path: Path) -> None:
    first = ClusterUp(tmp_path / "cluster", 1, ["-c", "512", "-np", "1"])
    try:
        first.start()
        for i in range(3):  # connections through HAProxy to the replica, closed: TIME-WAIT
            _replica_of_new_mind(first, f"m{i}")
        assert first.stop() == 0
    finally:
        first.close()
    again = ClusterUp(
        tmp_path / "cluster", 1, ["-c", "512", "-np", "1"],
        port=first.port, redis_port=first.redis_port,
    )  # fmt: skip
    try:
        again.start(timeout_s=120)
        assert _replica_of_new_mind(again, "after") == "r1"
    finally:
        again.close()
