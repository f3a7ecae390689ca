"""The slot files' checksum: ISA-L's CRC-32 must be zlib's, value for value."""

from __future__ import annotations

import os
import zlib
from concurrent.futures import ThreadPoolExecutor

import pytest

from kvswap.files import checksum


@pytest.mark.parametrize(
    "n_bytes", [0, 1, 15, 4096, checksum.CHUNK_BYTES - 1, checksum.CHUNK_BYTES + 7]
)
def test_the_checksum_is_zlibs_crc32_value_for_value(n_bytes: int) -> None:
    """Defect caught: a faster CRC that is not zlib's CRC-32 would make every file written
    before it (commit records hold `crc32:` text of zlib's value) fail its check and never be
    restored. Whole, in chunks, and streamed on a helper thread, the value is zlib's."""
    data = os.urandom(n_bytes)
    expected = zlib.crc32(data)
    assert checksum.update(0, data) == expected
    third = n_bytes // 3
    assert checksum.of_parts([data[:third], data[third:]]) == expected
    assert checksum.to_text(expected) == f"crc32:{expected:08x}"
    with ThreadPoolExecutor(1) as executor:
        for ex in (None, executor):
            stream = checksum.StreamCrc(ex)
            view = memoryview(data)
            for off in range(0, n_bytes, 4093):
                stream.feed(view[off : off + 4093])
            assert stream.value() == expected
