"""What the engine hands the demoter: minds the page store cannot hold on their way to disk,
and its call when it needs the demoter now.

A mind larger than the whole page store never has a page, and one the store cannot make room
for now (every other page held) cannot have one yet. With a disk tier such a mind goes to its
file with no copy in memory: the engine asks for a file of its size (`want_file`); the demoter
opens the mind's next generation with its blocks allocated and mapped (`take` gives it the
`FileWanted`; `opened`); the engine captures the slot straight into that mapping
(`file_to_fill`, then `filled`); the demoter publishes it (`take` gives it the `FileFilled`)
and says how that went (`done`: written, refused, or dropped, when `--page-disk-drop-lru` lets
the mind go rather than refuse its switch); the engine frees the slot once the file holds the
slot's state or the mind was dropped (`state`, then `end`). A slot verb that ends the mind
meanwhile ends its hand-off too, and a file opened for it is handed back to be dropped
(`take` gives it as an `InPlace`), as is one the mind outgrew while it was opened (`end`). Each such mind
is logged once (`first_too_large`) until it is forgotten.

The demoter attaches its bell (`attach`): `call_demoter` rings it when a hand-off waits, the
store is short of its headroom, or a mind switch waits for room. Before that (or with no
demoter) the call rings nothing.

An owner with one private lock. Threads: the engine thread asks, fills, reads the state, ends
hand-offs and calls the demoter; the demoter thread takes and reports; the demoter's `settle`
(on the I/O executor or the demoter thread) asks whether a mind is being handed over, under the
registry's lock. It calls nothing while it holds its lock. No libllama; no file I/O (a file's
mapping is the engine's to copy into)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

from kvswap.core.keys import PageKey
from kvswap.core.page import PageLayout
from kvswap.files.publish import InPlace

log = logging.getLogger("kvswap.minds")


class Handed(Enum):
    """How a hand-off ended."""

    WRITTEN = "written"  # the mind's file holds the copy
    REFUSED = "refused"  # the write failed, or the disk tier had no room
    DROPPED = "dropped"  # no room, and --page-disk-drop-lru let the mind go instead


@dataclass(frozen=True)
class FileWanted:
    """The engine asks for a file to write a mind laid out by `layout` into."""

    layout: PageLayout


@dataclass(frozen=True)
class FileOpened:
    """The demoter opened it: the engine's to fill."""

    staged: InPlace


@dataclass(frozen=True)
class FileFilled:
    """The engine captured the slot into it, laid out by `layout`: the demoter's to publish."""

    staged: InPlace
    layout: PageLayout


@dataclass(frozen=True)
class Job:
    """What the demoter takes: a file to open or to publish for mind `key` (asked at `t_asked`,
    on the clock), or a file to drop (`key` None: `what` is its `InPlace`)."""

    key: PageKey | None
    what: FileWanted | FileFilled | InPlace
    t_asked: float = 0.0


def _no_demoter() -> None:
    """The bell before a demoter attaches its own: nobody to wake."""


class Handoffs:
    """See the module docstring. Threads: the engine thread (`want_file`, `file_to_fill`,
    `filled`, `state`, `end`, `minds`, `first_too_large`, `call_demoter`), the demoter thread
    (`attach` at its building, `take`, `opened`, `done`), and whoever settles a mind
    (`handing` and `forget`, under the registry's lock: the I/O executor or the demoter
    thread)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._bell: Callable[[], None] = _no_demoter
        self._disk_tier = False  # the demoter has a save path to write minds to
        # key -> what waits for its file (None: the demoter is at it), then how it ended
        self._handoffs: dict[PageKey, FileWanted | FileOpened | FileFilled | Handed | None] = {}
        self._handed_at: dict[PageKey, float] = {}  # key -> when its file was asked for
        self._orphans: list[InPlace] = []  # files opened for hand-offs that ended: to drop
        self._too_large: set[PageKey] = set()  # minds whose size was logged

    # -- the demoter's side -------------------------------------------------------------------

    def attach(self, bell: Callable[[], None], *, disk_tier: bool) -> None:
        """The demoter rings `bell` to wake itself; `disk_tier`: it can write minds to disk."""
        with self._lock:
            self._bell = bell
            self._disk_tier = disk_tier

    def take(self) -> Job | None:
        """The next file to drop, open or publish (the demoter then owns it), or None."""
        with self._lock:
            if self._orphans:
                return Job(None, self._orphans.pop())
            for key, value in self._handoffs.items():
                if isinstance(value, FileWanted | FileFilled):
                    self._handoffs[key] = None
                    return Job(key, value, self._handed_at[key])
            return None

    def opened(self, key: PageKey, staged: InPlace) -> bool:
        """The file mind `key` asked for is open; False when its hand-off ended meanwhile (the
        caller drops the file)."""
        with self._lock:
            if key not in self._handoffs:
                return False
            self._handoffs[key] = FileOpened(staged)
        return True  # (the engine retries its waiting job: nothing to ring)

    def done(self, key: PageKey, handed: Handed) -> None:
        """The hand-off of mind `key` ended as `handed`."""
        with self._lock:
            if key in self._handoffs:  # not ended by a slot verb meanwhile
                self._handoffs[key] = handed

    # -- the engine's side --------------------------------------------------------------------

    @property
    def has_disk_tier(self) -> bool:
        with self._lock:
            return self._disk_tier

    def call_demoter(self) -> None:
        """Wake the demoter (a hand-off waits, the store is short of its headroom, or a switch
        waits for room)."""
        with self._lock:
            bell = self._bell
        bell()

    def want_file(self, key: PageKey, layout: PageLayout) -> None:
        """Ask for a file to write mind `key`, laid out by `layout`, into."""
        with self._lock:
            assert key not in self._handoffs, key
            self._handoffs[key] = FileWanted(layout)
            self._handed_at[key] = time.time()
        self.call_demoter()

    def file_to_fill(self, key: PageKey) -> InPlace | None:
        """The file opened for mind `key`, once it is (the engine fills it now), else None."""
        with self._lock:
            value = self._handoffs.get(key)
            return value.staged if isinstance(value, FileOpened) else None

    def filled(self, key: PageKey, staged: InPlace, layout: PageLayout) -> None:
        """The engine captured mind `key` into its file, laid out by `layout`."""
        with self._lock:
            self._handoffs[key] = FileFilled(staged, layout)
        self.call_demoter()

    def state(self, key: PageKey) -> Handed | None:
        """How the hand-off ended; None: none asked or under way (`handing` tells those
        apart)."""
        with self._lock:
            value = self._handoffs.get(key)
            return value if isinstance(value, Handed) else None

    def handing(self, key: PageKey) -> bool:
        """Mind `key` is on its way to disk (its slot keeps it until `end`)."""
        with self._lock:
            return key in self._handoffs

    def end(self, key: PageKey) -> None:
        """The hand-off of mind `key` is over (its slot is free, a slot verb ended it, or it
        outgrew its file); a file opened for it and not yet published is handed back to be
        dropped."""
        with self._lock:
            value = self._handoffs.pop(key, None)
            self._handed_at.pop(key, None)
            staged = value.staged if isinstance(value, FileOpened | FileFilled) else None
            if staged is not None:
                self._orphans.append(staged)
        if staged is not None:
            self.call_demoter()

    def minds(self) -> set[PageKey]:
        """The minds on their way to disk (a copy)."""
        with self._lock:
            return set(self._handoffs)

    def first_too_large(self, key: PageKey) -> bool:
        """True the first time mind `key` is found too large for the store (log it once)."""
        with self._lock:
            if key in self._too_large:
                return False
            self._too_large.add(key)
            return True

    def log_too_large(self, key: PageKey, n_bytes: int, ceiling: int, how: str) -> None:
        """Say once per mind that it left its slot larger than the whole page store, and how."""
        if self.first_too_large(key):
            log.warning(
                "%s holds %d bytes, more than the whole page store (--page-ram-bytes %d): it "
                "leaves its slot %s; raise --page-ram-bytes to keep it in RAM",
                key, n_bytes, ceiling, how,
            )  # fmt: skip

    def log_past_store(self, key: PageKey, n_bytes: int, reason: str) -> None:
        """Say once per mind that it went straight to disk, the store having no room for it."""
        if self.first_too_large(key):
            log.info(
                "%s (%d bytes) leaves its slot straight to disk: the page store cannot hold it "
                "now (%s); raise --page-ram-bytes to keep such minds in RAM",
                key, n_bytes, reason,
            )  # fmt: skip

    def forget(self, key: PageKey) -> None:
        """Mind `key` is forgotten: the next time it is too large is logged again."""
        with self._lock:
            self._too_large.discard(key)
