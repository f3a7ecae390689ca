"""Anthropic's prompt caching on the CPU (`server.anthropic.cache`): which chat messages each
`cache_control` breakpoint covers, and usage whose read, created and uncached parts add up to
the prompt, with creation only where a mind keeps what it prefilled."""

from __future__ import annotations

import json

import pytest

from kvswap.core.errors import KvswapError
from kvswap.server.anthropic.cache import Breakpoint, CacheMarks, breakpoints, usage
from kvswap.server.anthropic.schemas import MessagesRequest
from kvswap.server.requests.schemas import parse_body

EPHEMERAL = {"type": "ephemeral"}


def _req(body: dict[str, object]) -> MessagesRequest:
    return parse_body(MessagesRequest, json.dumps({"max_tokens": 8, **body}).encode())


def test_breakpoints_cover_the_messages_up_to_the_one_that_holds_them() -> None:
    """Defect caught: a breakpoint placed by Anthropic block index instead of by the chat
    messages the prompt renders (a tool_result turns into messages of its own), so the cached
    prefix ends mid-conversation or past it."""
    req = _req(
        {
            "system": [{"type": "text", "text": "Be brief.", "cache_control": EPHEMERAL}],
            "tools": [{"name": "t", "input_schema": {}, "cache_control": {**EPHEMERAL, "ttl": "1h"}}],
            "messages": [
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": [{"type": "tool_use", "id": "1", "name": "t", "input": {}}]},
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": "1", "content": "ok"},
                        {"type": "text", "text": "and?", "cache_control": EPHEMERAL},
                    ],
                },
            ],
            "cache_control": EPHEMERAL,
        }
    )  # fmt: skip
    assert breakpoints(req) == [
        Breakpoint(1, 3600),  # the tool: with the system prompt
        Breakpoint(1, 300),  # the system block
        Breakpoint(5, 300),  # system, user, assistant, then the user turn and its tool result
        Breakpoint(5, 300),  # the automatic one: the last block
    ]
    assert breakpoints(_req({"messages": [{"role": "user", "content": "x"}]})) == []


@pytest.mark.parametrize("cc", [{"type": "persistent"}, {"type": "ephemeral", "ttl": "2h"}])
def test_an_unknown_cache_control_is_a_400(cc: dict[str, str]) -> None:
    with pytest.raises(KvswapError):
        _req({"messages": [{"role": "user", "content": "x"}], "cache_control": cc})


@pytest.mark.parametrize(
    ("cache", "n_cached", "expect"),
    [
        # A mind's turn: 40 read, new tokens up to the 5m breakpoint at 90 created, 10 after it.
        (CacheMarks(end_5m=90, kept=True), 40, (10, 50, 40, 50, 0)),
        # 1h breakpoint at 60, 5m at 90: the created part splits at 60.
        (CacheMarks(end_5m=90, end_1h=60, kept=True), 40, (10, 50, 40, 30, 20)),
        # Read past every breakpoint: nothing created.
        (CacheMarks(end_5m=90, kept=True), 95, (5, 0, 95, 0, 0)),
        # Anonymous: no mind keeps it, so nothing is reported created.
        (CacheMarks(end_5m=90, kept=False), 40, (60, 0, 40, 0, 0)),
        # No breakpoint at all.
        (CacheMarks(kept=True), 0, (100, 0, 0, 0, 0)),
    ],
)
def test_usage_adds_up_to_the_prompt(
    cache: CacheMarks, n_cached: int, expect: tuple[int, int, int, int, int]
) -> None:
    """Defect caught: cache_creation_input_tokens always 0 while a mind keeps the prefix, or
    read + created + uncached not adding up to the prompt (cost dashboards read all three)."""
    u = usage(100, n_cached, 7, cache)
    got = (
        u["input_tokens"],
        u["cache_creation_input_tokens"],
        u["cache_read_input_tokens"],
        u["cache_creation"]["ephemeral_5m_input_tokens"],
        u["cache_creation"]["ephemeral_1h_input_tokens"],
    )
    assert got == expect
    assert u["input_tokens"] + u["cache_creation_input_tokens"] + n_cached == 100
    assert u["output_tokens"] == 7


def test_the_retention_floor_is_the_longest_ttl_of_a_kept_request() -> None:
    assert CacheMarks(end_5m=9, end_1h=3, kept=True).retain_s == 3600
    assert CacheMarks(end_5m=9, kept=True).retain_s == 300
    assert CacheMarks(end_5m=9, kept=False).retain_s == 0
    assert CacheMarks(kept=True).retain_s == 0
