"""Whether the shared tier answers, as its users find out: one log line when Redis stops
answering, one when it answers again, a count of the failures in between.

Every caller that reaches Redis reports here (`ok`, `failed`); `on_back` callbacks run when a
spell of failures ends (the writer then publishes every dirty mind). Owns no connection of its
own. Thread-safe.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger("kvswap.shared")


class TierHealth:
    """See the module docstring."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._down_since: float | None = None
        self.n_failures = 0  # operations that found Redis unreachable, all spells
        self._on_back: list[Callable[[], None]] = []

    def on_back(self, callback: Callable[[], None]) -> None:
        self._on_back.append(callback)

    @property
    def reachable(self) -> bool:
        with self._lock:
            return self._down_since is None

    def failed(self, what: str, err: Exception) -> None:
        with self._lock:
            self.n_failures += 1
            first = self._down_since is None
            if first:
                self._down_since = time.monotonic()
        if first:
            log.warning(
                "shared tier unreachable (%s): %s; resident minds keep serving, their "
                "publications wait for Redis",
                what,
                err,
            )

    def ok(self) -> None:
        with self._lock:
            since, self._down_since = self._down_since, None
        if since is not None:
            log.info("shared tier reachable again after %.1f s", time.monotonic() - since)
            for callback in self._on_back:
                callback()
