"""Per-request assembly of generated text: token piece bytes in, deltas to stream out.

Owns `TextAssembler`, the glue the engine keeps per request: each token piece goes through a
`Utf8Decoder` (incomplete characters held back, never-valid bytes replaced) and a `StopMatcher`
(text that may start a stop string held back until decided). The deltas it returns concatenate to
exactly `content`, the non-streamed result, for any split of the bytes into pieces; no delta
splits a character or holds a lone surrogate.

It reports `stopping_word` as llama-server does (`stop_type: "word"` when set). EOS, limits and
`n_indent` are the engine's business: it calls `finish()` whenever generation ends without a stop
word, which releases the held text (llama-server drops held-back text from the stream when a
request ends on a limit; its non-streamed `content` keeps it, and so do we, in both modes).

Pure; one assembler per request, one caller (the engine thread).
"""

from __future__ import annotations

from collections.abc import Sequence

from kvswap.text.stops import StopMatcher
from kvswap.text.utf8 import Utf8Decoder


class TextAssembler:
    """Turns one request's token pieces into streamable deltas (see the module docstring)."""

    __slots__ = ("_decoder", "_finished", "_parts", "_stops")

    def __init__(self, stops: Sequence[str] = ()) -> None:
        self._decoder = Utf8Decoder()
        self._stops = StopMatcher(stops)
        self._parts: list[str] = []
        self._finished = False

    @property
    def stopped(self) -> bool:
        """A stop string matched; the engine should end the request with `stop_type` "word"."""
        return self._stops.stopped

    @property
    def stopping_word(self) -> str:
        """The stop string that matched, "" when none (llama-server's `stopping_word`)."""
        return self._stops.stopping_word

    @property
    def finished(self) -> bool:
        return self._finished

    @property
    def content(self) -> str:
        """Everything emitted so far; after `finish()`, the non-streamed `content`."""
        if len(self._parts) > 1:
            self._parts = ["".join(self._parts)]
        return self._parts[0] if self._parts else ""

    @property
    def n_held_bytes(self) -> int:
        """Bytes of generated text received but not yet emitted (incomplete or maybe a stop)."""
        if self._stops.stopped:
            return 0
        return len(self._decoder.pending) + len(self._stops.held.encode("utf-8"))

    def feed(self, piece: bytes) -> str:
        """Add one token's piece bytes; return the delta to stream now (may be "")."""
        assert not self._finished, "TextAssembler.feed after finish"
        if self._stops.stopped:
            return ""
        return self._emit(self._stops.feed(self._decoder.feed(piece)).text)

    def finish(self) -> str:
        """End of generation: return the last delta (held text released unless a stop matched)."""
        if self._finished:
            return ""
        self._finished = True
        if self._stops.stopped:
            return ""
        delta = self._stops.feed(self._decoder.flush()).text
        if not self._stops.stopped:
            delta += self._stops.finish()
        return self._emit(delta)

    def _emit(self, delta: str) -> str:
        if delta:
            self._parts.append(delta)
        return delta
