"""The save path on disk: its directory fds and kvswap's metadata folders inside it.

    <save>/F, F.ckpt, F.dft, F.lora     committed generations (F: libllama's sequence file)
    <save>/.kvswap/commit/<key>.json    commit record of name F (key = sha256 of F, hex)
    <save>/.kvswap/stage/<key>-<gen>/   a publication's staged files: seq, ckpt, dft, lora,
                                        record.json (moved to commit/ at the commit point)
    <save>/.kvswap/stage/<key>-<gen>.lock   held (flock) by the live publisher of that stage
    <save>/.kvswap/lock/<key>.lock      per-name lock; lock/stage.lock guards the stage sweep

Owns the open directory descriptors (every later access is `*at` relative to them, so a rename
of the save path or a symlink planted inside it cannot redirect kvswap) and the mapping of names
to entries. The operator's `--slot-save-path` itself may go through symlinks; nothing below it
may: a symlinked `.kvswap` or sub-folder is a `SavePathError`, a symlinked `F` an
`UnsafePathError`.

Callers: `publish` and `reader`. Does not lock (see `locks`) and does not validate names (see
`names`; every name reaching this module has been validated).
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from kvswap.files.errors import SavePathError, UnsafePathError
from kvswap.files.osio import OsAdapter
from kvswap.files.types import META_DIR_NAME, Suffix

COMMIT_DIR: Final = "commit"
STAGE_DIR: Final = "stage"
LOCK_DIR: Final = "lock"
SWEEP_LOCK: Final = "stage"
RECORD_STAGED: Final = "record.json"
# Name of each file of a generation inside its stage folder.
ROLE: Final[dict[Suffix, str]] = {"": "seq", ".ckpt": "ckpt", ".dft": "dft", ".lora": "lora"}


def name_key(name: str) -> str:
    """The fixed-length key of file name F in metadata (any F fits one directory entry)."""
    return hashlib.sha256(name.encode("utf-8")).hexdigest()


def record_name(key: str) -> str:
    return f"{key}.json"


def stage_lock_name(stage_id: str) -> str:
    return f"{stage_id}.lock"


@dataclass
class SaveRoot:
    """Open descriptors of the save path and its metadata folders; `close()` releases them."""

    osio: OsAdapter
    save_fd: int
    meta_fd: int
    commit_fd: int
    stage_fd: int
    lock_fd: int

    @classmethod
    def open(cls, save_dir: Path, osio: OsAdapter) -> SaveRoot:
        """Open `save_dir` (which must exist) and create kvswap's metadata folders in it."""
        try:
            save_fd = osio.open_dir(str(save_dir), dir_fd=None)
        except FileNotFoundError:
            raise SavePathError(f"slot save path {str(save_dir)!r} does not exist") from None
        except NotADirectoryError:
            raise SavePathError(f"slot save path {str(save_dir)!r} is not a folder") from None
        opened = [save_fd]
        try:
            meta_fd = _ensure_dir(osio, save_fd, META_DIR_NAME)
            opened.append(meta_fd)
            sub = {}
            for folder in (COMMIT_DIR, STAGE_DIR, LOCK_DIR):
                sub[folder] = _ensure_dir(osio, meta_fd, folder)
                opened.append(sub[folder])
            # files move between stage/ and the save path by rename: one file system only
            if len({osio.fstat(fd).st_dev for fd in opened}) != 1:
                raise SavePathError(f"{META_DIR_NAME} is on another file system than the save path")
        except BaseException:
            for fd in reversed(opened):
                osio.close(fd)
            raise
        return cls(osio, save_fd, meta_fd, sub[COMMIT_DIR], sub[STAGE_DIR], sub[LOCK_DIR])

    def close(self) -> None:
        """Close every descriptor (each is gone even if its close reports an error)."""
        first_error: OSError | None = None
        for fd in (self.lock_fd, self.stage_fd, self.commit_fd, self.meta_fd, self.save_fd):
            try:
                self.osio.close(fd)
            except OSError as e:
                first_error = first_error or e
        if first_error is not None:
            raise first_error

    def check_not_symlink(self, entry: str) -> os.stat_result | None:
        """lstat an entry of the save path; a symlink (or a non-file) is an `UnsafePathError`."""
        st = self.osio.lstat(entry, dir_fd=self.save_fd)
        if st is not None and not stat.S_ISREG(st.st_mode):
            what = "a symlink" if stat.S_ISLNK(st.st_mode) else "not a regular file"
            raise UnsafePathError(f"{entry!r} in the slot save path is {what}; refusing it")
        return st


def _ensure_dir(osio: OsAdapter, parent_fd: int, name: str) -> int:
    """Create folder `name` under `parent_fd` if absent (syncing the parent), and open it."""
    created = osio.mkdir(name, dir_fd=parent_fd, exist_ok=True)
    if created:
        osio.fsync_dir(parent_fd)
    try:
        return osio.open_dir(name, dir_fd=parent_fd)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
            raise SavePathError(
                f"kvswap metadata folder {name!r} is a symlink or not a folder; refusing it"
            ) from None
        raise
