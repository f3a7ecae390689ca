"""A mind's last chat turn as the shared tier keeps it (`minds.turnrecord`): read back whole
over the token log it was written with, and ignored (never misapplied) over any other log."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from kvswap.minds.continuation import Position
from kvswap.minds.histories import LastTurn
from kvswap.minds.turnrecord import decode_record, encode_record


def _turn() -> LastTurn:
    tokens = np.arange(20, dtype=np.int32) + 100
    return LastTurn(tokens, Position(20, 12, 345, "digest"), 4, "<tool_call>{}</tool_call>", "op")


def test_a_record_comes_back_over_its_log_with_the_answer_past_it() -> None:
    turn = _turn()
    raw = encode_record("req-1:abc", turn, 19)  # the last sampled token is not in the KV
    got = decode_record(raw, turn.tokens[:19].copy(), "req-1:abc")
    assert got is not None and np.array_equal(got.tokens, turn.tokens)
    assert (got.position, got.n_messages, got.content, got.opening) == (
        turn.position, turn.n_messages, turn.content, turn.opening,
    )  # fmt: skip


def test_a_record_over_another_turns_log_is_ignored(caplog: pytest.LogCaptureFixture) -> None:
    turn = _turn()
    raw = encode_record("req-1:abc", turn, 19)
    log = turn.tokens[:19].copy()
    assert decode_record(raw, log, "req-2:def") is None  # a later turn wrote no record
    assert decode_record(raw, log[:18], "req-1:abc") is None  # a log rewritten shorter
    assert decode_record(b"", log, "req-1:abc") is None
    with caplog.at_level(logging.WARNING, logger="kvswap.minds"):
        assert decode_record(raw[:-5], log, "req-1:abc") is None
    assert "does not read" in caplog.text
