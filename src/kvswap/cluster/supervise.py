"""Supervision of `kvswap cluster up`'s children: a child that dies is started again.

Each child (a replica, redis-server, HAProxy) is a `Supervised`: its process, its state
(`ChildState`) and its restart record. `tick` is called by the supervision loop about five
times a second; it never blocks for long (a readiness probe of one second at most):

- a running child that exited is logged in one line (its exit status, its log, what its death
  means for the cluster) and restarted after a back-off (`RestartPolicy`: 1 s, 2 s, 4 s ...
  up to 30 s);
- a restarted child is `starting` until its readiness probe passes (a replica: /health 200;
  Redis: PING; HAProxy: its runtime API answers), then `up`; one that is not ready within the
  start timeout is killed and counts as an exit;
- a child that exits more than `max_restarts` times in a row is left down (`gave up`); a child
  that stayed up `stable_s` starts its count again.

The restart runs the same command line, environment and log file (`ManagedProcess.respawn`).
Only the main thread calls `tick` (a child's parent-death signal follows the thread that
started it).

Owns the restart policy and each child's state; the order of a stop and what a gave-up child
means for the cluster are `up`'s.
"""

from __future__ import annotations

import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from kvswap.cluster.procs import ManagedProcess, exit_text


class ChildState(StrEnum):
    STARTING = "starting"  # started or restarted, its readiness probe not passed yet
    UP = "up"
    RESTARTING = "restarting"  # exited; started again once its back-off has passed
    GAVE_UP = "gave up"  # exited more often in a row than the policy allows; left down
    STOPPED = "stopped"  # stopped by `cluster up` itself


@dataclass(frozen=True)
class RestartPolicy:
    max_restarts: int = 5  # restarts in a row (each exiting before `stable_s`) before giving up
    first_delay_s: float = 1.0
    max_delay_s: float = 30.0
    stable_s: float = 60.0  # up this long: the next exit is the first of a new row
    start_timeout_s: float = 600.0  # a restart not ready by then is killed (an exit)

    def __post_init__(self) -> None:
        if self.max_restarts < 0:
            raise ValueError(f"--max-restarts {self.max_restarts}: 0 or more")

    def delay_s(self, n_in_row: int) -> float:
        """The back-off before the `n_in_row`-th restart of a row (1-based)."""
        return min(self.max_delay_s, self.first_delay_s * 2 ** (n_in_row - 1))


class Supervised:
    """One child under supervision (see the module docstring)."""

    def __init__(
        self,
        proc: ManagedProcess,
        ready: Callable[[], bool],
        policy: RestartPolicy,
        *,
        death: str,
        say: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True),
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        starting: bool = False,
    ) -> None:
        """`proc` has been started and found ready (`starting`: not yet, see `became_ready`);
        `death` says what its death means for the cluster (one clause of the log line)."""
        self.proc = proc
        self.ready = ready
        self.policy = policy
        self.death = death
        self.say = say
        self.clock = clock
        self.wall = wall
        self.state = ChildState.STARTING if starting else ChildState.UP
        self.n_restarts = 0
        self.n_in_row = 0
        self.last_exit_status: int | None = None
        self.started_at = clock()
        self.restart_at = 0.0
        self.since_unix_s = wall()

    @property
    def name(self) -> str:
        return self.proc.name

    @property
    def pid(self) -> int | None:
        """Its pid while it runs (starting or up), else None: a dead pid is never shown."""
        running = self.state in (ChildState.STARTING, ChildState.UP) and self.proc.alive()
        return self.proc.pid if running else None

    def view(self) -> dict[str, Any]:
        """Its part of cluster.json."""
        return {
            "state": str(self.state),
            "pid": self.pid,
            "n_restarts": self.n_restarts,
            "last_exit_status": self.last_exit_status,
            "since_unix_s": round(self.since_unix_s, 3),
            "log": str(self.proc.log_path),
        }

    def tick(self) -> bool:
        """One supervision step; True when its state changed."""
        now = self.clock()
        if self.state in (ChildState.STARTING, ChildState.UP) and not self.proc.alive():
            self._exited(now)
        elif self.state is ChildState.RESTARTING and now >= self.restart_at:
            self._restart(now)
        elif self.state is ChildState.STARTING:
            if self.ready():
                self._set(ChildState.UP)
                self.say(
                    f"cluster: {self.name} is up again (pid {self.proc.pid}, restart "
                    f"{self.n_restarts}, ready after {now - self.started_at:.1f} s)"
                )
            elif now - self.started_at > self.policy.start_timeout_s:
                self.say(
                    f"cluster: {self.name} not ready after {self.policy.start_timeout_s:.0f} s; "
                    "killing it"
                )
                self.proc.signal(signal.SIGKILL)
                self.proc.proc.wait(10)
                self._exited(now)
            else:
                return False
        else:
            return False
        return True

    def became_ready(self) -> None:
        """Its first start, waited for by `cluster up` itself, is done."""
        self._set(ChildState.UP)

    def stopped(self) -> None:
        """`cluster up` stopped it (or it had exited): it is not restarted any more."""
        if self.state is not ChildState.GAVE_UP:
            self.last_exit_status = self.proc.proc.returncode
            self._set(ChildState.STOPPED)

    def _set(self, state: ChildState) -> None:
        self.state = state
        self.since_unix_s = self.wall()

    def _exited(self, now: float) -> None:
        pid, status = self.proc.pid, self.proc.proc.returncode
        self.last_exit_status = status
        if now - self.started_at >= self.policy.stable_s:
            self.n_in_row = 0
        self.n_in_row += 1
        if self.n_in_row > self.policy.max_restarts:
            self._set(ChildState.GAVE_UP)
            self.say(
                f"cluster: {self.name} (pid {pid}) exited with {exit_text(status)}: "
                f"{self.death}; gave up after {self.policy.max_restarts} restarts in a row "
                f"(log {self.proc.log_path})"
            )
            return
        delay_s = self.policy.delay_s(self.n_in_row)
        self.restart_at = now + delay_s
        self._set(ChildState.RESTARTING)
        self.say(
            f"cluster: {self.name} (pid {pid}) exited with {exit_text(status)}: {self.death}; "
            f"restarting in {delay_s:.1f} s ({self.n_in_row} of at most "
            f"{self.policy.max_restarts} in a row; log {self.proc.log_path})"
        )

    def _restart(self, now: float) -> None:
        self.started_at = now
        self.n_restarts += 1
        try:
            self.proc.respawn()
        except OSError as err:  # the program vanished, no memory for a fork, ...
            self.say(f"cluster: {self.name} could not be started again: {err}")
            self._exited(now)
            return
        self._set(ChildState.STARTING)
        self.say(f"cluster: {self.name} restarted (pid {self.proc.pid}, restart {self.n_restarts})")
