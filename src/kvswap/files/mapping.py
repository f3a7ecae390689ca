"""A committed file mapped for one read, its pages read in up front, so a restore copies the
state straight out of the page cache: no buffer to fault in (fresh anonymous memory costs the
kernel a zeroed page per 4 KiB, three to eight times the copy itself, `engine.kv.buffers`) and
no second copy of the mind in memory.

The mapping is private and writable: the 8-byte RAM-state prefix `set_data` wants before the
payload is written over the file's last token word in memory (copy-on-write of one page; the
file is never changed). Its pages are read in on the caller's thread with
`madvise(MADV_POPULATE_READ)` (Linux 5.14+), the GIL released, in 8 MiB steps: a disk that
fails there is an `OSError` (EFAULT, EIO) where touching the page would have raised SIGBUS, and
the engine thread then copies pages already mapped. Only for files whose names no other program
writes (the minds' own copies, never truncated in place: a new generation is a new file): a
file truncated while mapped would raise SIGBUS on access. A kernel without the advice answers
`None`, and the caller reads the file instead.

A new generation written in place (`stage.Stage.create_mapped`: a mind leaving its slot straight
for its file) is mapped shared and faulted in writable the same way (`populate_shared`), on the
I/O thread, so the engine's copy of the slot into it is a memcpy.

Also the anonymous buffers a read of any other file fills (and the engine's page buffers,
`engine.kv.buffers`): `new_buffer` faults them in ahead with the GIL released, where a read into
fresh memory would fault page by page (0.4-1.5 GB/s here against 3 GB/s).
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
from typing import Final

MADV_POPULATE_READ: Final = 22  # Linux 5.14+
MADV_POPULATE_WRITE: Final = 23
_STEP_BYTES: Final = 8 << 20
_CHUNK_BYTES: Final = 2 << 20  # a new buffer's pages are faulted in this much at a time
_ANONYMOUS: Final = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS

LIBC = ctypes.CDLL(None, use_errno=True)
LIBC.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
LIBC.madvise.restype = ctypes.c_int


def new_buffer(n_bytes: int) -> mmap.mmap:
    """An anonymous mapping of `n_bytes`, its pages faulted in with the GIL released (in 2 MiB
    steps, the address-space lock given back between them)."""
    buffer = mmap.mmap(-1, max(1, n_bytes), flags=_ANONYMOUS)
    anchor = ctypes.c_char.from_buffer(buffer)  # an export: released before returning
    try:
        address, size = ctypes.addressof(anchor), len(buffer)
        use_madvise = True
        for offset in range(0, size, _CHUNK_BYTES):
            n = min(_CHUNK_BYTES, size - offset)
            if use_madvise and madvise(address + offset, n, MADV_POPULATE_WRITE) == 0:
                continue
            use_madvise = False  # not supported here: write the zeros ourselves
            ctypes.memset(address + offset, 0, n)
    finally:
        del anchor
    return buffer


def madvise(address: int, n_bytes: int, advice: int) -> int:
    """`madvise(2)` with the GIL released: 0, or the errno it failed with."""
    if LIBC.madvise(address, n_bytes, advice) == 0:
        return 0
    return ctypes.get_errno()


def map_populated(fd: int, size: int) -> mmap.mmap | None:
    """File `fd` of `size` bytes mapped private and writable, every page read in; None when
    the kernel cannot read pages in ahead (the caller reads the file). Raises OSError when the
    disk fails while the pages are read in."""
    m = mmap.mmap(fd, size, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    kept = False
    try:
        err = _fault_in(m)
        if err in (errno.EINVAL, errno.ENOSYS):
            return None
        if err:
            raise OSError(err, f"reading a mapped file in: {os.strerror(err)}")
        kept = True
        return m
    finally:
        if not kept:
            m.close()


def populate_shared(m: mmap.mmap) -> None:
    """Every page of a shared file mapping `m` faulted in writable (`MADV_POPULATE_WRITE`), with
    the GIL released, before another thread copies into it: that copy is then a memcpy, where
    faulting page-cache pages in one at a time ran 3-20x slower (a 780 MiB mind: 240-1,490 ms
    against 69 ms, plus 165 ms here, off that thread). A kernel without the advice leaves the
    faults to the copy; a disk that fails raises OSError."""
    err = _fault_in(m, MADV_POPULATE_WRITE)
    if err and err not in (errno.EINVAL, errno.ENOSYS):
        raise OSError(err, f"faulting a mapped file in: {os.strerror(err)}")


def _fault_in(m: mmap.mmap, advice: int = MADV_POPULATE_READ) -> int:
    """Every page of `m` faulted in (`advice`: `MADV_POPULATE_READ`, or `_WRITE`), in steps: 0,
    or the errno of the first step that failed."""
    anchor = ctypes.c_char.from_buffer(m)  # an export: released before returning
    try:
        address, size = ctypes.addressof(anchor), len(m)
        for offset in range(0, size, _STEP_BYTES):
            err = madvise(address + offset, min(_STEP_BYTES, size - offset), advice)
            if err:
                return err
        return 0
    finally:
        del anchor
