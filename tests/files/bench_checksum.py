"""Measure checksum candidates for kvswap slot files (not a test; run by hand).

Usage: .venv/bin/python tests/files/bench_checksum.py [n_mib]

Prints GB/s for zlib.crc32, zlib.adler32 and hashlib digests over one buffer of n_mib MiB
(default 100), fed in 8 MiB chunks as the publisher feeds them, best of 3 runs; plus a plain
memcpy and a write+fsync of the same bytes to a temporary file, for scale.
"""

from __future__ import annotations

import hashlib
import os
import sys
import tempfile
import time
import zlib
from collections.abc import Callable

CHUNK_BYTES = 8 << 20


def _best_s(fn: Callable[[], object], n_runs: int = 3) -> float:
    best = float("inf")
    for _ in range(n_runs):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def _chunked(update: Callable[[memoryview], object], data: memoryview) -> None:
    for off in range(0, len(data), CHUNK_BYTES):
        update(data[off : off + CHUNK_BYTES])


def main() -> None:
    n_mib = int(sys.argv[1]) if len(sys.argv) > 1 else 100
    data = memoryview(os.urandom(n_mib << 20))
    n_bytes = len(data)
    rows: list[tuple[str, float]] = []

    def crc32() -> None:
        crc = 0
        for off in range(0, n_bytes, CHUNK_BYTES):
            crc = zlib.crc32(data[off : off + CHUNK_BYTES], crc)

    def adler32() -> None:
        a = 1
        for off in range(0, n_bytes, CHUNK_BYTES):
            a = zlib.adler32(data[off : off + CHUNK_BYTES], a)

    rows.append(("zlib.crc32", _best_s(crc32)))
    rows.append(("zlib.adler32", _best_s(adler32)))
    for algo in ("blake2b", "blake2s", "sha1", "sha256", "md5", "sha512"):

        def digest(algo: str = algo) -> None:
            h = hashlib.new(algo)
            _chunked(h.update, data)
            h.digest()

        rows.append((f"hashlib.{algo}", _best_s(digest)))
    dst = bytearray(n_bytes)

    def memcpy() -> None:
        dst[:] = data

    rows.append(("memcpy (bytearray slice)", _best_s(memcpy)))
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as tmp:
        path = os.path.join(tmp, "f")

        def write_fsync() -> None:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                _chunked(lambda mv: os.write(fd, mv), data)
                os.fsync(fd)
            finally:
                os.close(fd)

        rows.append(("write+fsync (tmp file)", _best_s(write_fsync)))
    print(
        f"{n_mib} MiB, {CHUNK_BYTES >> 20} MiB chunks, best of 3, zlib {zlib.ZLIB_RUNTIME_VERSION}"
    )
    for label, secs in rows:
        print(f"  {label:28s} {n_bytes / secs / 1e9:7.2f} GB/s  ({secs * 1e3:7.1f} ms)")


if __name__ == "__main__":
    main()
