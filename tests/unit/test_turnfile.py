"""The minds' last turns kept across a restart (`minds.turnfile`): written whole, read back
whole and in their order, and a damaged file costs the turns, never the start."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

from kvswap.core.keys import PageKey, PageKind
from kvswap.minds.continuation import Position
from kvswap.minds.histories import LastTurn, MindHistories
from kvswap.minds.turnfile import TURNS_FILE, load_turns, save_turns


def _turn(n: int, content: str) -> LastTurn:
    tokens = np.arange(n, dtype=np.int32) + 7
    return LastTurn(tokens, Position(n, n - 3, 40 + n, f"digest{n}"), 3, content, "opening")


def _key(name: str, namespace: str = "ns") -> PageKey:
    return PageKey(PageKind.MIND, namespace, name)


def test_the_last_turns_come_back_whole_and_in_their_order(tmp_path: Path) -> None:
    before = MindHistories()
    before.put(_key("a"), _turn(10, "<tool_call>{}</tool_call>"))
    before.put(_key("b", "other"), _turn(5, "é ✓"))
    before.put(_key("a"), _turn(12, "again"))  # a's newer turn: now the most recent
    assert save_turns(before, tmp_path) == 2
    after = MindHistories()
    assert load_turns(after, tmp_path) == 2
    assert [k for k, _ in after.items()] == [_key("b", "other"), _key("a")]
    for key, turn in before.items():
        got = after.get(key)
        assert got is not None and np.array_equal(got.tokens, turn.tokens)
        assert (got.position, got.n_messages, got.content, got.opening) == (
            turn.position, turn.n_messages, turn.content, turn.opening,
        )  # fmt: skip
    assert [p.name for p in tmp_path.iterdir()] == [TURNS_FILE]  # nothing left beside it


def test_a_damaged_file_is_logged_and_costs_only_the_turns(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    histories = MindHistories()
    histories.put(_key("a"), _turn(10, "x"))
    save_turns(histories, tmp_path)
    path = tmp_path / TURNS_FILE
    path.write_text(path.read_text()[:-20])
    after = MindHistories()
    with caplog.at_level(logging.WARNING, logger="kvswap.minds"):
        assert load_turns(after, tmp_path) == 0
    assert after.items() == [] and "could not be read" in caplog.text
    assert load_turns(MindHistories(), tmp_path / "nowhere") == 0  # no file: nothing to read
