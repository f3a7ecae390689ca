"""Shared/exclusive locks that exclude other processes and other threads.

A lock named `K` is two locks taken in this order and released in reverse:

1. an in-process reader/writer lock (threads of this process; `flock` alone would do on Linux,
   where every acquisition opens its own file description, but not where `flock` is emulated
   with POSIX record locks, which never exclude threads of one process);
2. `flock` on the dedicated lock file `<save>/.kvswap/lock/K.lock`, opened for this acquisition
   and held open for the lock's lifetime; the kernel drops it when the holder dies, so a killed
   process never leaves a lock behind. Lock files are never deleted (deleting a lock file races
   with a process that has it open).

Owns the in-process lock table of one save path. Callers: `publish` and `reader` (worker
threads, never the engine thread). Does not decide what a lock protects: see `publish` for the
lock order (sweep lock before name lock; never block on a name lock while holding another name
lock).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from kvswap.files.osio import OsAdapter


@dataclass
class _RWLock:
    """Reader/writer lock with writer preference (a waiting writer blocks new readers)."""

    cond: threading.Condition = field(default_factory=threading.Condition)
    n_readers: int = 0
    writer: bool = False
    n_writers_waiting: int = 0
    n_users: int = 0  # table refcount, guarded by the table's mutex

    def acquire(self, exclusive: bool, blocking: bool) -> bool:
        with self.cond:
            if exclusive:
                if not blocking and (self.writer or self.n_readers):
                    return False
                self.n_writers_waiting += 1
                try:
                    self.cond.wait_for(lambda: not self.writer and not self.n_readers)
                finally:
                    self.n_writers_waiting -= 1
                self.writer = True
            else:
                if not blocking and (self.writer or self.n_writers_waiting):
                    return False
                self.cond.wait_for(lambda: not self.writer and not self.n_writers_waiting)
                self.n_readers += 1
            return True

    def release(self, exclusive: bool) -> None:
        with self.cond:
            if exclusive:
                assert self.writer
                self.writer = False
            else:
                assert self.n_readers > 0
                self.n_readers -= 1
            self.cond.notify_all()


class LockTable:
    """The locks of one save path: `hold(K, exclusive=...)` as a context manager."""

    def __init__(self, osio: OsAdapter, lock_dir_fd: int) -> None:
        self._osio = osio
        self._lock_dir_fd = lock_dir_fd
        self._mutex = threading.Lock()
        self._table: dict[str, _RWLock] = {}

    def _ref(self, key: str) -> _RWLock:
        with self._mutex:
            lock = self._table.setdefault(key, _RWLock())
            lock.n_users += 1
            return lock

    def _unref(self, key: str, lock: _RWLock) -> None:
        with self._mutex:
            lock.n_users -= 1
            if lock.n_users == 0:
                del self._table[key]

    @contextmanager
    def hold(self, key: str, *, exclusive: bool, blocking: bool = True) -> Iterator[bool]:
        """Hold lock `key`; yields False (holding nothing) when `blocking` is off and it is busy."""
        rw = self._ref(key)
        try:
            if not rw.acquire(exclusive, blocking):
                yield False
                return
            try:
                fd = self._flock(key, exclusive, blocking)
                if fd is None:
                    yield False
                    return
                try:
                    yield True
                finally:
                    self._osio.close(fd)  # closing the only descriptor releases the flock
            finally:
                rw.release(exclusive)
        finally:
            self._unref(key, rw)

    def _flock(self, key: str, exclusive: bool, blocking: bool) -> int | None:
        fd = self._osio.open(f"{key}.lock", os.O_RDWR | os.O_CREAT, dir_fd=self._lock_dir_fd)
        try:
            held = self._osio.flock(fd, exclusive=exclusive, blocking=blocking)
        except BaseException:
            self._osio.close(fd)
            raise
        if not held:
            self._osio.close(fd)
            return None
        return fd
