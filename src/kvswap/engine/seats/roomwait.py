"""A mind switch waiting for room in the page store, and when that wait ends in a refusal.

When the store cannot take an evicted mind, the switch waits: the demoter is woken to spill
least recently used pages to disk and answers each pass with a `RoomReport`. Only a pass that
ran after the switch began waiting may refuse it (a report that predates the wait is not its
answer); `refusal` hands that pass's reason to the switch once, which then either goes straight
to disk (with a disk tier) or fails, typed, naming `--page-ram-bytes` (`refuse`).

Engine thread only.
"""

from __future__ import annotations

import logging
from typing import NoReturn

from kvswap.core.errors import ErrorKind, KvswapError
from kvswap.engine.commands import RoomReport

log = logging.getLogger("kvswap.minds")

ROOM_RETRY_S = 5  # a switch refused for room: the Retry-After its 503 suggests


class RoomWait:
    """See the module docstring."""

    def __init__(self) -> None:
        self._n_reported = 0  # the last demoter pass that reported
        self._ticket: int | None = None  # a waiting switch needs a report from this pass on
        self._refused = ""  # why such a pass could not make room
        self._logged: set[str] = set()  # reasons a switch was refused, logged once

    def begin(self) -> None:
        """A switch waits for room (from the next pass on, unless it already waits)."""
        if self._ticket is None:
            self._ticket = self._n_reported + 1

    def refusal(self) -> str:
        """Why a pass that ran after the switch began waiting could not make room ("" when none
        has refused yet); the wait ends with it."""
        if self._ticket is None or not self._refused:
            return ""
        reason, self._ticket, self._refused = self._refused, None, ""
        return reason

    def made(self) -> None:
        """The switch found its room: the wait is over."""
        self._ticket, self._refused = None, ""

    def reported(self, report: RoomReport) -> None:
        """A demoter pass ended: a waiting switch learns whether it could make room."""
        self._n_reported = report.pass_no
        if self._ticket is not None and report.pass_no >= self._ticket and report.refused:
            self._refused = report.refused

    def refuse(self, reason: str, ceiling_bytes: int, err: KvswapError) -> NoReturn:
        """Fail the switch, typed, naming `--page-ram-bytes` (logged once per reason)."""
        message = (
            f"cannot make room for a mind switch: the page store is full (--page-ram-bytes "
            f"{ceiling_bytes}) and {reason}; raise --page-ram-bytes"
        )
        if reason not in self._logged:
            self._logged.add(reason)
            log.warning("%s", message)
        raise KvswapError(ErrorKind.UNAVAILABLE, message, retry_after_s=ROOM_RETRY_S) from err
