"""Sidecar container: round trips, zero copy, every truncation and bit flip refused."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvswap.files import CorruptFileError, checksum, sidecar
from kvswap.files.types import SIDECAR_SUFFIXES, Suffix

pytestmark = pytest.mark.timeout(60)


def _bytes(enc: sidecar.EncodedFile) -> bytes:
    return b"".join(bytes(p) for p in enc.parts)


def test_round_trip_zero_copy_and_crc() -> None:
    big = bytearray(b"x" * 1000)
    enc = sidecar.encode(".ckpt", {"pos": [10, 20], "n": 2}, [big, b"", b"abc"])
    assert any(isinstance(p, memoryview) and p.obj is big for p in enc.parts)  # not copied
    data = _bytes(enc)
    assert len(data) == enc.n_bytes
    assert checksum.of_parts([data]) == enc.crc32
    buf = bytearray(data)
    dec = sidecar.decode(".ckpt", buf)
    assert dec.header == {"pos": [10, 20], "n": 2}
    assert [bytes(s) for s in dec.sections] == [bytes(big), b"", b"abc"]
    assert dec.sections[0].obj is buf  # a view of the caller's buffer


@settings(max_examples=100, deadline=None)
@given(
    header=st.dictionaries(st.text(max_size=8), st.integers() | st.text(max_size=8), max_size=4),
    sections=st.lists(st.binary(max_size=64), max_size=5),
    kind=st.sampled_from(SIDECAR_SUFFIXES),
)
def test_round_trip(header: dict[str, object], sections: list[bytes], kind: Suffix) -> None:
    enc = sidecar.encode(kind, header, sections)
    dec = sidecar.decode(kind, _bytes(enc))
    assert dec.header == header
    assert [bytes(s) for s in dec.sections] == sections


def test_wrong_kind_refused() -> None:
    data = _bytes(sidecar.encode(".dft", {}, [b"a"]))
    with pytest.raises(CorruptFileError, match="magic"):
        sidecar.decode(".ckpt", data)


def test_every_truncation_and_extension_refused() -> None:
    data = _bytes(sidecar.encode(".lora", {"a": 1}, [b"hello", b"world!"]))
    for cut in range(len(data)):
        with pytest.raises(CorruptFileError):
            sidecar.decode(".lora", data[:cut])
    with pytest.raises(CorruptFileError):
        sidecar.decode(".lora", data + b"\0")


def test_every_bit_flip_refused() -> None:
    data = _bytes(sidecar.encode(".ckpt", {"a": 1}, [b"hello", b"world!"]))
    for bit in range(len(data) * 8):
        flipped = bytearray(data)
        flipped[bit // 8] ^= 1 << (bit % 8)
        with pytest.raises(CorruptFileError):
            sidecar.decode(".ckpt", bytes(flipped))


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=120))
def test_arbitrary_bytes_never_crash(data: bytes) -> None:
    for prefix in (b"", b"KVCK\x01\x00\x00\x00"):
        with contextlib.suppress(CorruptFileError):
            sidecar.decode(".ckpt", prefix + data)
