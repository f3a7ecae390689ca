"""Ownership of names across servers that share one save path: an exclusive `flock` per name,
held for the owner's lifetime.

`<save>/.kvswap/lock/<key>.own` (key: `paths.name_key`) is taken without waiting: a name owned
by another live process is refused, and a process that dies (even by SIGKILL) releases its names
with its descriptors. Distinct from the per-name `.lock` files that publication holds briefly.
Every OS step goes through `OsAdapter`. Thread-safe.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

from kvswap.files.osio import OsAdapter
from kvswap.files.paths import LOCK_DIR, name_key
from kvswap.files.types import META_DIR_NAME


class OwnerLocks:
    """Names this process owns under one save path."""

    def __init__(self, save_dir: Path, osio: OsAdapter | None = None) -> None:
        self._osio = osio if osio is not None else OsAdapter()
        meta = self._osio.open_dir(str(Path(save_dir) / META_DIR_NAME), dir_fd=None)
        try:
            self._dir_fd = self._osio.open_dir(LOCK_DIR, dir_fd=meta)
        finally:
            self._osio.close(meta)
        self._held: dict[str, int] = {}  # name -> the descriptor holding its flock
        self._mutex = threading.Lock()

    def own(self, name: str) -> bool:
        """True when this process owns `name` (now or already); False: another process does."""
        with self._mutex:
            if name in self._held:
                return True
            fd = self._osio.open(
                f"{name_key(name)}.own", os.O_RDWR | os.O_CREAT, dir_fd=self._dir_fd
            )
            try:
                held = self._osio.flock(fd, exclusive=True, blocking=False)
            except BaseException:
                self._osio.close(fd)
                raise
            if not held:
                self._osio.close(fd)
                return False
            self._held[name] = fd
            return True

    def close(self) -> None:
        with self._mutex:
            for fd in self._held.values():
                self._osio.close(fd)
            self._held.clear()
            self._osio.close(self._dir_fd)
