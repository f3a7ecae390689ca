"""The floors of a mind switch's parts, measured in the bench's own process on the same bytes
(`kvswap bench paging`): what each part could cost with nothing of kvswap around it.

`measure_floors` loads the model, prefills the mind's tokens into a one-sequence context of the
server's window, and times, median of `runs`:
- `get_data_ms`: `llama_state_seq_get_data` into a buffer already in memory (slot to RAM's
  libllama part), and `memcpy_ms`: a plain copy of as many bytes (its floor, as the issue names
  it);
- `set_data_ms`: `llama_state_seq_set_data` of that state into the cleared sequence (RAM to
  slot, alone);
- `write_fsync_ms`: the state written to a new file in the save folder and fsynced (slot or RAM
  to disk);
- `read_warm_ms` and `read_cold_ms`: that file read into a buffer already in memory, from the
  page cache and after `posix_fadvise(DONTNEED)` (disk to slot's read; plus `set_data_ms`).
Buffers are faulted in before the clock starts (the server's are too). The model and its
context are closed before the server starts, so the two never share memory.
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
    write_fsync_ms: float
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
        write_ms = _median_ms(lambda: write_fsync(path, state), runs, lambda: path.unlink(True))
        warm_ms = _median_ms(lambda: read_into(path, state), runs)
        cold_ms = _median_ms(lambda: read_into(path, state), runs, lambda: drop_cache(path))
        path.unlink()
        return Floors(len(state), memcpy_ms, get_ms, set_ms, write_ms, warm_ms, cold_ms)
    finally:
        batch.close()
        ctx.close()
        model.close()
