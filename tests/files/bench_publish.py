"""Publish/read throughput of kvswap.files, with and without the checksum pass (by hand).

Usage: .venv/bin/python tests/files/bench_publish.py [n_mib] [dir]

Publishes an F of n_mib MiB (default 512) into a fresh save path under `dir` (default: a temp
folder), best of 3; then the same bytes with their CRC precomputed (an `EncodedFile`, so the
publisher skips the checksum) to show its share; then reads the generation back (CRC verified).
"""

from __future__ import annotations

import os
import struct
import sys
import tempfile
import time
from pathlib import Path

from kvswap.files import Publisher, checksum, seqfile
from kvswap.files.sidecar import EncodedFile


def main() -> None:
    n_mib = int(sys.argv[1]) if len(sys.argv) > 1 else 512
    base = sys.argv[2] if len(sys.argv) > 2 else None
    state = bytearray(struct.pack("<II", seqfile.STATE_MAGIC, 0)) + os.urandom(n_mib << 20)
    parts = seqfile.file_parts(range(4000), state)
    n_bytes = sum(len(memoryview(p)) for p in parts)
    t0 = time.perf_counter()
    crc = checksum.of_parts(parts)
    crc_s = time.perf_counter() - t0
    precomputed = EncodedFile(parts=list(parts), n_bytes=n_bytes, crc32=crc)
    rows = [("crc32 alone", crc_s)]
    for overlap in (False, True):
        how = "crc on helper thread" if overlap else "crc inline"
        with (
            tempfile.TemporaryDirectory(dir=base) as tmp,
            Publisher(Path(tmp), overlap_crc=overlap) as pub,
        ):
            for label, content in (
                (f"publish, {how}", parts),
                ("publish, crc precomputed", precomputed),
            ):
                best = min(
                    _timed(lambda c=content: pub.publish("bench", {"": c}, "fp")) for _ in range(3)
                )
                rows.append((label, best))

            def read(pub: Publisher = pub) -> None:
                pub.read_generation("bench", "fp").close()

            rows.append((f"read + verify, {how}", min(_timed(read) for _ in range(3))))
    print(f"F of {n_bytes / 2**20:.0f} MiB, best of 3")
    for label, secs in rows:
        print(f"  {label:36s} {n_bytes / secs / 1e9:6.2f} GB/s  ({secs * 1e3:7.1f} ms)")


def _timed(fn: object) -> float:
    t0 = time.perf_counter()
    fn()  # type: ignore[operator]
    return time.perf_counter() - t0


if __name__ == "__main__":
    main()
