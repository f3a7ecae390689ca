"""Stop strings over streamed text, as llama-server applies them.

Owns `StopMatcher`: one per request, fed decoded text chunk by chunk. Text that might be the start
of a stop string is held back until decided (llama-server's "partial stop",
`string_find_partial_stop` in common/common.h); once a stop string is complete, the text before
it is released, and the stop string and everything after it are dropped, as in llama-server's
non-streamed `content` (`server_slot::find_stopping_strings` and `process_token` in
tools/server/server-context.cpp).

Which stop wins: the occurrence that is complete first in the text (smallest end), and among those
ending at the same place the one starting first (the longest). llama-server checks after every
token and, among the words complete within the newest token, keeps the one starting first; that
is the same rule whenever a token completes at most one candidate. Ours does not depend on how
the text is chunked, so streamed and non-streamed runs agree exactly.

Empty stop strings are ignored. Pure; one matcher per request, one caller.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class StopResult:
    """What one `StopMatcher.feed` decided."""

    text: str
    """Text safe to emit now; when `stopped`, the last text before the stop string."""
    stopped: bool
    """A stop string is complete; nothing more will be emitted."""
    stopping_word: str
    """The stop string that matched ("" when none, as llama-server's `stopping_word`)."""


def first_stop(text: str, stops: Sequence[str]) -> tuple[int, str] | None:
    """The winning stop occurrence in `text` as (start, word), or None (see module docstring)."""
    best: tuple[int, int, str] | None = None  # (end, -len, word): min end, then longest
    for word in stops:
        if not word:
            continue
        start = text.find(word)
        if start < 0:
            continue
        key = (start + len(word), -len(word), word)
        if best is None or key[:2] < best[:2]:
            best = key
    if best is None:
        return None
    end, neg_len, word = best
    return end + neg_len, word


def apply_stops(text: str, stops: Sequence[str]) -> tuple[str, str]:
    """Non-streamed result: (text before the winning stop, or all of it; the stop word or "")."""
    found = first_stop(text, stops)
    if found is None:
        return text, ""
    start, word = found
    return text[:start], word


class StopMatcher:
    """Streams text through a set of stop strings (see the module docstring)."""

    __slots__ = ("_finished", "_held", "_max_len", "_stop_chars", "_stopping_word", "_stops")

    def __init__(self, stops: Sequence[str]) -> None:
        # Keep the caller's order (ties cannot differ in result), drop empties and duplicates.
        self._stops: tuple[str, ...] = tuple(dict.fromkeys(s for s in stops if s))
        self._max_len = max((len(s) for s in self._stops), default=0)
        self._stop_chars = frozenset("".join(self._stops))
        self._held = ""
        self._stopping_word = ""
        self._finished = False

    @property
    def stops(self) -> tuple[str, ...]:
        """The effective stop strings (empty ones removed)."""
        return self._stops

    @property
    def stopped(self) -> bool:
        return bool(self._stopping_word)

    @property
    def stopping_word(self) -> str:
        return self._stopping_word

    @property
    def held(self) -> str:
        """Text held back because it may be the start of a stop string."""
        return self._held

    def feed(self, text: str) -> StopResult:
        """Add text; return what is safe to emit now, and whether a stop string completed.

        After a stop, further text is ignored (a batch of accepted draft tokens may run past it).
        """
        assert not self._finished, "StopMatcher.feed after finish"
        if self._stopping_word:
            return StopResult("", True, self._stopping_word)
        if not self._stops:
            return StopResult(text, False, "")
        # No stop occurs inside the held text (it would have stopped already), so any occurrence
        # in `buf` ends in the new text; one starting before `held` was never a partial match.
        buf = self._held + text
        found = first_stop(buf, self._stops)
        if found is not None:
            start, word = found
            self._held = ""
            self._stopping_word = word
            return StopResult(buf[:start], True, word)
        cut = self._partial_start(buf)
        self._held = buf[cut:]
        return StopResult(buf[:cut], False, "")

    def finish(self) -> str:
        """End of generation without a stop: release the held text (empty after a stop)."""
        self._finished = True
        held, self._held = self._held, ""
        return held

    def _partial_start(self, buf: str) -> int:
        """Index where the longest suffix of `buf` that is a proper prefix of a stop begins.

        len(buf) when no suffix is: everything may be emitted.
        """
        if not buf or buf[-1] not in self._stop_chars:
            return len(buf)
        #   buf = ..........[p ........]   suffix buf[p:] shorter than the longest stop
        for p in range(max(0, len(buf) - self._max_len + 1), len(buf)):
            suffix = buf[p:]
            if any(word.startswith(suffix) for word in self._stops):
                return p
        return len(buf)
