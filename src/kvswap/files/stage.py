"""Stage folders: where a generation is written before it is committed, and their lifecycle.

A publisher creates `.kvswap/stage/<key>-<gen>/` and its lock file `<key>-<gen>.lock` (held with
`flock` for the whole publication) while holding the sweep lock shared, so a sweeper (sweep lock
exclusive) never sees a stage whose owner has not locked it yet. A stage whose lock is free has
no live publisher: the sweep completes it when the name's commit record points at it (the owner
died after its commit point: roll forward) and removes it otherwise (the owner died or failed
before it). `roll_forward` moves the files named by a record from its stage into the save path,
retires the sidecars the record lacks, syncs the save path and removes the stage; it is
idempotent, so a crash anywhere inside it is completed by the next call.

Owns: stage creation, writing and syncing staged files, discarding a stage, `roll_forward` and
the sweep. Callers: `publish` (worker threads). Roll-forward requires the name lock held
exclusively by the caller; the sweep takes the locks it needs, never blocking on a name lock.
"""

from __future__ import annotations

import logging
import mmap
import os
import stat
import uuid
from collections.abc import Callable, Collection, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass

from kvswap.files import checksum
from kvswap.files.commits import CommitRecord, FileEntry, read_record, write_file
from kvswap.files.errors import CorruptFileError, FilesIOError
from kvswap.files.locks import LockTable
from kvswap.files.mapping import populate_shared
from kvswap.files.osio import OsAdapter
from kvswap.files.paths import RECORD_STAGED, ROLE, SWEEP_LOCK, SaveRoot, stage_lock_name
from kvswap.files.sidecar import EncodedFile
from kvswap.files.types import SIDECAR_SUFFIXES, Buffer, Suffix

log = logging.getLogger(__name__)

FileContent = Sequence[Buffer] | EncodedFile
_KEY_HEX_CHARS = 64
_MAX_BATCH = 64  # buffers per writev


def _quietly(what: str, fn: Callable[[], object]) -> None:
    """Run a cleanup step whose failure must not mask the error being reported; log it.

    Whatever such a step leaves behind is an unlocked stage, which the next sweep removes.
    """
    try:
        fn()
    except OSError as e:
        log.warning("kvswap.files: cleanup step %s failed (%s); the next sweep retries", what, e)


@dataclass
class Stage:
    """A live publication's stage folder; its lock is held until `finish`/`discard`/`abandon`."""

    root: SaveRoot
    key: str
    generation: str
    stage_id: str
    lock_fd: int
    dir_fd: int

    @classmethod
    def create(cls, root: SaveRoot, locks: LockTable, key: str) -> Stage:
        osio = root.osio
        generation = uuid.uuid4().hex
        stage_id = f"{key}-{generation}"
        lock_entry = stage_lock_name(stage_id)
        lock_fd = dir_fd = -1
        try:
            with locks.hold(SWEEP_LOCK, exclusive=False):
                flags = os.O_RDWR | os.O_CREAT | os.O_EXCL
                lock_fd = osio.open(lock_entry, flags, dir_fd=root.stage_fd)
                if not osio.flock(lock_fd, exclusive=True, blocking=False):
                    raise FilesIOError(f"fresh stage lock {lock_entry!r} is held by someone else")
                osio.mkdir(stage_id, dir_fd=root.stage_fd)
                dir_fd = osio.open_dir(stage_id, dir_fd=root.stage_fd)
        except BaseException:
            if dir_fd >= 0:
                _quietly("close", lambda: osio.close(dir_fd))
            _quietly("rmdir", lambda: osio.rmdir(stage_id, dir_fd=root.stage_fd, missing_ok=True))
            # O_EXCL made the lock file's name ours even if its open then reported an error
            stage_fd = root.stage_fd
            _quietly("unlink", lambda: osio.unlink(lock_entry, dir_fd=stage_fd, missing_ok=True))
            if lock_fd >= 0:
                _quietly("close", lambda: osio.close(lock_fd))
            raise
        return cls(root, key, generation, stage_id, lock_fd, dir_fd)

    def write(
        self, suffix: Suffix, content: FileContent, executor: Executor | None = None
    ) -> FileEntry:
        """Write one file of the generation into the stage and sync it; returns its entry.

        Parts are cut into `CHUNK_BYTES` slices; each slice's CRC is computed on `executor`
        (inline without one) while the previous slice is written, unless the content brings its
        CRC; small parts are gathered into one `writev`.
        """
        osio = self.root.osio
        known_crc = content.crc32 if isinstance(content, EncodedFile) else None
        parts = content.parts if isinstance(content, EncodedFile) else content
        crc = checksum.StreamCrc(executor)
        fd = osio.open(ROLE[suffix], os.O_WRONLY | os.O_CREAT | os.O_EXCL, dir_fd=self.dir_fd)
        try:
            n_bytes = 0
            batch: list[memoryview] = []
            n_batch = 0
            for part in parts:
                view = memoryview(part).cast("B")
                for off in range(0, len(view), checksum.CHUNK_BYTES):
                    chunk = view[off : off + checksum.CHUNK_BYTES]
                    if known_crc is None:
                        crc.feed(chunk)
                    batch.append(chunk)
                    n_batch += len(chunk)
                    if n_batch >= checksum.CHUNK_BYTES or len(batch) >= _MAX_BATCH:
                        _write_all(osio, fd, batch)
                        n_bytes += n_batch
                        batch, n_batch = [], 0
            _write_all(osio, fd, batch)
            n_bytes += n_batch
            osio.fsync(fd)
        finally:
            osio.close(fd)
        value = crc.value() if known_crc is None else known_crc
        return FileEntry(suffix=suffix, n_bytes=n_bytes, checksum=checksum.to_text(value))

    def create_mapped(self, suffix: Suffix, n_bytes: int) -> tuple[int, mmap.mmap]:
        """A file of the generation created at `n_bytes`, its blocks allocated, and a shared
        mapping of it for the caller to fill (`seal` ends it), its pages faulted in already
        (`mapping.populate_shared`: the caller's fill is then a memcpy)."""
        osio = self.root.osio
        fd = osio.open(ROLE[suffix], os.O_RDWR | os.O_CREAT | os.O_EXCL, dir_fd=self.dir_fd)
        try:
            osio.allocate(fd, n_bytes)
            buffer = mmap.mmap(fd, n_bytes, flags=mmap.MAP_SHARED)
            try:
                populate_shared(buffer)
            except BaseException:
                buffer.close()
                raise
            return fd, buffer
        except BaseException:
            osio.close(fd)
            raise

    def seal(self, suffix: Suffix, fd: int, n_bytes: int, crc: int) -> FileEntry:
        """A mapped file filled (its mapping closed): cut to its `n_bytes`, synced, closed;
        `crc` is the CRC-32 of those bytes."""
        osio = self.root.osio
        try:
            osio.truncate(fd, n_bytes)
            osio.fsync(fd)
        finally:
            osio.close(fd)
        return FileEntry(suffix=suffix, n_bytes=n_bytes, checksum=checksum.to_text(crc))

    def write_record(self, record: CommitRecord) -> None:
        """Write the record into the stage, then make the stage's entries durable."""
        osio = self.root.osio
        write_file(osio, self.dir_fd, RECORD_STAGED, record.to_json())
        osio.fsync_dir(self.dir_fd)  # the staged files' names, for a roll forward after a crash
        osio.fsync_dir(self.root.stage_fd)  # the stage folder's own name

    def commit(self) -> None:
        """The commit point: the record's rename into `commit/`, then its directory's sync.

        Caller holds the name lock exclusively.
        """
        osio = self.root.osio
        osio.replace(
            RECORD_STAGED,
            f"{self.key}.json",
            src_dir_fd=self.dir_fd,
            dst_dir_fd=self.root.commit_fd,
        )
        osio.fsync_dir(self.root.commit_fd)

    def close_dir(self) -> None:
        if self.dir_fd >= 0:
            fd, self.dir_fd = self.dir_fd, -1
            self.root.osio.close(fd)

    def close_lock(self) -> None:
        """Release the stage lock (closing its only descriptor); idempotent."""
        if self.lock_fd >= 0:
            fd, self.lock_fd = self.lock_fd, -1
            self.root.osio.close(fd)

    def finish(self) -> None:
        """After a completed roll forward: drop the lock file and the lock."""
        osio = self.root.osio
        self.close_dir()
        try:
            osio.unlink(stage_lock_name(self.stage_id), dir_fd=self.root.stage_fd, missing_ok=True)
        finally:
            self.close_lock()

    def discard(self) -> None:
        """Before the commit point: remove everything staged (best effort, logged)."""
        osio = self.root.osio
        _quietly("close", self.close_dir)
        _quietly("remove stage", lambda: remove_stage(self.root, self.stage_id))
        lock_entry = stage_lock_name(self.stage_id)
        _quietly("unlink", lambda: osio.unlink(lock_entry, dir_fd=self.root.stage_fd))
        _quietly("close", self.close_lock)

    def abandon(self) -> None:
        """After the commit point, or when it is unknown: keep the stage for a roll forward."""
        _quietly("close", self.close_dir)
        _quietly("close", self.close_lock)


def _write_all(osio: OsAdapter, fd: int, views: list[memoryview]) -> None:
    """Write `views` in order, resuming after partial writes."""
    i = 0
    while i < len(views):
        n = osio.write(fd, views[i:])
        if n <= 0:
            raise FilesIOError("write made no progress")
        while i < len(views) and n >= len(views[i]):
            n -= len(views[i])
            i += 1
        if n:
            views[i] = views[i][n:]


def remove_stage(root: SaveRoot, stage_id: str) -> None:
    """Remove a stage folder and what it holds (a stray non-folder entry is unlinked)."""
    osio = root.osio
    st = osio.lstat(stage_id, dir_fd=root.stage_fd)
    if st is None:
        return
    if not stat.S_ISDIR(st.st_mode):
        osio.unlink(stage_id, dir_fd=root.stage_fd, missing_ok=True)
        return
    dir_fd = osio.open_dir(stage_id, dir_fd=root.stage_fd)
    try:
        for entry in osio.listdir(dir_fd):
            osio.unlink(entry, dir_fd=dir_fd, missing_ok=True)
    finally:
        osio.close(dir_fd)
    osio.rmdir(stage_id, dir_fd=root.stage_fd, missing_ok=True)


def roll_forward(root: SaveRoot, record: CommitRecord) -> bool:
    """Complete a committed publication; False when it was already complete.

    Caller holds the name lock exclusively. Idempotent: every step can be repeated after a crash.
    """
    osio = root.osio
    try:
        dir_fd = osio.open_dir(record.stage, dir_fd=root.stage_fd)
    except FileNotFoundError:
        return False
    try:
        for entry in record.files:
            role = ROLE[entry.suffix]
            if osio.lstat(role, dir_fd=dir_fd) is not None:
                osio.replace(
                    role, record.name + entry.suffix, src_dir_fd=dir_fd, dst_dir_fd=root.save_fd
                )
        for suffix in SIDECAR_SUFFIXES:
            if record.file(suffix) is None:  # retire a sidecar the new generation lacks
                osio.unlink(record.name + suffix, dir_fd=root.save_fd, missing_ok=True)
        osio.fsync_dir(root.save_fd)
        for leftover in osio.listdir(dir_fd):
            osio.unlink(leftover, dir_fd=dir_fd, missing_ok=True)
    finally:
        osio.close(dir_fd)
    osio.rmdir(record.stage, dir_fd=root.stage_fd, missing_ok=True)
    return True


def sweep(root: SaveRoot, locks: LockTable, live: Collection[str]) -> int:
    """Complete or remove every stage without a live publisher; returns how many were handled.

    `live` holds this process's own live stage ids (skipped whatever `flock` says).
    """
    osio = root.osio
    n_handled = 0
    with locks.hold(SWEEP_LOCK, exclusive=True):
        entries = osio.listdir(root.stage_fd)
        stage_ids = sorted({e.removesuffix(".lock") for e in entries})
        for stage_id in stage_ids:
            if stage_id not in live and _sweep_one(root, locks, stage_id):
                n_handled += 1
    return n_handled


def _sweep_one(root: SaveRoot, locks: LockTable, stage_id: str) -> bool:
    osio = root.osio
    lock_entry = stage_lock_name(stage_id)
    try:
        lock_fd: int | None = osio.open(lock_entry, os.O_RDWR, dir_fd=root.stage_fd)
    except FileNotFoundError:
        lock_fd = None  # a folder without a lock file: its owner is gone
    try:
        if lock_fd is not None and not osio.flock(lock_fd, exclusive=True, blocking=False):
            return False  # a live publication owns it
        key = stage_id.partition("-")[0]
        record = None
        if len(key) == _KEY_HEX_CHARS:
            try:
                record = read_record(root, key)
            except CorruptFileError as e:
                log.warning("kvswap.files: leaving stage %s: %s", stage_id, e)
                return False
        if record is not None and record.stage == stage_id:
            with locks.hold(key, exclusive=True, blocking=False) as held:
                if not held:
                    return False  # a reader or publisher of that name is busy: next time
                roll_forward(root, record)
        else:
            remove_stage(root, stage_id)
        osio.unlink(lock_entry, dir_fd=root.stage_fd, missing_ok=True)
        return True
    finally:
        if lock_fd is not None:
            osio.close(lock_fd)
