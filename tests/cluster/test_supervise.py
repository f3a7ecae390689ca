"""`cluster.supervise` on real child processes (`sleep`, `sh -c 'exit N'`) with a test clock:
a child that dies is logged in one line and restarted after its back-off; it is `starting`
until its readiness probe passes; one that dies too often in a row is left down; one that
stayed up long enough starts a new row; one not ready in time is killed; a dead child never
shows a pid."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from kvswap.cluster.procs import ManagedProcess
from kvswap.cluster.supervise import ChildState, RestartPolicy, Supervised

pytestmark = pytest.mark.timeout(60)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Probe:
    def __init__(self) -> None:
        self.ready = False

    def __call__(self) -> bool:
        return self.ready


def _child(
    tmp_path: Path, argv: list[str], policy: RestartPolicy
) -> tuple[Supervised, Clock, Probe, list[str]]:
    clock, probe, said = Clock(), Probe(), list[str]()
    proc = ManagedProcess("child", argv, tmp_path / "child.log")
    return (
        Supervised(proc, probe, policy, death="it died", say=said.append, clock=clock),
        clock,
        probe,
        said,
    )


def _died(child: Supervised, sig: int | None = signal.SIGKILL) -> None:
    """Kill the child (or let it end by itself: `sig` None) and wait until it has exited."""
    if sig is not None:
        child.proc.signal(sig)
    child.proc.proc.wait(10)


def test_the_back_off_doubles_up_to_its_cap() -> None:
    policy = RestartPolicy(first_delay_s=1, max_delay_s=30)
    assert [policy.delay_s(n) for n in range(1, 8)] == [1, 2, 4, 8, 16, 30, 30]


def test_a_killed_child_is_restarted_after_its_back_off_then_up_once_ready(
    tmp_path: Path,
) -> None:
    child, clock, probe, said = _child(tmp_path, ["sleep", "30"], RestartPolicy())
    first_pid = child.pid
    assert child.state is ChildState.UP and first_pid is not None
    _died(child)
    assert child.tick() and child.state is ChildState.RESTARTING
    assert child.pid is None  # never a dead pid
    assert child.last_exit_status == -signal.SIGKILL
    (line,) = said
    assert line.startswith(f"cluster: child (pid {first_pid}) exited with status -9 (SIGKILL)")
    assert "it died" in line and "restarting in 1.0 s" in line and "child.log" in line
    clock.now += 0.9
    assert not child.tick()  # its back-off has not passed
    clock.now += 0.2
    assert child.tick() and child.state is ChildState.STARTING
    assert child.pid is not None and child.pid != first_pid and child.n_restarts == 1
    assert not child.tick()  # not ready yet
    probe.ready = True
    assert child.tick() and child.state is ChildState.UP
    assert said[-1].startswith("cluster: child is up again")
    child.proc.stop()


def test_a_child_dying_too_often_in_a_row_is_left_down(tmp_path: Path) -> None:
    policy = RestartPolicy(max_restarts=2, first_delay_s=1, stable_s=60)
    child, clock, _probe, said = _child(tmp_path, ["sh", "-c", "exit 3"], policy)
    delays = []
    for _ in range(2):
        _died(child, None)
        child.tick()
        assert child.state is ChildState.RESTARTING
        delays.append(child.restart_at - clock.now)
        clock.now = child.restart_at
        child.tick()
        assert child.state is ChildState.STARTING
    _died(child, None)
    child.tick()
    assert delays == [1, 2]
    assert child.state is ChildState.GAVE_UP and child.n_restarts == 2
    assert child.last_exit_status == 3 and child.pid is None
    assert "exited with status 3" in said[-1] and "gave up after 2 restarts" in said[-1]
    clock.now += 3600
    assert not child.tick() and child.state is ChildState.GAVE_UP  # never started again
    child.stopped()
    assert child.state is ChildState.GAVE_UP


def test_a_child_that_stayed_up_starts_a_new_row(tmp_path: Path) -> None:
    policy = RestartPolicy(max_restarts=1, stable_s=60)
    child, clock, probe, said = _child(tmp_path, ["sleep", "30"], policy)
    _died(child)
    child.tick()
    clock.now = child.restart_at
    child.tick()
    probe.ready = True
    child.tick()
    assert child.state is ChildState.UP and child.n_in_row == 1
    clock.now += 61  # up past stable_s: this exit is the first of a new row, not a second
    _died(child)
    child.tick()
    assert child.state is ChildState.RESTARTING and child.n_in_row == 1
    assert "restarting in 1.0 s" in said[-1]
    clock.now = child.restart_at
    child.tick()
    child.proc.stop()


def test_a_restart_not_ready_in_time_is_killed_and_counts_as_an_exit(tmp_path: Path) -> None:
    policy = RestartPolicy(start_timeout_s=5)
    child, clock, _probe, said = _child(tmp_path, ["sleep", "30"], policy)
    _died(child)
    child.tick()
    clock.now = child.restart_at
    child.tick()
    assert child.state is ChildState.STARTING
    clock.now += 6
    assert child.tick() and child.state is ChildState.RESTARTING
    assert child.last_exit_status == -signal.SIGKILL and not child.proc.alive()
    assert any("not ready after 5 s; killing it" in line for line in said)
    assert "restarting in 2.0 s" in said[-1]  # the second exit in a row


def test_its_view_is_what_cluster_json_shows(tmp_path: Path) -> None:
    child, _clock, _probe, _said = _child(tmp_path, ["sleep", "30"], RestartPolicy())
    view = child.view()
    assert view["state"] == "up" and view["pid"] == child.proc.pid
    _died(child)
    child.tick()
    assert child.view() | {"since_unix_s": 0} == {
        "state": "restarting",
        "pid": None,
        "n_restarts": 0,
        "last_exit_status": -9,
        "since_unix_s": 0,
        "log": str(tmp_path / "child.log"),
    }
