"""The shared tier's background threads (lease renewal, publication), kept running.

A `Loop` runs one pass (`step`) at a time on its own thread until stopped, waiting between
passes for the time the pass asks for, or until `wake` is set. A pass that raises is logged
with its traceback and counted, and the next pass runs as usual: one mind's unexpected error
(a bug, a `MemoryError`, an engine that did not answer) never stops the renewal of every lease
or the publication of every mind. A thread that died anyway (a `BaseException`) is started
again by `ensure_running`, which the server calls whenever it reports the tier's health
(`/health`), and its death is logged and counted too. `view` is what /health shows of it.

Owns its thread and its counters. Thread-safe.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger("kvswap.shared")


@dataclass(frozen=True)
class LoopView:
    """One background thread as /health shows it."""

    name: str
    alive: bool
    n_failures: int  # passes that raised (each logged), all lives of the thread
    n_restarts: int  # times the thread was found dead and started again
    last_error: str  # the last failure's text ("" when none)


class Loop:
    """See the module docstring. `step()` runs one pass and returns the seconds to wait
    before the next (cut short by `wake`); after a pass that failed, `retry_s`."""

    def __init__(self, name: str, step: Callable[[], float], retry_s: float) -> None:
        self.name = name
        self._step = step
        self._retry_s = retry_s
        self.wake = threading.Event()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._n_failures = 0
        self._n_restarts = 0
        self._last_error = ""

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def start(self) -> None:
        with self._lock:
            self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self.wake.set()
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def ensure_running(self) -> bool:
        """Start the thread again if it died (logged, counted); True when it did."""
        with self._lock:
            thread = self._thread
            if thread is None or thread.is_alive() or self._stop.is_set():
                return False
            self._n_restarts += 1
            log.error("%s: its thread had died (%s); started again", self.name, self._last_error)
            self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
            self._thread.start()
            return True

    def view(self) -> LoopView:
        with self._lock:
            thread = self._thread
            alive = thread is not None and thread.is_alive()
            return LoopView(self.name, alive, self._n_failures, self._n_restarts, self._last_error)

    def _failed(self, err: BaseException) -> None:
        with self._lock:
            self._n_failures += 1
            self._last_error = f"{type(err).__name__}: {err}"

    def _run(self) -> None:
        wait_s = 0.0
        try:
            while not self._stop.is_set():
                if wait_s > 0:
                    self.wake.wait(wait_s)
                self.wake.clear()
                if self._stop.is_set():
                    return
                try:
                    wait_s = self._step()
                except Exception as err:  # a bug or an unexpected error: logged, counted
                    self._failed(err)
                    log.exception("%s: a pass failed; the next one runs as usual", self.name)
                    wait_s = self._retry_s
        except BaseException as err:  # the thread dies: `ensure_running` starts it again
            self._failed(err)
            log.exception("%s: its thread died", self.name)
            raise
