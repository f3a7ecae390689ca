"""Commit records: the JSON that makes a staged generation the committed one.

A record names F, its generation id, the stage folder that held its files, the model
fingerprint, the creation time, and each file's suffix, size and checksum (F's included). It is
written into the stage, synced, then renamed to `.kvswap/commit/<key>.json` (the commit point).
It stays there while the generation is current, so readers verify every file against it. The
publication is *pending* while its stage folder exists (files not all moved yet) and *complete*
once the folder is gone: completing is idempotent, so the record itself is never rewritten.

A record is never torn (written whole and synced before its rename); one that fails to parse or
names another file is a `CorruptFileError`, and every field a bit flip could change fails safe
(a wrong size or checksum refuses F; a wrong stage id makes a pending publication look
complete, and the old F then fails the new checksum).

Owns the record format and its I/O. Callers: `publish`, `reader`.
"""

from __future__ import annotations

import json
import os
import stat
import time
from dataclasses import dataclass
from typing import Any, Final

from kvswap.files.errors import CorruptFileError
from kvswap.files.osio import OsAdapter
from kvswap.files.paths import SaveRoot, record_name
from kvswap.files.types import ALL_SUFFIXES, Suffix

RECORD_FORMAT: Final = "kvswap-commit"
RECORD_VERSION: Final = 1
MAX_RECORD_BYTES: Final = 1 << 20


@dataclass(frozen=True)
class FileEntry:
    """One file of a generation as committed."""

    suffix: Suffix
    n_bytes: int
    checksum: str  # "crc32:xxxxxxxx"


@dataclass(frozen=True)
class CommitRecord:
    name: str
    generation: str
    stage: str  # stage folder id under .kvswap/stage/
    fingerprint: str
    created_unix_s: float
    files: tuple[FileEntry, ...]

    def file(self, suffix: Suffix) -> FileEntry | None:
        for entry in self.files:
            if entry.suffix == suffix:
                return entry
        return None

    def to_json(self) -> bytes:
        doc = {
            "format": RECORD_FORMAT,
            "version": RECORD_VERSION,
            "name": self.name,
            "generation": self.generation,
            "stage": self.stage,
            "fingerprint": self.fingerprint,
            "created_unix_s": self.created_unix_s,
            "files": [
                {"suffix": f.suffix, "n_bytes": f.n_bytes, "checksum": f.checksum}
                for f in self.files
            ],
        }
        return json.dumps(doc, ensure_ascii=False, indent=1).encode("utf-8")

    @classmethod
    def from_json(cls, data: bytes) -> CommitRecord:
        try:
            doc = json.loads(data)
            if doc["format"] != RECORD_FORMAT or doc["version"] != RECORD_VERSION:
                raise ValueError(f"format {doc['format']!r} version {doc['version']!r}")
            files = tuple(_entry(f) for f in doc["files"])
            record = cls(
                name=_str(doc["name"]),
                generation=_str(doc["generation"]),
                stage=_str(doc["stage"]),
                fingerprint=_str(doc["fingerprint"]),
                created_unix_s=float(doc["created_unix_s"]),
                files=files,
            )
        except (ValueError, KeyError, TypeError, RecursionError) as e:
            raise CorruptFileError(f"commit record is malformed: {e}") from None
        if record.file("") is None or len({f.suffix for f in files}) != len(files):
            raise CorruptFileError("commit record does not list F exactly once")
        return record


def _str(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected a string, got {type(value).__name__}")
    return value


def _entry(doc: Any) -> FileEntry:
    suffix = doc["suffix"]
    if suffix not in ALL_SUFFIXES:
        raise ValueError(f"unknown suffix {suffix!r}")
    n_bytes = doc["n_bytes"]
    if not isinstance(n_bytes, int) or isinstance(n_bytes, bool) or n_bytes < 0:
        raise ValueError(f"bad size {n_bytes!r}")
    return FileEntry(suffix=suffix, n_bytes=n_bytes, checksum=_str(doc["checksum"]))


def new_record(
    name: str, generation: str, stage: str, fingerprint: str, files: list[FileEntry]
) -> CommitRecord:
    return CommitRecord(name, generation, stage, fingerprint, time.time(), tuple(files))


def write_file(osio: OsAdapter, dir_fd: int, entry: str, data: bytes) -> None:
    """Write a small file whole (new, exclusive) and sync it."""
    fd = osio.open(entry, os.O_WRONLY | os.O_CREAT | os.O_EXCL, dir_fd=dir_fd)
    try:
        view = memoryview(data)
        while view:
            view = view[osio.write(fd, [view]) :]
        osio.fsync(fd)
    finally:
        osio.close(fd)


def read_small(osio: OsAdapter, dir_fd: int, entry: str, limit: int) -> bytes | None:
    """A small file's bytes, or None when it does not exist (ENOENT only)."""
    try:
        fd = osio.open(entry, os.O_RDONLY | os.O_NONBLOCK, dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    try:
        st = osio.fstat(fd)
        size = st.st_size
        if not stat.S_ISREG(st.st_mode):
            raise CorruptFileError(f"{entry!r} is not a regular file")
        if size > limit:
            raise CorruptFileError(f"{entry!r} is {size} bytes, larger than any record")
        return osio.read_up_to(fd, size)
    finally:
        osio.close(fd)


def read_record(root: SaveRoot, key: str, name: str | None = None) -> CommitRecord | None:
    """The commit record of key, None when there is none; checks it is F's when `name` given."""
    data = read_small(root.osio, root.commit_fd, record_name(key), MAX_RECORD_BYTES)
    if data is None:
        return None
    record = CommitRecord.from_json(data)
    if name is not None and record.name != name:
        raise CorruptFileError(f"commit record for {name!r} names {record.name!r}")
    return record


def is_pending(root: SaveRoot, record: CommitRecord) -> bool:
    """True while the record's stage folder exists (a stat error raises: never "absent")."""
    return root.osio.lstat(record.stage, dir_fd=root.stage_fd) is not None
