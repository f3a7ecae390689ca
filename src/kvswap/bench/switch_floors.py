"""The floors of a mind switch's parts, measured in the bench's own process on the same bytes
(`kvswap bench paging`): what each part could cost with nothing of kvswap around it.

`measure_floors` loads the model, prefills the mind's tokens into a one-sequence context of the
server's window, and times, median of `runs`:
- `get_data_ms`: `llama_state_seq_get_data` into a buffer already in memory (slot to RAM's
  libllama part), and `memcpy_ms`: a plain copy of as many bytes (its floor, as the issue names
  it);
- `set_data_ms`: `llama_state_seq_set_data` of that state into the cleared sequence (RAM to
  slot, alone);
- `read_warm_ms` and `read_cold_ms`: the state written to a file in the save folder, then read
  into a buffer already in memory, from the page cache and after `posix_fadvise(DONTNEED)`
  (disk to slot's read; plus `set_data_ms`).
Buffers are faulted in before the clock starts (the server's are too). The model and its
context are closed before the server starts, so the two never share memory.

The floor of a write to disk is measured beside the server's own writes instead (`WriteFloor`,
taking turns with them in one run): a write's time on a virtual disk swings 4-10x from one file
to the next (1 GiB in 3.3 s, then 0.3 s), so a floor measured apart decides nothing.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class Floors:
    """One mind's floors, ms (median of the runs)."""

    n_bytes: int
    memcpy_ms: float
    get_data_ms: float
    set_data_ms: float
    read_warm_ms: float
    read_cold_ms: float


def _median_ms(fn: Callable[[], object], runs: int, before: Callable[[], object] = int) -> float:
    samples = []
    for _ in range(runs):
        before()
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(samples)


def _in_memory(n_bytes: int) -> np.ndarray:
    buf = np.empty(n_bytes, dtype=np.uint8)
    buf.fill(1)  # every page faulted in before a clock starts
    return buf


def _memcpy_ms(src: np.ndarray, runs: int) -> float:
    dst = _in_memory(len(src))
    return _median_ms(lambda: np.copyto(dst, src), runs)


class WriteFloor:
    """Sequential writes of `n_bytes` to new files of `folder`, each with its fsync, each file
    removed once the next is written: the pattern of a publication, whose new generation is
    written beside the old one and the old one removed after. (On this virtual disk a write into
    blocks just freed runs up to 10x faster than one into fresh blocks: a floor that freed its
    file before writing again would measure that instead.)"""

    def __init__(self, folder: Path, n_bytes: int) -> None:
        self.folder = folder
        self.buffer = _in_memory(n_bytes)
        self.n_written = 0
        self.last: Path | None = None

    def __call__(self) -> float:
        """One write and its fsync, ms."""
        path = self.folder / f"floor-write-{self.n_written}.bin"
        self.n_written += 1
        t0 = time.perf_counter()
        write_fsync(path, self.buffer)
        ms = (time.perf_counter() - t0) * 1e3
        self.clear()
        self.last = path
        return ms

    def clear(self) -> None:
        if self.last is not None:
            self.last.unlink(missing_ok=True)
            self.last = None


class CopyFloor:
    """A memcpy of `n_bytes` between two buffers already in memory, ms: slot to RAM's floor,
    taken in turns with the server's copies (the machine's copy rate swings 1.5x between runs)."""

    def __init__(self, n_bytes: int) -> None:
        self.src, self.dst = _in_memory(n_bytes), _in_memory(n_bytes)

    def __call__(self) -> float:
        t0 = time.perf_counter()
        np.copyto(self.dst, self.src)
        return (time.perf_counter() - t0) * 1e3


def write_fsync(path: Path, buf: np.ndarray) -> None:
    """`buf` written to a new file at `path` and fsynced."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        view, done = buf.data.cast("B"), 0
        while done < len(view):
            done += os.write(fd, view[done:])
        os.fsync(fd)
    finally:
        os.close(fd)


def drop_cache(path: Path) -> None:
    """The file at `path` leaves the page cache (`posix_fadvise(DONTNEED)`; its pages are clean
    once written and fsynced): its next read is from the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def read_into(path: Path, buf: np.ndarray) -> None:
    """The file at `path` read into `buf`."""
    fd = os.open(path, os.O_RDONLY)
    try:
        view, got = buf.data.cast("B"), 0
        while got < len(view) and (n := os.readv(fd, [view[got:]])):
            got += n
    finally:
        os.close(fd)


def measure_floors(
    model_path: str, tokens: list[int], n_ctx: int, threads: int, folder: Path, runs: int
) -> Floors:
    """The floors of one mind of `tokens` in a window of `n_ctx` cells (see the module)."""
    from kvswap.backend.batch import Batch
    from kvswap.backend.context import Context, ContextParams
    from kvswap.backend.model import Model

    model = Model.load(model_path)
    params = ContextParams(
        n_ctx=n_ctx, n_seq_max=1, n_batch=512, n_ubatch=512, kv_unified=False,
        n_threads=threads, n_threads_batch=threads,
    )  # fmt: skip
    ctx, batch = Context(model, params), Batch(512)
    try:
        for pos in range(0, len(tokens), 512):
            batch.clear()
            chunk = np.asarray(tokens[pos : pos + 512], dtype=np.int32)
            batch.add_span(chunk, pos, 0, pos + 512 >= len(tokens))
            if ctx.decode(batch) != 0:
                raise RuntimeError(f"the floor's prefill failed at token {pos}")
        state = _in_memory(ctx.state_size(0))
        get_ms = _median_ms(lambda: ctx.state_get_into(0, state), runs)
        memcpy_ms = _memcpy_ms(state, runs)
        set_ms = _median_ms(lambda: ctx.state_set_from(0, state), runs, lambda: ctx.seq_clear(0))
        path = folder / "floor.bin"
        write_fsync(path, state)
        warm_ms = _median_ms(lambda: read_into(path, state), runs)
        cold_ms = _median_ms(lambda: read_into(path, state), runs, lambda: drop_cache(path))
        path.unlink()
        return Floors(len(state), memcpy_ms, get_ms, set_ms, warm_ms, cold_ms)
    finally:
        batch.close()
        ctx.close()
        model.close()
