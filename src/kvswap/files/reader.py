"""Reading one generation: `F` into a state buffer, sidecars into sections, all verified.

`F` is read with plain reads into an anonymous `mmap` (or a buffer from the caller's `alloc`)
laid out as `[8-byte RAM-state prefix | payload]`, so `Generation.state` goes to
`llama_state_seq_set_data` as is: the read is the only copy. Not a file mapping, for two
reasons: a file mapping faults pages in lazily, which would move disk I/O onto the engine thread
at `set_data` time; and a file truncated in place while mapped (llama-server rewrites `F` in
place) raises SIGBUS, which kills the process, where a read returns an error. An anonymous map
is released by `Generation.close()` (which fails loudly while a caller still holds a view)
rather than whenever the last reference dies. The one exception, asked by a caller that owns
every name in its folder (the minds' own copies, `mapped=True`): `F` is mapped with its pages
read in on the calling I/O thread first (`mapping`), so the engine copies the state straight
out of the page cache, with no buffer to fault in and no second copy.

With a commit record, every file's size and CRC-32 are checked against it while it is read
(one pass): a bad `F` is a `CorruptFileError` and is never applied; a missing, torn or
bit-flipped sidecar gets a `missing`/`corrupt` status with the reason and the caller restores
that part cold. Without a record (`F` written by llama-server or `llama_state_seq_save_file`),
`F` is checked structurally, no sidecar is read, and the generation is flagged `foreign`.

Owns the read path. Callers: `publish.Publisher.read_generation`, with the name lock held shared.
Does not lock, roll forward or sweep.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import stat
import time
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Literal

from kvswap.files import checksum, seqfile, sidecar
from kvswap.files.commits import CommitRecord, FileEntry
from kvswap.files.errors import (
    CorruptFileError,
    NotFoundError,
    TooLargeError,
    UnsafePathError,
    WrongModelError,
)
from kvswap.files.mapping import map_populated, new_buffer
from kvswap.files.osio import OsAdapter, is_symlink_refusal
from kvswap.files.paths import SaveRoot
from kvswap.files.types import SIDECAR_SUFFIXES, Suffix

# Returns a writable buffer of at least n bytes that the caller owns (e.g. a page-store buffer).
Alloc = Callable[[int], memoryview]
SidecarStatus = Literal["ok", "absent", "missing", "corrupt"]


@dataclass
class SidecarRead:
    """One sidecar of a generation: decoded (`ok`), or why that part restores cold."""

    suffix: Suffix
    status: SidecarStatus  # ok | absent (generation has none) | missing | corrupt
    reason: str = ""
    sidecar: sidecar.Sidecar | None = None


@dataclass
class Generation:
    """A read generation. Views of buffers it owns: `close()` it when the state is applied."""

    name: str
    tokens: seqfile.Tokens
    state: memoryview  # RAM-state prefix + payload, for llama_state_seq_set_data
    packed: bool  # F's token list was llama-server's packed form
    foreign: bool  # no commit record: not written by kvswap, no sidecars, fingerprint unknown
    record: CommitRecord | None
    sidecars: dict[Suffix, SidecarRead]
    n_bytes_read: int  # F and the sidecars read: what `restore` reports as `n_read`
    read_ms: float
    _maps: list[mmap.mmap] = field(default_factory=list, repr=False)

    @property
    def payload(self) -> memoryview:
        return self.state[seqfile.STATE_PREFIX_BYTES :]

    def close(self) -> None:
        """Release the buffers; raises BufferError while a caller still exports a view."""
        for read in self.sidecars.values():
            if read.sidecar is not None:
                for section in read.sidecar.sections:
                    section.release()
        self.state.release()
        while self._maps:
            self._maps[-1].close()
            self._maps.pop()

    def __enter__(self) -> Generation:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Buffers:
    """Buffers allocated for one read; freed again if the read fails."""

    def __init__(self, alloc: Alloc | None) -> None:
        self.alloc = alloc
        self.maps: list[mmap.mmap] = []

    def get(self, n_bytes: int) -> memoryview:
        if self.alloc is not None:
            view = self.alloc(n_bytes).cast("B")
            if len(view) < n_bytes or view.readonly:
                raise ValueError(f"alloc gave {len(view)} bytes, needs {n_bytes} writable")
            return view[:n_bytes]
        m = new_buffer(n_bytes)  # faulted in ahead: a read into fresh memory faults per page
        self.maps.append(m)
        return memoryview(m)[:n_bytes]


def _open_regular(osio: OsAdapter, dir_fd: int, entry: str) -> int | None:
    """Open a regular file for reading, never through a symlink; None when it does not exist."""
    try:
        fd = osio.open(entry, os.O_RDONLY | os.O_NONBLOCK, dir_fd=dir_fd)  # a FIFO never blocks
    except FileNotFoundError:
        return None
    except OSError as e:
        if is_symlink_refusal(e):
            raise UnsafePathError(f"{entry!r} in the slot save path is a symlink") from None
        raise
    try:
        if not stat.S_ISREG(osio.fstat(fd).st_mode):
            raise UnsafePathError(f"{entry!r} in the slot save path is not a regular file")
    except BaseException:
        osio.close(fd)
        raise
    return fd


def read_head(root: SaveRoot, name: str, n_bytes: int) -> bytes:
    """The first `n_bytes` of file `name` (fewer if it is shorter; b"" when it is absent),
    through the adapter, never through a symlink or from a FIFO."""
    osio = root.osio
    fd = _open_regular(osio, root.save_fd, name)
    if fd is None:
        return b""
    try:
        return osio.read_up_to(fd, n_bytes)
    finally:
        osio.close(fd)


def _read_exact(osio: OsAdapter, fd: int, view: memoryview, crc: checksum.StreamCrc) -> None:
    """Fill `view` from `fd`, feeding each piece to `crc`; a file that ends early is corrupt."""
    got = 0
    while got < len(view):
        chunk = view[got : got + checksum.CHUNK_BYTES]
        n = osio.readinto(fd, chunk)
        if n == 0:
            raise CorruptFileError("file ended early (truncated while being read)")
        crc.feed(chunk[:n])
        got += n


def _read_seq(
    osio: OsAdapter,
    fd: int,
    record: CommitRecord | None,
    bufs: _Buffers,
    crc: checksum.StreamCrc,
    max_bytes: int | None,
) -> tuple[seqfile.Tokens, bool, memoryview, int]:
    size = osio.fstat(fd).st_size
    entry = _checked_size(size, record, max_bytes)
    head = memoryview(bytearray(seqfile.FIXED_HEADER_BYTES))
    if size >= len(head):
        _read_exact(osio, fd, head, crc)
    n_words = seqfile.parse_fixed_header(head, size)
    words = memoryview(bytearray(4 * n_words))
    _read_exact(osio, fd, words, crc)
    tokens, packed = seqfile.parse_words(words)
    n_payload = size - seqfile.FIXED_HEADER_BYTES - 4 * n_words
    state = bufs.get(seqfile.STATE_PREFIX_BYTES + n_payload)
    seqfile.write_state_prefix(state)
    _read_exact(osio, fd, state[seqfile.STATE_PREFIX_BYTES :], crc)
    if entry is not None and checksum.to_text(crc.value()) != entry.checksum:
        raise CorruptFileError("checksum does not match its commit record")
    return tokens, packed, state, size


def _seq(
    osio: OsAdapter,
    fd: int,
    record: CommitRecord | None,
    bufs: _Buffers,
    executor: Executor | None,
    max_bytes: int | None,
    mapped: bool,
) -> tuple[seqfile.Tokens, bool, memoryview, int]:
    """`F` mapped when asked and it can be (`_map_seq`), else read (`_read_seq`)."""
    if mapped and record is not None:
        got = _map_seq(osio, fd, record, bufs, checksum.StreamCrc(executor), max_bytes)
        if got is not None:
            return got
    return _read_seq(osio, fd, record, bufs, checksum.StreamCrc(executor), max_bytes)


def _checked_size(
    size: int, record: CommitRecord | None, max_bytes: int | None
) -> FileEntry | None:
    """`F`'s entry in its commit record, once its `size` is the record's and, with its
    sidecars, within `max_bytes`."""
    entry = record.file("") if record is not None else None
    if max_bytes is not None:
        n_sidecars = sum(e.n_bytes for e in record.files if e.suffix) if record else 0
        if size + n_sidecars > max_bytes:
            raise TooLargeError(f"{size + n_sidecars} bytes, more than the limit of {max_bytes}")
    if entry is not None and size != entry.n_bytes:
        raise CorruptFileError(
            f"{size} bytes, its commit record says {entry.n_bytes}: torn, or rewritten by "
            "another program since kvswap published it"
        )
    return entry


def _map_seq(
    osio: OsAdapter,
    fd: int,
    record: CommitRecord,
    bufs: _Buffers,
    crc: checksum.StreamCrc,
    max_bytes: int | None,
) -> tuple[seqfile.Tokens, bool, memoryview, int] | None:
    """`_read_seq` through a mapping of `F` (`mapping.map_populated`): the state is a view of
    the mapping, its prefix written over the word before the payload; None when the kernel
    cannot map it so (the caller reads it)."""
    size = osio.fstat(fd).st_size
    entry = _checked_size(size, record, max_bytes)
    if entry is None or size < seqfile.FIXED_HEADER_BYTES:
        return None
    m = map_populated(fd, size)
    if m is None:
        return None
    bufs.maps.append(m)
    view = memoryview(m)
    n_words = seqfile.parse_fixed_header(view[: seqfile.FIXED_HEADER_BYTES], size)
    at = seqfile.FIXED_HEADER_BYTES + 4 * n_words
    if at > size:
        raise CorruptFileError(f"sequence file of {size} bytes is truncated")
    tokens, packed = seqfile.parse_words(bytearray(view[seqfile.FIXED_HEADER_BYTES : at]))
    for offset in range(0, size, checksum.CHUNK_BYTES):
        crc.feed(view[offset : offset + checksum.CHUNK_BYTES])
    if checksum.to_text(crc.value()) != entry.checksum:
        raise CorruptFileError("checksum does not match its commit record")
    state = view[at - seqfile.STATE_PREFIX_BYTES :]  # the header's 12 bytes are before it
    seqfile.write_state_prefix(state)  # over the last word or the header, in memory only
    return tokens, packed, state, size


def _read_sidecar(
    root: SaveRoot, name: str, entry: FileEntry, bufs: _Buffers, crc: checksum.StreamCrc
) -> SidecarRead:
    osio = root.osio
    suffix = entry.suffix
    fd = _open_regular(osio, root.save_fd, name + suffix)
    if fd is None:
        return SidecarRead(suffix, "missing", "listed in the commit record but absent")
    try:
        size = osio.fstat(fd).st_size
        if size != entry.n_bytes:
            return SidecarRead(suffix, "corrupt", f"{size} bytes, record says {entry.n_bytes}")
        data = bufs.get(size)
        body_end = max(size - sidecar.TRAILER_BYTES, 0)
        _read_exact(osio, fd, data[:body_end], crc)
        body_crc = crc.value()
        _read_exact(osio, fd, data[body_end:], crc)
    except CorruptFileError as e:
        return SidecarRead(suffix, "corrupt", str(e))
    finally:
        osio.close(fd)
    if checksum.to_text(crc.value()) != entry.checksum:
        return SidecarRead(suffix, "corrupt", "checksum does not match its commit record")
    try:
        decoded = sidecar.decode(suffix, data, body_crc=body_crc)
    except CorruptFileError as e:
        return SidecarRead(suffix, "corrupt", str(e))
    return SidecarRead(suffix, "ok", "", decoded)


def read_locked(
    root: SaveRoot,
    name: str,
    record: CommitRecord | None,
    expected_fingerprint: str,
    alloc: Alloc | None = None,
    executor: Executor | None = None,
    max_bytes: int | None = None,
    mapped: bool = False,
) -> Generation:
    """Read generation `name` (caller holds its name lock shared and rolled it forward).
    `max_bytes` bounds F plus its sidecars, checked before any buffer is allocated; `mapped`:
    `F`'s state a view of the file mapped (`_map_seq`), not a buffer read."""
    osio = root.osio
    t0 = time.perf_counter()
    if record is not None and record.fingerprint != expected_fingerprint:
        raise WrongModelError(name, expected_fingerprint, record.fingerprint)
    bufs = _Buffers(alloc)
    try:
        fd = _open_regular(osio, root.save_fd, name)
        if fd is None:
            raise NotFoundError(f"slot file {name!r} not found")
        try:
            tokens, packed, state, n_read = _seq(
                osio, fd, record, bufs, executor, max_bytes, mapped
            )
        except CorruptFileError as e:
            raise CorruptFileError(f"slot file {name!r}: {e}") from None
        finally:
            osio.close(fd)
        sidecars: dict[Suffix, SidecarRead] = {}
        for suffix in SIDECAR_SUFFIXES:
            side = record.file(suffix) if record is not None else None
            if side is None:
                why = "no commit record (foreign file)" if record is None else ""
                sidecars[suffix] = SidecarRead(suffix, "absent", why)
                continue
            crc = checksum.StreamCrc(executor)
            sidecars[suffix] = _read_sidecar(root, name, side, bufs, crc)
            if sidecars[suffix].status != "missing":
                n_read += side.n_bytes
    except BaseException:
        for m in bufs.maps:
            # A view still alive in the traceback's frames keeps its map until they go.
            with contextlib.suppress(BufferError):
                m.close()
        raise
    return Generation(
        name=name,
        tokens=tokens,
        state=state,
        packed=packed,
        foreign=record is None,
        record=record,
        sidecars=sidecars,
        n_bytes_read=n_read,
        read_ms=(time.perf_counter() - t0) * 1e3,
        _maps=bufs.maps,
    )
