"""Incremental UTF-8 decoding of token pieces.

Owns `Utf8Decoder`: one per generated sequence, fed the raw bytes of each token piece. It
returns the text that is complete, holds back an incomplete multi-byte sequence at the end, and
replaces bytes that can never become valid with U+FFFD as soon as that is certain, one U+FFFD per
maximal invalid subpart (the Unicode "substitution of maximal subparts" practice, which is what
`bytes.decode("utf-8", "replace")` does). So for any split of a byte string into pieces, the
concatenated outputs plus `flush()` equal `data.decode("utf-8", "replace")`, and no output holds a
lone surrogate or half a character.

The work is done by CPython's C incremental decoder. It holds back one kind of prefix that is
already known to be invalid (ED A0..BF, the start of an encoded surrogate, kept so that the
"surrogatepass" handler can work), so after each piece the held bytes are checked against the
well-formed byte table and released as U+FFFD when they can no longer start a character.

Pure: no libllama, no I/O; not thread-safe (one decoder per sequence, one caller).
"""

from __future__ import annotations

import codecs

# Unicode 15, table 3-7: the allowed range of the second byte for each lead byte; every later
# continuation byte is 80..BF. A lead byte missing here (80..C1, F5..FF) is never valid.
_SECOND_BYTE_RANGE: dict[int, tuple[int, int]] = {
    **{lead: (0x80, 0xBF) for lead in range(0xC2, 0xE0)},
    0xE0: (0xA0, 0xBF),
    **{lead: (0x80, 0xBF) for lead in range(0xE1, 0xED)},
    0xED: (0x80, 0x9F),
    0xEE: (0x80, 0xBF),
    0xEF: (0x80, 0xBF),
    0xF0: (0x90, 0xBF),
    0xF1: (0x80, 0xBF),
    0xF2: (0x80, 0xBF),
    0xF3: (0x80, 0xBF),
    0xF4: (0x80, 0x8F),
}


def _sequence_length(lead: int) -> int:
    """Length of the sequence a valid lead byte starts (1 for ASCII)."""
    if lead < 0x80:
        return 1
    if lead < 0xE0:
        return 2
    if lead < 0xF0:
        return 3
    return 4


def valid_prefix_length(data: bytes) -> int:
    """Length of the longest prefix of `data` that starts a well-formed UTF-8 sequence.

    0 when the first byte can never start a character; otherwise at most the sequence length.
    """
    if not data:
        return 0
    lead = data[0]
    if lead < 0x80:
        return 1
    second = _SECOND_BYTE_RANGE.get(lead)
    if second is None:
        return 0
    n_bytes = _sequence_length(lead)
    n_valid = 1
    for i in range(1, min(n_bytes, len(data))):
        low, high = second if i == 1 else (0x80, 0xBF)
        if not low <= data[i] <= high:
            break
        n_valid += 1
    return n_valid


def is_incomplete_prefix(data: bytes) -> bool:
    """True when `data` is a proper prefix of one well-formed multi-byte sequence."""
    return 0 < len(data) < _sequence_length(data[0]) and valid_prefix_length(data) == len(data)


class Utf8Decoder:
    """Turns a stream of token piece bytes into text, holding back only what may still complete.

    `feed` returns the newly complete text; `flush` ends the stream (a held incomplete tail becomes
    U+FFFD). `pending` shows the bytes held back, always empty or an incomplete valid prefix.
    """

    __slots__ = ("_decoder",)

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    @property
    def pending(self) -> bytes:
        """Bytes held back: empty, or a proper prefix of a well-formed sequence."""
        buffered, _flag = self._decoder.getstate()
        return bytes(buffered)

    def feed(self, piece: bytes) -> str:
        """Decode one piece; return the text that is complete now."""
        text: str = self._decoder.decode(piece)
        # A piece ending in an ASCII byte leaves nothing buffered: skip the state check.
        if piece and piece[-1] >= 0x80:
            text += self._release_invalid_tail()
        return text

    def flush(self) -> str:
        """End the stream: return what is left, a held incomplete tail as U+FFFD."""
        text: str = self._decoder.decode(b"", final=True)
        self._decoder.reset()
        return text

    def _release_invalid_tail(self) -> str:
        """Replace held bytes that can no longer become a character (see the module docstring)."""
        buffered, _flag = self._decoder.getstate()
        if len(buffered) < 2 or is_incomplete_prefix(buffered):
            return ""
        self._decoder.reset()
        out: list[str] = []
        rest = bytes(buffered)
        while rest and not is_incomplete_prefix(rest):
            # The longest valid prefix is one maximal subpart: one U+FFFD for all of it; an
            # invalid lead byte on its own is a subpart of length one.
            n_invalid = max(1, valid_prefix_length(rest))
            out.append(rest[:n_invalid].decode("utf-8", "replace"))
            rest = rest[n_invalid:]
        out.append(self._decoder.decode(rest))
        return "".join(out)
