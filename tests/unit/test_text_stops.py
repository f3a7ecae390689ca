"""StopMatcher: streamed output equals the non-streamed result for any chunking."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from kvswap.text.stops import StopMatcher, apply_stops


def reference(text: str, stops: list[str]) -> tuple[str, str]:
    """Scan end positions left to right: the first stop complete wins, the longest on a tie."""
    words = [s for s in stops if s]
    for end in range(1, len(text) + 1):
        done = [w for w in words if text[:end].endswith(w)]
        if done:
            word = max(done, key=len)
            return text[: end - len(word)], word
    return text, ""


def chunks(text: str, cuts: list[int]) -> list[str]:
    points = sorted({c % (len(text) + 1) for c in cuts})
    bounds = [0, *points, len(text)]
    return [text[a:b] for a, b in itertools.pairwise(bounds)]


alphabet = st.sampled_from(["a", "b", "c", "\n", "€", "<", "/"])
texts = st.lists(alphabet, max_size=30).map("".join)
stop_words = st.lists(st.lists(alphabet, max_size=4).map("".join), max_size=4)


@settings(max_examples=500, deadline=None)
@given(texts, stop_words, st.lists(st.integers(min_value=0, max_value=1000), max_size=10))
def test_streamed_equals_non_streamed(text: str, stops: list[str], cuts: list[int]) -> None:
    expected, expected_word = reference(text, stops)
    assert apply_stops(text, stops) == (expected, expected_word)
    matcher = StopMatcher(stops)
    emitted: list[str] = []
    fed = ""
    for chunk in chunks(text, cuts):
        result = matcher.feed(chunk)
        fed += chunk
        emitted.append(result.text)
        assert result.stopped == matcher.stopped
        if result.stopped:
            assert result.stopping_word == expected_word
            break
        # Held back: exactly the longest suffix that may still become a stop string.
        assert "".join(emitted) + matcher.held == fed
        held = matcher.held
        assert held == "" or any(w.startswith(held) and w != held for w in stops if w)
        for n in range(len(held) + 1, len(fed) + 1):
            assert not any(w.startswith(fed[-n:]) for w in stops if w)
    emitted.append(matcher.finish())
    assert "".join(emitted) == expected
    assert matcher.stopping_word == expected_word


def test_stop_across_chunks_emits_nothing_of_it() -> None:
    matcher = StopMatcher(["</s>"])
    assert matcher.feed("Hi <").text == "Hi "
    assert matcher.feed("/").text == ""
    result = matcher.feed("s>tail")
    assert (result.text, result.stopped, result.stopping_word) == ("", True, "</s>")
    assert matcher.finish() == ""


def test_partial_that_fails_is_released() -> None:
    matcher = StopMatcher(["</s>"])
    assert matcher.feed("a</").text == "a"
    assert matcher.feed("x").text == "</x"
    assert matcher.finish() == ""


def test_finish_releases_held_text() -> None:
    matcher = StopMatcher(["STOP"])
    assert matcher.feed("ends with ST").text == "ends with "
    assert matcher.finish() == "ST"


def test_earliest_end_wins_then_longest() -> None:
    # "bc" is complete before "abcd" can be: the same answer whether "abcd" comes whole or not.
    assert apply_stops("abcd", ["abcd", "bc"]) == ("a", "bc")
    matcher = StopMatcher(["abcd", "bc"])
    assert matcher.feed("abcd").text == "a"
    assert matcher.stopping_word == "bc"
    # Two stops ending at the same character: the longer one starts first and wins.
    assert apply_stops("xabc", ["c", "abc"]) == ("x", "abc")


def test_empty_and_duplicate_stops_are_ignored() -> None:
    matcher = StopMatcher(["", "x", "x"])
    assert matcher.stops == ("x",)
    assert StopMatcher([""]).feed("anything").text == "anything"
    assert StopMatcher([]).feed("<").text == "<"


def test_text_after_stop_is_ignored() -> None:
    matcher = StopMatcher(["\n"])
    assert matcher.feed("one\ntwo").text == "one"
    result = matcher.feed("three")
    assert (result.text, result.stopped, result.stopping_word) == ("", True, "\n")
