"""`kvswap bench coding`'s bookkeeping: what it reads of a captured answer, what a replay sends,
and what the report counts (pure, no server, no client)."""

from __future__ import annotations

import argparse
import json

from kvswap.bench.coding import Request, delta_text, usage_tokens
from kvswap.bench.coding_report import Sample, report

# A Claude Code answer as Anthropic's stream carries it, and a Codex call then answer as the
# Responses stream does (the fields the bench reads; others omitted).
ANTHROPIC = [
    {"type": "message_start", "message": {"usage": {"input_tokens": 40,
                                                    "cache_read_input_tokens": 6000}}},
    {"type": "content_block_delta", "delta": {"type": "text_delta", "text": "Once "}},
    {"type": "content_block_delta", "delta": {"type": "text_delta", "text": "upon."}},
    {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 3}},
]  # fmt: skip
RESPONSES = [
    {"type": "response.function_call_arguments.delta", "delta": "{}"},
    {"type": "response.output_text.delta", "delta": "Goal: ship."},
    {"type": "response.completed", "response": {"usage": {"input_tokens": 7100,
                                                          "output_tokens": 9}}},
]  # fmt: skip


def test_a_captured_answer_is_its_deltas_and_its_usage_in_both_apis() -> None:
    assert delta_text(ANTHROPIC) == "Once upon."
    assert usage_tokens(ANTHROPIC) == (6040, 3)
    assert delta_text(RESPONSES) == "{}Goal: ship."
    assert usage_tokens(RESPONSES) == (7100, 9)


def test_a_replay_caps_the_answer_at_the_captured_length_and_keeps_the_rest() -> None:
    """A server that ignores the capture's grammar (llama-server on /v1/messages) must not
    write a longer answer than the capture got; nothing else of the body changes."""
    body = {"model": "m", "max_tokens": 32000, "grammar": "root ::= x", "messages": []}
    r = Request("claude-1", 0, "/v1/messages", {}, json.dumps(body), "x", 6040, 300)
    assert json.loads(r.replayed()) == {**body, "max_tokens": 316}
    codex = Request("codex-1", 0, "/v1/responses", {}, json.dumps({"input": []}), "", 7100, 9)
    assert json.loads(codex.replayed()) == {"input": [], "max_output_tokens": 25}


def _sample(way: str, session: str, turn: int, index: int, prefilled: int, cached: int) -> Sample:
    return Sample(way, session, turn, index, 200, prefilled, cached, 100.0 * (1 + prefilled // 1000),
                  1000.0, True)  # fmt: skip


def test_reuse_leaves_out_each_sessions_first_request_only() -> None:
    """A session's first request has nothing to reuse; every later one, the call's answer
    within a turn included, counts."""
    samples = [
        _sample("kvswap", "claude-1", 0, 0, 6000, 0),
        _sample("kvswap", "claude-1", 1, 0, 50, 6300),
        _sample("kvswap", "codex-1", 0, 0, 7000, 0),
        _sample("kvswap", "codex-1", 0, 1, 50, 7050),
        _sample("llama-server", "claude-1", 0, 0, 6000, 0),
        _sample("llama-server", "claude-1", 1, 0, 6350, 0),
    ]
    a = argparse.Namespace(sessions=2, turns=2, llama_server="BIN")
    lines = report(samples, a, "load average 1.00")
    kvswap = next(line for line in lines if line.startswith("| kvswap |"))
    assert "| 99.26% |" in kvswap  # 13350 of 13450 tokens read
    llama = next(line for line in lines if line.startswith("| llama-server |"))
    assert "| 0.00% |" in llama
    assert lines[-1] == "TTFT, turns 2+ (p50): kvswap 7.0x faster than llama-server."
