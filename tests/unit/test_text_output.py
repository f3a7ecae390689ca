"""TextAssembler: streamed deltas concatenate to the non-streamed content."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kvswap.text.output import TextAssembler
from kvswap.text.stops import apply_stops

_chars = ["a", "b", "\n", "é", "€", "😀", "\ufffd"]
_piece = st.one_of(
    st.binary(max_size=5),
    st.lists(st.sampled_from(_chars), max_size=3).map(lambda cs: "".join(cs).encode("utf-8")),
    st.sampled_from([b"\xe2", b"\x82", b"\xac", b"\xf0\x9f", b"\x98\x80", b"\xed\xa0", b"\xff"]),
)
_stops = st.lists(st.lists(st.sampled_from(_chars), max_size=3).map("".join), max_size=3)


def has_lone_surrogate(text: str) -> bool:
    return any(0xD800 <= ord(ch) <= 0xDFFF for ch in text)


@settings(max_examples=500, deadline=None)
@given(st.lists(_piece, max_size=20), _stops)
def test_stream_equals_non_stream(pieces: list[bytes], stops: list[str]) -> None:
    expected, expected_word = apply_stops(b"".join(pieces).decode("utf-8", "replace"), stops)
    assembler = TextAssembler(stops)
    deltas = [assembler.feed(piece) for piece in pieces]
    deltas.append(assembler.finish())
    assert "".join(deltas) == expected
    assert assembler.content == expected
    assert assembler.stopping_word == expected_word
    assert assembler.stopped == bool(expected_word)
    for delta in deltas:
        assert not has_lone_surrogate(delta)
        delta.encode("utf-8")  # whole characters only


def test_multibyte_stop_split_over_tokens() -> None:
    assembler = TextAssembler(["€"])
    assert assembler.feed(b"price: 5") == "price: 5"
    assert assembler.feed(b"\xe2") == ""
    assert assembler.n_held_bytes == 1
    assert assembler.feed(b"\x82") == ""
    assert assembler.feed(b"\xac and more") == ""
    assert assembler.stopped and assembler.stopping_word == "€"
    assert assembler.finish() == ""
    assert assembler.content == "price: 5"


def test_chat_turn_stop() -> None:
    assembler = TextAssembler(["\n\nUser:"])
    out = [assembler.feed(p) for p in (b"Hello", b" there.", b"\n", b"\nUs", b"er:", b" hi")]
    assert out == ["Hello", " there.", "", "", "", ""]
    assert assembler.stopping_word == "\n\nUser:"
    assert assembler.content == "Hello there."


def test_finish_without_stop_releases_everything() -> None:
    assembler = TextAssembler(["</s>"])
    assert assembler.feed(b"abc</") == "abc"
    assert assembler.feed(b"\xf0\x9f") == ""
    assert assembler.n_held_bytes == 4
    assert assembler.finish() == "</\ufffd"
    assert not assembler.stopped and assembler.stopping_word == ""
    assert assembler.finish() == ""
    assert assembler.content == "abc</\ufffd"


def test_no_stops_streams_as_decoded() -> None:
    assembler = TextAssembler()
    assert assembler.feed(b"caf\xc3") == "caf"
    assert assembler.feed(b"\xa9") == "é"
    assert assembler.feed(b"\x80") == "\ufffd"
    assert assembler.finish() == ""
