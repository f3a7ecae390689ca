"""Page-sized buffers made and unmade off the engine thread.

Fresh anonymous memory costs the kernel a fault and a zeroed page per 4 KiB: measured here at
about 1 GB/s, eight times slower than copying a state into memory already mapped. So a page_out
(or a save) asks this worker for a buffer, pre-faulted with MAP_POPULATE, and the engine only
copies into it once it arrives: the engine's stall is the copy, nothing more. Closing a buffer
(munmap) is also done here, so freeing a large page never stalls decoding either.

A mind switch frees one page (paged in) and then asks for another (the next switch's spare):
the worker keeps the last freed buffer until the next allocation, its pages given back to the
kernel lazily (MADV_FREE: reclaimed under memory pressure; the store no longer counts it), and
hands it out again if it fits, zeroed with a memset: a fraction of the cost of faulting fresh
memory in, CPU that came out of the decode threads' cores. The next allocation closes it if it
does not fit, so at most one freed buffer outlives its page.

Owns one thread. `allocate` answers through `post` (the engine's inbox) with a `BufferReady`.
"""

from __future__ import annotations

import ctypes
import logging
import mmap
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger("kvswap.engine")

_MAP_FLAGS = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_POPULATE", 0)
_MADV_FREE = getattr(mmap, "MADV_FREE", None)


def new_buffer(n_bytes: int) -> mmap.mmap:
    """An anonymous mapping of `n_bytes`, its pages already faulted in where the OS can."""
    return mmap.mmap(-1, max(1, n_bytes), flags=_MAP_FLAGS)


@dataclass(frozen=True)
class BufferReady:
    """A buffer asked for by `allocate` (or the reason it could not be made)."""

    tag: int
    buffer: mmap.mmap | None
    error: str = ""


class BufferWorker:
    """A thread that allocates and closes page buffers for the engine."""

    def __init__(self, post: Callable[[BufferReady], None]) -> None:
        self._post = post
        self._jobs: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._free: list[mmap.mmap] = []  # freed buffers to reuse (worker thread only)
        self._thread = threading.Thread(target=self._run, name="kvswap-buffers", daemon=True)
        self._thread.start()

    def allocate(self, n_bytes: int, tag: int) -> None:
        def job() -> None:
            try:
                buffer = self._reuse(n_bytes) or new_buffer(n_bytes)
            except (OSError, ValueError) as err:
                self._post(BufferReady(tag, None, f"could not map {n_bytes} bytes: {err}"))
                return
            self._post(BufferReady(tag, buffer))

        self._jobs.put(job)

    def dispose(self, buffer: mmap.mmap, done: Callable[[], None]) -> None:
        """Free `buffer` on the worker (kept for reuse, or closed), then call `done` there."""

        def job() -> None:
            for old in self._free:
                old.close()
            self._free.clear()
            if _MADV_FREE is not None and len(buffer) > mmap.PAGESIZE:
                buffer.madvise(_MADV_FREE)
                self._free.append(buffer)
            else:
                buffer.close()
            done()

        self._jobs.put(job)

    def _reuse(self, n_bytes: int) -> mmap.mmap | None:
        """The kept buffer if it holds `n_bytes` (and at most twice that), zeroed up to
        `n_bytes` and its tail given back: to its user, as fresh as a new mapping. Any other
        kept buffer is closed."""
        kept_buffers, self._free = self._free, []
        buffer = None
        for b in kept_buffers:
            if buffer is None and n_bytes <= len(b) <= 2 * n_bytes:
                buffer = b
            else:
                b.close()
        if buffer is None:
            return None
        kept = -(-n_bytes // mmap.PAGESIZE) * mmap.PAGESIZE
        if kept < len(buffer):
            buffer.madvise(mmap.MADV_DONTNEED, kept, len(buffer) - kept)
        base = ctypes.addressof(ctypes.c_char.from_buffer(buffer))
        ctypes.memset(base, 0, min(kept, len(buffer)))
        return buffer

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            try:
                job()
            except Exception:
                log.exception("buffer worker job failed")

    def close(self) -> None:
        self._jobs.put(None)
        self._thread.join()
        for buffer in self._free:
            buffer.close()
        self._free.clear()
