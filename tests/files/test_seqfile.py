"""F codec: llama-server's packed token list, plain lists, zero-copy parts, corrupt inputs."""

from __future__ import annotations

import contextlib
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvswap.files import CorruptFileError, seqfile

pytestmark = pytest.mark.timeout(60)

STATE = struct.pack("<II", seqfile.STATE_MAGIC, 5) + bytes(range(64))


def _plain_file(tokens: list[int], payload: bytes) -> bytes:
    """F as `llama_state_seq_save_file` writes it for a plain token list."""
    return struct.pack(f"<III{len(tokens)}i", 0x67677371, 3, len(tokens), *tokens) + payload


def test_header_is_llama_server_packed_form() -> None:
    # what server_tokens::serialize + llama_state_seq_save_file write for tokens [7, 8, 9]
    expected = struct.pack("<III", 0x67677371, 3, 7) + struct.pack("<iIIiiiI", -1, 1, 3, 7, 8, 9, 0)
    assert seqfile.encode_header([7, 8, 9]) == expected
    assert seqfile.encode_header(np.array([7, 8, 9], dtype=np.int32)) == expected


def test_file_parts_do_not_copy_the_payload() -> None:
    state = bytearray(STATE)
    parts = seqfile.file_parts([1, 2], state)
    state[-1] = 0xEE  # the payload part is a view of the state
    assert bytes(parts[1])[-1] == 0xEE
    assert len(parts[1]) == len(STATE) - 8


def test_parse_packed_round_trip_and_state_prefix() -> None:
    data = b"".join(bytes(p) for p in seqfile.file_parts([3, 1, 4, 1, 5], STATE))
    parsed = seqfile.parse_file(data)
    assert parsed.packed
    assert parsed.tokens.dtype == np.int32
    assert parsed.tokens.tolist() == [3, 1, 4, 1, 5]
    assert bytes(parsed.payload) == STATE[8:]
    state = seqfile.state_from_payload(parsed.payload)  # fresh buffer, seq id 0
    assert bytes(state) == struct.pack("<II", seqfile.STATE_MAGIC, 0) + STATE[8:]
    out = memoryview(bytearray(len(STATE) + 10))
    state2 = seqfile.state_from_payload(parsed.payload, out)
    assert bytes(state2) == bytes(state) and len(state2) == len(STATE)
    with pytest.raises(ValueError):
        seqfile.state_from_payload(parsed.payload, memoryview(bytearray(8)))


def test_parse_is_zero_copy() -> None:
    data = bytearray(b"".join(bytes(p) for p in seqfile.file_parts([3, 4], STATE)))
    parsed = seqfile.parse_file(data)
    data[-1] ^= 0xFF
    assert parsed.payload[-1] == data[-1]
    assert np.shares_memory(parsed.tokens, np.frombuffer(data, dtype=np.uint8))


def test_plain_token_list_is_read() -> None:
    parsed = seqfile.parse_file(_plain_file([10, 20, 30], STATE[8:]))
    assert not parsed.packed
    assert parsed.tokens.tolist() == [10, 20, 30]
    assert bytes(parsed.payload) == STATE[8:]
    empty = seqfile.parse_file(_plain_file([], STATE[8:]))
    assert empty.tokens.tolist() == [] and not empty.packed


@settings(max_examples=200, deadline=None)
@given(
    tokens=st.lists(st.integers(0, 2**31 - 1), max_size=64),
    payload=st.binary(min_size=4, max_size=256),
    packed=st.booleans(),
)
def test_round_trip(tokens: list[int], payload: bytes, packed: bool) -> None:
    state = struct.pack("<II", seqfile.STATE_MAGIC, 0) + payload
    if packed:
        data = b"".join(bytes(p) for p in seqfile.file_parts(tokens, state))
    else:
        data = _plain_file(tokens, payload)
    parsed = seqfile.parse_file(data)
    assert parsed.tokens.tolist() == tokens
    assert bytes(parsed.payload) == payload
    assert parsed.packed == (packed or False)


@pytest.mark.parametrize(
    ("words", "why"),
    [
        ([-1], "truncated"),
        ([-1, 2, 0, 0], "version"),
        ([-1, 1, 3, 7, 8], "truncated"),
        ([-1, 1, 1, 7, 1], "media"),
        ([-1, 1, 1, 7, 0, 0], "trailing"),
        ([5, -3, 2], "negative"),
    ],
)
def test_bad_token_lists(words: list[int], why: str) -> None:
    with pytest.raises(CorruptFileError, match=why):
        seqfile.parse_file(_plain_file(words, STATE[8:]))


def test_bad_headers() -> None:
    good = b"".join(bytes(p) for p in seqfile.file_parts([1, 2], STATE))
    with pytest.raises(CorruptFileError, match="magic"):
        seqfile.parse_file(b"GGUF" + good[4:])
    with pytest.raises(CorruptFileError, match="version"):
        seqfile.parse_file(good[:4] + struct.pack("<I", 2) + good[8:])
    with pytest.raises(CorruptFileError, match="truncated"):
        seqfile.parse_file(good[:8] + struct.pack("<I", 2**32 - 1) + good[12:])
    with pytest.raises(CorruptFileError):
        seqfile.state_payload(b"\0" * 16)
    with pytest.raises(ValueError):
        seqfile.encode_header([1, -2])


def test_every_truncation_is_refused() -> None:
    data = b"".join(bytes(p) for p in seqfile.file_parts([9, 8, 7], STATE))
    header_end = seqfile.parse_file(data).header_bytes
    for cut in range(len(data)):
        if cut >= header_end + 4:
            continue  # a payload cut is only visible to the commit record (or to libllama)
        with pytest.raises(CorruptFileError):
            seqfile.parse_file(data[:cut])


def test_every_bit_flip_is_typed_or_harmless() -> None:
    data = b"".join(bytes(p) for p in seqfile.file_parts([9, 8, 7], STATE))
    header_end = seqfile.parse_file(data).header_bytes
    n_refused = 0
    for bit in range(header_end * 8):
        flipped = bytearray(data)
        flipped[bit // 8] ^= 1 << (bit % 8)
        try:
            seqfile.parse_file(bytes(flipped))
        except CorruptFileError:
            n_refused += 1
    # flips inside token values parse (as other tokens); the framing flips are all refused
    assert n_refused >= (seqfile.FIXED_HEADER_BYTES + 3 * 4) * 8 - 8


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_arbitrary_bytes_never_crash(data: bytes) -> None:
    with contextlib.suppress(CorruptFileError):
        seqfile.parse_file(data)
