"""Hooks for the fault seam of `osio.OsAdapter`: count steps, fail one, or die at one.

Test support only: production code never installs a hook. A test runs an operation once with a
`StepCounter` to enumerate its OS steps, then once per step k with `FailAt(k)` (an `OSError` at
that step, before or after it happens) or, in a subprocess, `KillAt(k)` (the process ends right
after step k, as a crash would leave it).

Owns nothing but the hooks' own counters; a hook instance serves one adapter at a time.
"""

from __future__ import annotations

import errno as errno_mod
import os
import signal
from collections.abc import Callable
from dataclasses import dataclass, field

from kvswap.files.osio import Phase, StepName


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
    """End the process with SIGKILL right after step `k` (0-based) completes."""

    k: int
    on_step: Callable[[int, StepName, str], None] | None = None
    n_seen: int = 0

    def __call__(self, phase: Phase, step: StepName, target: str) -> None:
        if phase != "after":
            return
        if self.on_step is not None:
            self.on_step(self.n_seen, step, target)
        if self.n_seen == self.k:
            os.kill(os.getpid(), signal.SIGKILL)
        self.n_seen += 1
