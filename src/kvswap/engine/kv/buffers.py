"""Page-sized buffers made and unmade off the engine thread.

Fresh anonymous memory costs the kernel a fault and a zeroed page per 4 KiB: measured here at
about 1 GB/s, eight times slower than copying a state into memory already mapped. So a page_out
(or a save) asks this worker for a buffer, pre-faulted, and the engine only copies into it once
it arrives: the engine's stall is the copy, nothing more (better still, a buffer freed earlier
is taken off the page store's shelf, and nothing is mapped at all). Closing a buffer (munmap) is
also done here, so freeing a large page never stalls decoding either.

The fault-in must not hold the GIL: CPython's `mmap.mmap` keeps it through the `mmap` call, so
`MAP_POPULATE` would stall the engine thread and the event loop for the whole fault-in (measured:
another Python thread blocked for 1.3-2.3 s while 400 MB were populated). `new_buffer` maps
plainly and then faults the pages in through libc (`files.mapping.new_buffer`:
`madvise(MADV_POPULATE_WRITE)`, or `memset` where the kernel lacks it) in 2 MiB chunks, with the
GIL released and the address-space lock given back between chunks (the other thread's worst
pause: tens of ms, the machine's noise).

Owns one thread. `allocate` answers through `post` (the engine's inbox) with a `BufferReady`
that names its receiver, so each internal move (a page_out, a mind switch's spare, the
anonymous cache's spare, a reconfigure's moves, the flush before exit) gets its own buffer.
"""

from __future__ import annotations

import logging
import mmap
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass

from kvswap.engine.kv.pagestore import close_now
from kvswap.files.mapping import new_buffer

log = logging.getLogger("kvswap.engine")


@dataclass(frozen=True)
class BufferReady:
    """A buffer asked for by `allocate` (or the reason it could not be made), and who gets it:
    the engine calls `then(self)` on its own thread."""

    buffer: mmap.mmap | None
    then: Callable[[BufferReady], None]
    error: str = ""


class BufferWorker:
    """A thread that allocates and closes page buffers for the engine."""

    def __init__(self, post: Callable[[BufferReady], None]) -> None:
        self._post = post
        self._jobs: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="kvswap-buffers", daemon=True)
        self._thread.start()

    def allocate(self, n_bytes: int, then: Callable[[BufferReady], None]) -> None:
        """Map `n_bytes`, then post the buffer to the engine, which hands it to `then`."""

        def job() -> None:
            try:
                buffer = new_buffer(n_bytes)
            except (OSError, ValueError) as err:
                self._post(BufferReady(None, then, f"could not map {n_bytes} bytes: {err}"))
                return
            self._post(BufferReady(buffer, then))

        self._jobs.put(job)

    def dispose(self, buffer: mmap.mmap, done: Callable[[bool], None]) -> None:
        """Close `buffer` on the worker, then call `done(closed)` there (the page store counts
        a failed close as leaked bytes)."""
        self._jobs.put(lambda: close_now(buffer, done))

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
