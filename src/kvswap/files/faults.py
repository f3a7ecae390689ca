"""Hooks for the fault seam of `osio.OsAdapter`: count steps, fail one, or die at one.

Test support. A test runs an operation once with a `StepCounter` to enumerate its OS steps, then
once per step k with `FailAt(k)` (an `OSError` at that step, before or after it happens) or, in
a subprocess, `KillAt(k)` (the process ends right after step k, as a crash would leave it).

The one production use is the crash tests' seam into a real server: `kill_seam_from_env` reads
`KVSWAP_KILL_AT_STEP=N[:KIND]` and answers an adapter that SIGKILLs the process right after its
N-th step (0-based; only steps of KIND, e.g. `fsync`, are counted when it is given); unset, it
answers None and the server's adapter has no hook. The retention tests' seam, `clock_from_env`,
reads `KVSWAP_CLOCK_SKEW_FILE`: the retention floors' clock runs that file's seconds ahead.

Owns nothing but the hooks' own counters; a hook instance serves one adapter at a time.
"""

from __future__ import annotations

import errno as errno_mod
import os
import signal
import threading
import time
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from kvswap.files.osio import OsAdapter, Phase, StepName

KILL_AT_STEP_ENV = "KVSWAP_KILL_AT_STEP"
CLOCK_SKEW_ENV = "KVSWAP_CLOCK_SKEW_FILE"
STEP_NAMES: frozenset[str] = frozenset(typing.get_args(StepName))


@dataclass
class StepCounter:
    """Records every step that completes: `(step, target)` in order."""

    steps: list[tuple[StepName, str]] = field(default_factory=list)

    def __call__(self, phase: Phase, step: StepName, target: str) -> None:
        if phase == "after":
            self.steps.append((step, target))


@dataclass
class FailAt:
    """Raise `OSError(errno)` at step `k` (0-based): before it runs, or after it ran.

    `only` restricts counting to one kind of step (e.g. "stat"), `k` then counts those.
    """

    k: int
    phase: Phase = "before"
    errno: int = errno_mod.EIO
    only: StepName | None = None
    n_seen: int = 0
    fired: bool = False

    def __call__(self, phase: Phase, step: StepName, target: str) -> None:
        if self.only is not None and step != self.only:
            return
        if phase == self.phase:
            if self.n_seen == self.k and not self.fired:
                self.fired = True
                raise OSError(self.errno, f"injected {os.strerror(self.errno)} at {step}", target)
            self.n_seen += 1


@dataclass
class KillAt:
    """End the process with SIGKILL right after step `k` (0-based) completes.

    `only` restricts counting to one kind of step (e.g. "fsync"), `k` then counts those. Steps
    are counted under a lock, so threads sharing the adapter count each step once.
    """

    k: int
    on_step: Callable[[int, StepName, str], None] | None = None
    only: StepName | None = None
    n_seen: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __call__(self, phase: Phase, step: StepName, target: str) -> None:
        if phase != "after" or (self.only is not None and step != self.only):
            return
        with self._lock:
            if self.on_step is not None:
                self.on_step(self.n_seen, step, target)
            if self.n_seen == self.k:
                os.kill(os.getpid(), signal.SIGKILL)
            self.n_seen += 1


def kill_seam_from_env(environ: Mapping[str, str]) -> OsAdapter | None:
    """An adapter that dies at the step `KVSWAP_KILL_AT_STEP=N[:KIND]` names; None when unset.

    Raises `ValueError` naming the variable for a malformed value.
    """
    value = environ.get(KILL_AT_STEP_ENV, "")
    if not value:
        return None
    count, _, kind = value.partition(":")
    if not count.isdigit() or (kind and kind not in STEP_NAMES):
        raise ValueError(
            f"{KILL_AT_STEP_ENV}={value!r}: expected N or N:KIND, N a step index from 0 and KIND "
            f"one of {', '.join(sorted(STEP_NAMES))}"
        )
    only = typing.cast(StepName, kind) if kind else None
    return OsAdapter(KillAt(int(count), only=only))


def clock_from_env(environ: Mapping[str, str]) -> Callable[[], float]:
    """`time.time`, or, when `KVSWAP_CLOCK_SKEW_FILE` names a file, `time.time` plus the seconds
    the file holds when asked (missing or empty: 0): a test moves a server's retention floors'
    clock ahead without waiting."""
    path = environ.get(CLOCK_SKEW_ENV, "")
    if not path:
        return time.time

    def skewed() -> float:
        try:
            with open(path, encoding="ascii") as f:
                text = f.read().strip()
        except FileNotFoundError:
            text = ""
        return time.time() + (float(text) if text else 0.0)

    return skewed
