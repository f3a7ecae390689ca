"""`Publisher`: crash-safe publication and reading of slot-file generations.

A generation is `F` plus its sidecars, published as one unit:

1. sweep: complete or remove stages no live publication owns (`stage.sweep`);
2. stage: every file is written into `.kvswap/stage/<key>-<gen>/` and synced; the commit record
   (sizes, CRC-32s, fingerprint) is written there and synced; the stage folder and its parent
   are synced;
3. commit point, under the name lock held exclusively: the record is renamed to
   `.kvswap/commit/<key>.json` and that folder synced;
4. roll forward, still under the lock: the staged files are renamed over the committed ones, a
   sidecar the new generation lacks is unlinked (retired), the save path is synced, the stage
   folder removed.

A failure before step 3 leaves the previous generation untouched and removes what was staged.
A failure or crash after it leaves a pending publication that the next reader, publisher or
sweep completes. Readers hold the name lock shared while they read, so a commit never lands
under a reader. Lock order: sweep lock, then one name lock; nobody blocks on a lock while
holding a name lock.

Callers: worker threads (spill, save, restore), never the engine thread. One `Publisher` per save
path per process is the intended use (it owns the in-process half of the locks); other processes
and other instances are still excluded by `flock`. Does not call libllama.
"""

from __future__ import annotations

import logging
import mmap
import stat
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from kvswap.files import checksum, seqfile, sidecar
from kvswap.files.commits import CommitRecord, FileEntry, is_pending, new_record, read_record
from kvswap.files.errors import FilesError, FilesIOError
from kvswap.files.locks import LockTable
from kvswap.files.names import validate_filename
from kvswap.files.osio import OsAdapter
from kvswap.files.paths import SaveRoot, name_key, record_name
from kvswap.files.reader import Alloc, Generation, read_head, read_locked
from kvswap.files.sidecar import EncodedFile
from kvswap.files.stage import FileContent, Stage, roll_forward, sweep
from kvswap.files.types import ALL_SUFFIXES, SIDECAR_SUFFIXES, Suffix

log = logging.getLogger(__name__)

_MAX_ROLL_FORWARD_TRIES = 8


@dataclass(frozen=True)
class PublishReceipt:
    name: str
    generation: str
    files: tuple[FileEntry, ...]
    n_files: int  # files written, F included
    n_bytes: int  # bytes of every file, F included: what `save` reports as `n_written`
    t_ms: float


@dataclass
class InPlace:
    """`F` of a generation written in place (`Publisher.open_in_place`): its staged file,
    mapped for the caller to fill, then published (`publish_in_place`) or dropped
    (`cancel_in_place`). Its stage is live meanwhile: no sweep removes it; a crash leaves it to
    the next sweep, which removes it (it has no commit record)."""

    name: str
    stage: Stage
    fd: int
    buffer: mmap.mmap  # F's bytes, and room past them the caller may use (cut at publishing)


@dataclass(frozen=True)
class GenerationInfo:
    """A committed generation as listed (its record; nothing is read or verified)."""

    name: str
    generation: str
    fingerprint: str
    created_unix_s: float
    files: tuple[FileEntry, ...]
    pending: bool  # cut short after its commit point; the next read completes it


@contextmanager
def _os_errors(action: str, name: str = "") -> Iterator[None]:
    """Turn an `OSError` escaping the block into a `FilesIOError` naming the action."""
    try:
        yield
    except FilesError:
        raise
    except OSError as e:
        target = f" {name!r}" if name else ""
        raise FilesIOError(f"{action}{target} failed: {e.strerror or e}", e.errno) from e


def _head(content: FileContent, n_head: int) -> tuple[bytes, int]:
    """The first `n_head` bytes of a file's content, and its total size."""
    parts = content.parts if isinstance(content, EncodedFile) else content
    head = bytearray()
    n_bytes = 0
    for part in parts:
        view = memoryview(part).cast("B")
        n_bytes += len(view)
        if len(head) < n_head:
            head += view[: n_head - len(head)]
    return bytes(head), n_bytes


def _check_contents(files: Mapping[str, FileContent]) -> None:
    """Refuse to publish files that do not start as their kind must (a caller's bug)."""
    unknown = set(files) - set(ALL_SUFFIXES)
    if unknown or "" not in files:
        raise ValueError(f"files must map '' (F) and optional sidecars, got {sorted(files)}")
    head, n_bytes = _head(files[""], seqfile.FIXED_HEADER_BYTES)
    try:
        seqfile.parse_fixed_header(head, n_bytes)
    except FilesError as e:
        raise ValueError(f"F is not a sequence file: {e}") from None
    for suffix in SIDECAR_SUFFIXES:
        if suffix in files and _head(files[suffix], 4)[0] != sidecar.MAGIC[suffix]:
            raise ValueError(f"{suffix} content is not a sidecar (use sidecar.encode)")


class Publisher:
    """Publishes, reads, lists and removes generations under one `--slot-save-path`.

    `save_dir` must exist; `.kvswap/` is created in it. `os_adapter` is the fault seam (tests).
    `recover` runs the sweep at construction (completing publications cut short by a crash).
    `overlap_crc` computes checksums on a helper thread while the caller's thread does I/O (see
    `checksum`). `close()` releases the directory descriptors and the helper thread.
    """

    def __init__(
        self,
        save_dir: Path,
        os_adapter: OsAdapter | None = None,
        *,
        recover: bool = True,
        overlap_crc: bool = False,
    ) -> None:
        self._osio = os_adapter if os_adapter is not None else OsAdapter()
        with _os_errors("opening the slot save path", str(save_dir)):
            self._root = SaveRoot.open(Path(save_dir), self._osio)
        self._locks = LockTable(self._osio, self._root.lock_fd)
        self._live: set[str] = set()
        self._live_mutex = threading.Lock()
        self._overlap_crc = overlap_crc
        self._executor: ThreadPoolExecutor | None = None
        if recover:
            self.recover()

    def close(self) -> None:
        with self._live_mutex:
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=True)
        self._root.close()

    def _crc_executor(self) -> ThreadPoolExecutor | None:
        """The helper thread that computes CRCs while the caller's thread does I/O."""
        if not self._overlap_crc:
            return None
        with self._live_mutex:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(1, thread_name_prefix="kvswap-crc")
            return self._executor

    def __enter__(self) -> Publisher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def recover(self) -> int:
        """Complete publications cut short after their commit point and remove orphan stages.

        Returns the number of stages handled. Runs at construction and before every publish and
        read; a stage whose name is busy right now is left for a later call.
        """
        with self._live_mutex:
            live = frozenset(self._live)
        with _os_errors("sweeping stages"):
            return sweep(self._root, self._locks, live)

    def publish(
        self, name: str, files: Mapping[str, FileContent], fingerprint: str
    ) -> PublishReceipt:
        """Publish a generation of `name`: key "" is `F`, ".ckpt"/".dft"/".lora" sidecars.

        Each value is a sequence of buffers (written zero-copy, concatenated) or a
        `sidecar.EncodedFile` (its CRC is reused). Sidecars not given are retired. Raises
        `InvalidNameError`, `UnsafePathError` (an existing file of the generation is a
        symlink), `FilesIOError`; on any error before the commit point the previous generation
        is untouched and nothing stays staged.
        """
        t0 = time.perf_counter()
        validate_filename(name)
        _check_contents(files)
        key = name_key(name)
        try:
            self.recover()
            with _os_errors("staging", name):
                stage = Stage.create(self._root, self._locks, key)
        except FilesError as e:
            e.committed = False
            raise
        with self._live_mutex:
            self._live.add(stage.stage_id)
        try:
            entries = self._publish_staged(stage, name, files, fingerprint)
        finally:
            with self._live_mutex:
                self._live.discard(stage.stage_id)
        n_bytes = sum(e.n_bytes for e in entries)
        t_ms = (time.perf_counter() - t0) * 1e3
        return PublishReceipt(name, stage.generation, entries, len(entries), n_bytes, t_ms)

    def _publish_staged(
        self, stage: Stage, name: str, files: Mapping[str, FileContent], fingerprint: str
    ) -> tuple[FileEntry, ...]:
        def write() -> tuple[FileEntry, ...]:
            order: list[Suffix] = [s for s in ALL_SUFFIXES if s in files]
            executor = self._crc_executor()
            return tuple(stage.write(suffix, files[suffix], executor) for suffix in order)

        return self._commit_staged(stage, name, write, fingerprint)

    # -- F written in place -----------------------------------------------------------------

    def open_in_place(self, name: str, n_bytes: int) -> InPlace:
        """Stage a generation of `name` whose `F` the caller writes through a mapping of
        `n_bytes` (its disk blocks allocated now: a full disk fails here, not while it is
        filled). Raises `InvalidNameError`, `FilesIOError`; nothing stays staged then."""
        validate_filename(name)
        key = name_key(name)
        self.recover()
        with _os_errors("staging", name):
            stage = Stage.create(self._root, self._locks, key)
        with self._live_mutex:
            self._live.add(stage.stage_id)
        try:
            with _os_errors("allocating", name):
                fd, buffer = stage.create_mapped("", n_bytes)
        except BaseException:
            self._drop_stage(stage)
            raise
        return InPlace(name, stage, fd, buffer)

    def publish_in_place(
        self,
        staged: InPlace,
        n_bytes: int,
        sidecars: Callable[[memoryview], Mapping[str, FileContent]],
        fingerprint: str,
    ) -> PublishReceipt:
        """Publish `staged` as a generation: `F` its first `n_bytes` (the rest of the mapping
        is cut), with the sidecars `sidecars(mapping)` makes (views of the mapping past `F`,
        say); they are dropped, and the mapping closed, before this returns. Raises as
        `publish`; on any error before the commit point nothing stays staged."""
        t0 = time.perf_counter()
        stage, name = staged.stage, staged.name

        def write() -> tuple[FileEntry, ...]:
            with memoryview(staged.buffer) as view:
                files = sidecars(view)
                try:
                    _check_contents({"": [view[:n_bytes]], **files})
                    executor = self._crc_executor()
                    order = [s for s in SIDECAR_SUFFIXES if s in files]
                    entries = [stage.write(suffix, files[suffix], executor) for suffix in order]
                    crc = checksum.update(0, view[:n_bytes])  # out of the page cache
                finally:
                    del files
            staged.buffer.close()
            staged.fd, fd = -1, staged.fd
            return (stage.seal("", fd, n_bytes, crc), *entries)

        try:
            entries = self._commit_staged(stage, name, write, fingerprint)
        finally:
            self._close_in_place(staged)
            with self._live_mutex:
                self._live.discard(stage.stage_id)
        n_total = sum(e.n_bytes for e in entries)
        t_ms = (time.perf_counter() - t0) * 1e3
        return PublishReceipt(name, stage.generation, entries, len(entries), n_total, t_ms)

    def cancel_in_place(self, staged: InPlace) -> None:
        """Drop a generation opened in place and never published (best effort, logged)."""
        self._close_in_place(staged)
        self._drop_stage(staged.stage)

    def _close_in_place(self, staged: InPlace) -> None:
        try:
            staged.buffer.close()  # idempotent
        except BufferError:  # a view of it outlives the call (a caller's bug): unmapped at GC
            log.warning("kvswap.files: %s: a view of the file written in place is still alive",
                        staged.name)  # fmt: skip
        if staged.fd >= 0:
            staged.fd, fd = -1, staged.fd
            self._root.osio.close(fd)

    def _drop_stage(self, stage: Stage) -> None:
        stage.discard()
        with self._live_mutex:
            self._live.discard(stage.stage_id)

    def _commit_staged(
        self,
        stage: Stage,
        name: str,
        write: Callable[[], tuple[FileEntry, ...]],
        fingerprint: str,
    ) -> tuple[FileEntry, ...]:
        """Write the stage's files (`write`), then its record, and commit it (see the module
        docstring); before the commit point a failure discards the stage."""
        committed: bool | None = False
        try:
            with _os_errors("writing", name):
                entries = write()
                record = new_record(name, stage.generation, stage.stage_id, fingerprint, [*entries])
                stage.write_record(record)
            with _os_errors("committing", name), self._locks.hold(stage.key, exclusive=True):
                for suffix in ALL_SUFFIXES:
                    self._root.check_not_symlink(name + suffix)
                committed = None  # from here a failure may or may not have passed the commit
                stage.commit()
                committed = True
                stage.close_dir()
                roll_forward(self._root, record)
            with _os_errors("finishing", name):
                stage.finish()
            return entries
        except BaseException as e:
            if committed is None:
                committed = self._committed(stage)
            if committed is False:
                stage.discard()
            else:
                stage.abandon()  # committed, or unknown: the record decides at the next sweep
            if isinstance(e, FilesError):
                e.committed = committed
            raise

    def _committed(self, stage: Stage) -> bool | None:
        """After a failure around the commit point: does the record point at this stage?"""
        try:
            record = read_record(self._root, stage.key)
        except (OSError, FilesError):
            return None
        return record is not None and record.stage == stage.stage_id

    def read_generation(
        self,
        name: str,
        expected_fingerprint: str,
        *,
        alloc: Alloc | None = None,
        max_bytes: int | None = None,
        mapped: bool = False,
    ) -> Generation:
        """Read and verify generation `name` (see `reader`); completes a pending one first.

        `alloc(n)` supplies the buffers (default: anonymous maps the `Generation` owns);
        `max_bytes` refuses a generation larger than that before allocating anything; `mapped`:
        `F`'s state a view of the file mapped (a folder no other program writes).
        Raises `InvalidNameError`, `NotFoundError`, `UnsafePathError`, `CorruptFileError` (F
        fails its record's size/checksum, or its structure), `WrongModelError`,
        `TooLargeError`, `FilesIOError`.
        """
        validate_filename(name)
        self.recover()
        key = name_key(name)
        for _ in range(_MAX_ROLL_FORWARD_TRIES):
            with _os_errors("reading", name):
                with self._locks.hold(key, exclusive=False):
                    record = read_record(self._root, key, name)
                    if record is None or not is_pending(self._root, record):
                        executor = self._crc_executor()
                        return read_locked(
                            self._root,
                            name,
                            record,
                            expected_fingerprint,
                            alloc,
                            executor,
                            max_bytes,
                            mapped,
                        )
                self._complete(key, name)
        raise FilesIOError(f"slot file {name!r} keeps being republished; try again")

    def _complete(self, key: str, name: str) -> None:
        with self._locks.hold(key, exclusive=True):
            record = read_record(self._root, key, name)
            if record is not None:
                roll_forward(self._root, record)

    def read_head(self, name: str, n_bytes: int) -> bytes:
        """The first `n_bytes` of `F` of generation `name` (e.g. its header), under its name
        lock; b"" when there is no such file."""
        validate_filename(name)
        with _os_errors("reading", name), self._locks.hold(name_key(name), exclusive=False):
            return read_head(self._root, name, n_bytes)

    def list_generations(self) -> list[GenerationInfo]:
        """Every committed generation with a commit record, by name (sidecar files unread)."""
        infos: list[GenerationInfo] = []
        osio, save_fd = self._root.osio, self._root.save_fd
        with _os_errors("listing commit records"):
            for entry in sorted(osio.listdir(self._root.commit_fd)):
                key = entry.removesuffix(".json")
                if entry == key or record_name(key) != entry:
                    continue
                record = read_record(self._root, key)
                st = None if record is None else osio.lstat(record.name, dir_fd=save_fd)
                if record is None or st is None or not stat.S_ISREG(st.st_mode):
                    continue  # removed meanwhile, F gone, or F replaced by a non-file
                infos.append(_info(record, is_pending(self._root, record)))
        return sorted(infos, key=lambda i: i.name)

    def remove(self, name: str) -> bool:
        """Remove generation `name` (F, its sidecars, its record); False if there was nothing.

        Order: sidecars, F, record, each folder synced; a crash between leaves a record whose
        F is gone (read as not found) or F without sidecars, never a mixed generation.
        """
        validate_filename(name)
        self.recover()
        key = name_key(name)
        osio, root = self._root.osio, self._root
        with _os_errors("removing", name), self._locks.hold(key, exclusive=True):
            record = read_record(root, key, name)
            if record is not None:
                roll_forward(root, record)
            for suffix in ALL_SUFFIXES:
                root.check_not_symlink(name + suffix)
            removed = False
            for suffix in (*SIDECAR_SUFFIXES, ""):
                removed |= osio.unlink(name + suffix, dir_fd=root.save_fd, missing_ok=True)
            osio.fsync_dir(root.save_fd)
            if record is not None:
                osio.unlink(record_name(key), dir_fd=root.commit_fd, missing_ok=True)
                osio.fsync_dir(root.commit_fd)
                removed = True
        return removed


def _info(record: CommitRecord, pending: bool) -> GenerationInfo:
    return GenerationInfo(
        record.name,
        record.generation,
        record.fingerprint,
        record.created_unix_s,
        record.files,
        pending,
    )
