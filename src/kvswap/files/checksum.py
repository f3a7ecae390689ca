"""The checksum of slot files: CRC-32 (zlib's polynomial), fed in chunks.

Chosen by measurement on the 2-core dev machine (tests/files/bench_checksum.py, 100 MiB in
8 MiB chunks, best of 3; zlib 1.2.13): zlib.crc32 2.2-2.3 GB/s, adler32 2.5-2.6, sha1 1.7,
sha256 1.5-1.6, sha512 0.7, blake2b 0.6-0.7, md5 0.6, blake2s 0.4 GB/s; against write+fsync of
the same bytes at 0.7-0.8 GB/s and memcpy at 1.2 GB/s. CRC-32 catches every burst up to 32 bits
and random corruption with probability 1 - 2^-32, which is what a torn write or a flipped bit
needs (these checksums guard against accidents, not adversaries); adler32 is weak on short
inputs; the cryptographic hashes are slower for nothing we need.

It is computed with ISA-L's folding CRC (`isal.isal_zlib.crc32`, the `isal` package): the same
CRC-32 as `zlib.crc32`, value for value, so every file written before reads the same, at 27 GB/s
against zlib's 2.2 here (32 MiB in 8 MiB chunks). At zlib's speed the checksum was most of a
mind's read back from the page cache (14 of 21 ms for 31 MB read into a ready buffer) and a
core's worth of work beside the decode threads for every spill. Both release the GIL on large
buffers, so a worker thread's checksum never stalls the engine thread.

`StreamCrc` can overlap it with the I/O on a helper thread (`Publisher(overlap_crc=True)`); on 2
cores that gave no reliable gain, so it is off by default.

Owns only the algorithm, its streaming forms and its text form in commit records
(`crc32:0123abcd`). Pure; any thread.
"""

from __future__ import annotations

from collections.abc import Iterable
from concurrent.futures import Executor, Future
from typing import Final

from isal.isal_zlib import crc32

from kvswap.files.types import Buffer

ALGORITHM: Final = "crc32"
# Feed large buffers in slices this big: one slice stays in cache between checksum and write.
CHUNK_BYTES: Final = 8 << 20


def update(crc: int, data: Buffer) -> int:
    """Continue a CRC-32 over `data` (start from 0)."""
    view = memoryview(data).cast("B")
    for off in range(0, len(view), CHUNK_BYTES):
        crc = crc32(view[off : off + CHUNK_BYTES], crc)
    return crc


def of_parts(parts: Iterable[Buffer]) -> int:
    """CRC-32 of the concatenation of `parts`."""
    crc = 0
    for part in parts:
        crc = update(crc, part)
    return crc


def to_text(crc: int) -> str:
    return f"{ALGORITHM}:{crc & 0xFFFFFFFF:08x}"


class StreamCrc:
    """CRC-32 of a stream of chunks, each computed on `executor` while the caller does I/O.

    `feed(chunk)` waits for the previous chunk's CRC (they chain) and submits this chunk's, so
    the CRC of chunk k runs while the caller writes chunk k or reads chunk k+1. A chunk must
    not change until the next `feed` or `value` returns. Without an executor it computes
    inline. One instance per stream; not thread-safe itself.
    """

    def __init__(self, executor: Executor | None) -> None:
        self._executor = executor
        self._crc = 0
        self._pending: Future[int] | None = None

    def feed(self, chunk: memoryview) -> None:
        crc = self.value()
        if self._executor is None:
            self._crc = crc32(chunk, crc)
        else:
            self._pending = self._executor.submit(crc32, chunk, crc)

    def value(self) -> int:
        if self._pending is not None:
            self._crc, self._pending = self._pending.result(), None
        return self._crc
