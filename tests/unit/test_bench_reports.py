"""`kvswap bench agents` and `kvswap bench throughput` bookkeeping (pure, no server)."""

from __future__ import annotations

import argparse

import pytest

from kvswap.bench.agents import Case, Result, Turn, speedup, table
from kvswap.bench.throughput import Load, _sizes, jobs


def _turn(agent: int, rnd: int, wall_ms: float) -> Turn:
    return Turn(agent, rnd, 200, wall_ms, prompt_n=10, cache_n=90, n_before=90 if rnd else 0)


def test_agents_report_the_cold_first_round_apart_from_the_returning_turns() -> None:
    """Decision: the first round (every prompt cold: prefill speed) and the returning turns
    (what each server kept) are different claims, so they are summed and compared apart; a
    regression in one must not hide in the other's total. The log's slot failures show."""
    kvswap, llama = Result("kvswap, key"), Result("llama-server")
    kvswap.turns = [_turn(0, 0, 10_000), _turn(1, 0, 12_000), _turn(0, 1, 300)]
    llama.turns = [_turn(0, 0, 11_000), _turn(1, 0, 11_000), _turn(0, 1, 3_000)]
    kvswap.total_s, llama.total_s, kvswap.n_slot_failures = 22.3, 25.0, 6
    kv_row = table([kvswap, llama])[2].split(" | ")
    assert kv_row[7:9] == ["22.0", "300"] and kv_row[-1] == "6 |"
    cases_run = [Case("kvswap, key", None, "key"), Case("llama-server", "llama-server", "key")]
    lines = speedup([kvswap, llama], cases_run)
    assert (
        lines[1] == "Returning turns (p50): kvswap, key 300 ms, llama-server 3000 ms: 10.0x faster."
    )
    assert lines[2].startswith(
        "First round (cold prompts): kvswap, key 22.0 s, llama-server 22.0 s: x1.000"
    )


def test_throughput_runs_each_prompt_size_on_each_stream_count() -> None:
    """The long-prompt cases: a prefill job per size and stream count, named by both, and a
    decode job per stream count; a malformed list is an argument error naming it."""
    load = Load("m.gguf", 2, 2048, 512, (512, 2048), 64, streams=(1, 2))
    work = jobs(load, lambda text: list(range(len(text.split()))))
    assert [(j.name, [len(p) for p in j.prompts]) for j in work] == [
        ("prefill 512 x1", [512]),
        ("prefill 2048 x1", [2048]),
        ("decode x1", [16]),
        ("prefill 512 x2", [512, 512]),
        ("prefill 2048 x2", [2048, 2048]),
        ("decode x2", [16, 16]),
    ]
    assert _sizes("512,2048,4096") == (512, 2048, 4096)
    with pytest.raises(argparse.ArgumentTypeError, match="'512,x'"):
        _sizes("512,x")
