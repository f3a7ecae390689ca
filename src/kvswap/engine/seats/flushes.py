"""The flush schedule: which minds changed since their last disk copy, and which are due.

A mind is dirty from its first change after its last disk copy (`changed`: the engine seats it
for a turn) until a copy taken after its last change is written (`flushed`). `due` hands the
demoter the idle dirty minds whose first change is at least `--page-flush-seconds` old, oldest
first, and postpones each by that age, so a mind that cannot be written now is tried again a
window later rather than on every pass. A mind that no tier holds any more loses its mark with
its other entries (`forget`, run by the registry as it forgets the mind).

An owner with one private lock. Threads: the engine thread marks changes; the demoter thread
asks what is due and marks flushes; the closing thread (the spill before exit) and the I/O
executor (a client's spill, a slot verb ending a mind) mark flushes and forget marks. It calls
nothing while it holds its lock. No libllama, no files.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass

from kvswap.core.keys import PageKey


@dataclass
class _Mark:
    """A dirty mind's times (unix seconds)."""

    first_s: float  # its first change since its last disk copy (postponed by `due`)
    last_s: float  # its last change


class FlushSchedule:
    """See the module docstring. Threads: the engine thread (`changed`), the demoter thread
    (`due`, `flushed`, `is_dirty`), the closing thread (`flushed`, `is_dirty`), the I/O executor
    (`flushed` in a client's spill; `forget`, under the registry's lock)."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock  # unix seconds (a test's own clock makes the windows exact)
        self._lock = threading.Lock()
        self._dirty: dict[PageKey, _Mark] = {}

    def changed(self, key: PageKey) -> None:
        """Mind `key` is used now: its state changes, so it is dirty until a disk copy taken
        after this is written (an earlier first change keeps its place in the schedule)."""
        now = self._clock()
        with self._lock:
            mark = self._dirty.get(key)
            if mark is None:
                self._dirty[key] = _Mark(now, now)
            else:
                mark.last_s = now

    def flushed(self, key: PageKey, t_copied_unix_s: float) -> None:
        """A disk copy of mind `key` taken at `t_copied_unix_s` is written: clean, unless it
        changed after that."""
        with self._lock:
            mark = self._dirty.get(key)
            # Its first change is not enough: `due` postpones that mark, and a turn seated after
            # the copy was taken changed it again (`changed` keeps the earlier mark), so its
            # last change must predate the copy too.
            if (
                mark is not None
                and mark.first_s <= t_copied_unix_s
                and mark.last_s <= t_copied_unix_s
            ):
                del self._dirty[key]

    def due(self, age_s: float, busy: Collection[PageKey]) -> list[PageKey]:
        """The dirty minds not in `busy` whose mark is at least `age_s` old, oldest first; each
        is postponed by `age_s` (a busy mind keeps its place: its turn changes it again)."""
        with self._lock:
            now = self._clock()
            due = [k for k, m in self._dirty.items() if m.first_s <= now - age_s and k not in busy]
            due.sort(key=lambda k: self._dirty[k].first_s)
            for key in due:
                self._dirty[key].first_s = now
            return due

    def is_dirty(self, key: PageKey) -> bool:
        """Mind `key` changed since its last disk copy was taken (a new mind: since it began)."""
        with self._lock:
            return key in self._dirty

    def forget(self, key: PageKey) -> None:
        """Mind `key` is forgotten: nothing of it is left to write."""
        with self._lock:
            self._dirty.pop(key, None)
