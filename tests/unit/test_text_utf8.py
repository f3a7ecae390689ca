"""Utf8Decoder: split-invariance against one-shot decoding, and immediate replacement."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvswap.text.utf8 import Utf8Decoder, is_incomplete_prefix, valid_prefix_length

FFFD = "\ufffd"

# Fragments that exercise every branch: valid characters of each length, their prefixes, and
# the byte patterns that can never be valid (stray continuations, C0/C1/F5..FF leads, overlongs,
# encoded surrogates, code points past U+10FFFF).
_TRICKY = [
    b"\xc3",
    b"\xa9",
    b"\xe2\x82",
    b"\xac",
    b"\xf0\x9f\x98",
    b"\x80",
    b"\xbf",
    b"\xc0\xaf",
    b"\xc1",
    b"\xe0\x80\xaf",
    b"\xe0\x9f",
    b"\xed\xa0\x80",
    b"\xed\xa0",
    b"\xed\x9f\xbf",
    b"\xf0\x8f",
    b"\xf4\x90\x80\x80",
    b"\xf4\x8f\xbf\xbf",
    b"\xf5",
    b"\xfe",
    b"\xff",
]
_fragments = st.one_of(
    st.binary(max_size=6),
    st.text(max_size=4).map(lambda s: s.encode("utf-8")),
    st.sampled_from(_TRICKY),
)
byte_strings = st.lists(_fragments, max_size=12).map(b"".join)


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    bounds = [0, *points, len(data)]
    return [data[a:b] for a, b in itertools.pairwise(bounds)]


def has_lone_surrogate(text: str) -> bool:
    return any(0xD800 <= ord(ch) <= 0xDFFF for ch in text)


@settings(max_examples=400, deadline=None)
@given(byte_strings, st.lists(st.integers(min_value=0, max_value=10_000), max_size=12))
def test_any_split_decodes_like_one_shot(data: bytes, cuts: list[int]) -> None:
    decoder = Utf8Decoder()
    outputs: list[str] = []
    consumed = b""
    for piece in split(data, cuts):
        outputs.append(decoder.feed(piece))
        consumed += piece
        pending = decoder.pending
        # Held back: nothing, or the start of one character that may still complete.
        assert pending == b"" or is_incomplete_prefix(pending)
        # Everything before the held bytes is already out, decided exactly as one-shot.
        done = consumed[: len(consumed) - len(pending)]
        assert "".join(outputs) == done.decode("utf-8", "replace")
    outputs.append(decoder.flush())
    assert "".join(outputs) == data.decode("utf-8", "replace")
    assert not any(has_lone_surrogate(out) for out in outputs)


@settings(max_examples=200, deadline=None)
@given(byte_strings)
def test_byte_at_a_time(data: bytes) -> None:
    decoder = Utf8Decoder()
    text = "".join(decoder.feed(data[i : i + 1]) for i in range(len(data))) + decoder.flush()
    assert text == data.decode("utf-8", "replace")


@pytest.mark.parametrize(
    ("pieces", "outputs"),
    [
        ([b"hello", b" world"], ["hello", " world"]),
        ([b"\xe2", b"\x82", b"\xac!"], ["", "", "€!"]),
        ([b"\xf0\x9f", b"\x98\x80"], ["", "😀"]),
        # A sequence interrupted by ASCII or by a new lead byte: one U+FFFD for the fragment.
        ([b"\xe2\x82", b"A"], ["", FFFD + "A"]),
        ([b"\xe2\x82", b"\xc3\xa9"], ["", FFFD + "é"]),
        # Never valid: replaced at once, not held for the next piece.
        ([b"\x80", b"a"], [FFFD, "a"]),
        ([b"\xff"], [FFFD]),
        ([b"\xc0"], [FFFD]),
        ([b"\xe0\x80"], [FFFD + FFFD]),
        ([b"\xf4\x90"], [FFFD + FFFD]),
        ([b"\xed\xa0"], [FFFD + FFFD]),  # encoded surrogate: CPython alone would hold it
        ([b"\xed", b"\xa0"], ["", FFFD + FFFD]),
        ([b"\xed\x9f"], [""]),  # U+D7C0.. still possible
    ],
)
def test_pieces(pieces: list[bytes], outputs: list[str]) -> None:
    decoder = Utf8Decoder()
    assert [decoder.feed(p) for p in pieces] == outputs


def test_flush_replaces_held_tail_and_resets() -> None:
    decoder = Utf8Decoder()
    assert decoder.feed(b"ok\xf0\x9f\x98") == "ok"
    assert decoder.pending == b"\xf0\x9f\x98"
    assert decoder.flush() == FFFD
    assert decoder.pending == b""
    assert decoder.feed(b"\xc3\xa9") == "é"


def test_valid_prefix_length() -> None:
    assert valid_prefix_length(b"") == 0
    assert valid_prefix_length(b"a") == 1
    assert valid_prefix_length(b"\x80") == 0
    assert valid_prefix_length(b"\xed\xa0") == 1
    assert valid_prefix_length(b"\xf0\x9f\x98\x80") == 4
    assert is_incomplete_prefix(b"\xf0\x9f")
    assert not is_incomplete_prefix(b"\xf0\x9f\x98\x80")
    assert not is_incomplete_prefix(b"a")


def test_large_ascii_is_one_call() -> None:
    decoder = Utf8Decoder()
    data = b"x" * 1_000_000
    assert decoder.feed(data) == "x" * 1_000_000
