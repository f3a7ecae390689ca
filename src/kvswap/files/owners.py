"""Ownership of names across servers that share one save path, at a bounded cost in open files.

A server owns a name (a mind) while it serves it live: the claim file
`<save>/.kvswap/owners/<key>.claim` (key: `paths.name_key`) names the owning instance, and each
live instance holds an exclusive `flock` on its own `<save>/.kvswap/owners/<instance>.live` for
its lifetime. A claim whose instance file is gone or can be locked is stale (its process died,
even by SIGKILL, and the kernel dropped its lock) and is taken over. Claims are read and changed
only under a short `flock` on `owners/claims.lock`, so two servers racing for one name never
both win.

Cost: one descriptor per instance for its lifetime, plus three at most while a claim is checked
or changed (`MAX_TRANSIENT_FDS`): any number of owned names holds no descriptor and no lock,
only an entry in `owned` and a small claim file. No fsync: claims describe live processes,
which a machine crash ends anyway. Every OS step goes through `OsAdapter`. Thread-safe.
"""

from __future__ import annotations

import errno
import os
import secrets
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Final

from kvswap.files.osio import OsAdapter
from kvswap.files.paths import name_key
from kvswap.files.types import META_DIR_NAME

OWNERS_DIR: Final = "owners"
CLAIMS_LOCK: Final = "claims.lock"
MAX_TRANSIENT_FDS: Final = 3  # the claims lock, a claim file, another instance's live file
_CLAIM_BYTES: Final = 64


class OwnerLocks:
    """Names this process owns under one save path; see the module docstring."""

    def __init__(self, save_dir: Path, osio: OsAdapter | None = None) -> None:
        self._osio = osio if osio is not None else OsAdapter()
        osio_ = self._osio
        meta = osio_.open_dir(str(Path(save_dir) / META_DIR_NAME), dir_fd=None)
        try:
            if osio_.mkdir(OWNERS_DIR, dir_fd=meta, exist_ok=True):
                osio_.fsync_dir(meta)
            self._dir_fd = osio_.open_dir(OWNERS_DIR, dir_fd=meta)
        finally:
            osio_.close(meta)
        self.instance = f"{os.getpid()}-{secrets.token_hex(8)}"
        self._live_fd = osio_.open(
            f"{self.instance}.live", os.O_RDWR | os.O_CREAT, dir_fd=self._dir_fd
        )
        osio_.flock(self._live_fd, exclusive=True, blocking=False)
        self._owned: set[str] = set()
        self._mutex = threading.Lock()

    def owns(self, name: str) -> bool:
        """This process owns `name` (no file is touched)."""
        with self._mutex:
            return name in self._owned

    def own(self, name: str) -> bool:
        """True when this process owns `name` (now or already); False: a live other one does."""
        with self._mutex:
            if name in self._owned:
                return True
            with self._claims():
                holder = self._holder(name)
                if holder is not None and holder != self.instance and self._alive(holder):
                    return False
                self._write_claim(name)
            self._owned.add(name)
            return True

    def owned_elsewhere(self, name: str) -> bool:
        """A live other process owns `name` (nothing is claimed)."""
        with self._mutex, self._claims():
            holder = self._holder(name)
            return holder is not None and holder != self.instance and self._alive(holder)

    def release(self, name: str) -> None:
        """This process stops owning `name` (its claim file goes)."""
        with self._mutex:
            if name not in self._owned:
                return
            self._owned.discard(name)
            with self._claims():
                if self._holder(name) == self.instance:
                    self._osio.unlink(_claim(name), dir_fd=self._dir_fd, missing_ok=True)

    def close(self) -> None:
        """Release every claim and the instance's live lock."""
        with self._mutex:
            owned, self._owned = self._owned, set()
            try:
                with self._claims():
                    for name in owned:
                        if self._holder(name) == self.instance:
                            self._osio.unlink(_claim(name), dir_fd=self._dir_fd, missing_ok=True)
                self._osio.unlink(f"{self.instance}.live", dir_fd=self._dir_fd, missing_ok=True)
            finally:
                self._osio.close(self._live_fd)
                self._osio.close(self._dir_fd)

    # -- claim files (under the claims lock) -----------------------------------------------

    @contextmanager
    def _claims(self) -> Iterator[None]:
        fd = self._osio.open(CLAIMS_LOCK, os.O_RDWR | os.O_CREAT, dir_fd=self._dir_fd)
        try:
            self._osio.flock(fd, exclusive=True)
            yield
        finally:
            self._osio.close(fd)  # drops the flock

    def _holder(self, name: str) -> str | None:
        """The instance named in `name`'s claim, None when unclaimed (ENOENT only)."""
        try:
            fd = self._osio.open(_claim(name), os.O_RDONLY | os.O_NONBLOCK, dir_fd=self._dir_fd)
        except FileNotFoundError:
            return None
        try:
            buf = bytearray(_CLAIM_BYTES)
            n = self._osio.readinto(fd, memoryview(buf))
        finally:
            self._osio.close(fd)
        return bytes(buf[:n]).decode("ascii", "replace").strip() or None

    def _alive(self, instance: str) -> bool:
        """`instance` still holds its live lock (a torn or unknown name is a dead one)."""
        if not instance.replace("-", "").isalnum():
            return False
        try:
            fd = self._osio.open(f"{instance}.live", os.O_RDWR, dir_fd=self._dir_fd)
        except FileNotFoundError:
            return False
        try:
            if self._osio.flock(fd, exclusive=True, blocking=False):
                # Dead: its lock was free. Its file goes too (it holds no claim any more).
                self._osio.unlink(f"{instance}.live", dir_fd=self._dir_fd, missing_ok=True)
                return False
            return True
        finally:
            self._osio.close(fd)

    def _write_claim(self, name: str) -> None:
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
        fd = self._osio.open(_claim(name), flags, dir_fd=self._dir_fd)
        try:
            if self._osio.write(fd, [self.instance.encode("ascii")]) != len(self.instance):
                raise OSError(errno.EIO, f"short write of the claim of {name!r}")
        finally:
            self._osio.close(fd)


def _claim(name: str) -> str:
    return f"{name_key(name)}.claim"
