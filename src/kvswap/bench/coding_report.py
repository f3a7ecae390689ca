"""`kvswap bench coding`'s figures: each replayed request (`Sample`), and the report that puts
the ways side by side: per turn, the sessions' median TTFT and the tokens they prefilled; per
way, failures, tokens prefilled and read, the share of prompt tokens reused after each
session's first request, and how many answers came out as captured (a replay that answers
otherwise re-prefills that answer on its next turn, on any server)."""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass
class Sample:
    """One replayed request."""

    way: str  # "kvswap", "llama-server"
    session: str
    turn: int
    index: int  # its place among its turn's requests
    status: int
    prefilled: int  # prompt tokens the server evaluated for it (its /metrics)
    cached: int  # prompt tokens it read from a cache instead
    ttft_ms: float  # to its first delta event
    wall_ms: float
    same_answer: bool  # the answer the capture got, to the token's text


def _ways(samples: Sequence[Sample]) -> list[str]:
    return list(dict.fromkeys(s.way for s in samples))


def _median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else 0.0


def _turn_rows(samples: Sequence[Sample], ways: list[str]) -> list[str]:
    head = "| turn | " + " | ".join(f"{w} TTFT p50 ms | {w} prefilled" for w in ways) + " |"
    lines = [head, "|" + "---|" * (1 + 2 * len(ways))]
    for t in sorted({s.turn for s in samples}):
        cells = []
        for w in ways:
            mine = [s for s in samples if s.way == w and s.turn == t]
            cells.append(f"{_median([s.ttft_ms for s in mine]):.0f}")
            cells.append(str(sum(s.prefilled for s in mine)))
        lines.append(f"| {t + 1} | " + " | ".join(cells) + " |")
    return lines


def _reuse(mine: Sequence[Sample]) -> float:
    """The share of prompt tokens read from cache, each session's first request aside."""
    later = [s for s in mine if (s.turn, s.index) != (0, 0)]
    total = sum(s.prefilled + s.cached for s in later)
    return sum(s.cached for s in later) / total if total else 0.0


def _way_rows(samples: Sequence[Sample], ways: list[str]) -> list[str]:
    lines = [
        "| way | requests | failed | tokens prefilled | tokens read from cache "
        "| reused after each session's first request | TTFT p50 ms, turns 2+ | answers as captured "
        "| wall s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for w in ways:
        mine = [s for s in samples if s.way == w]
        failed = sum(s.status != 200 for s in mine)
        later = [s.ttft_ms for s in mine if s.turn > 0]
        same = sum(s.same_answer for s in mine)
        lines.append(
            f"| {w} | {len(mine)} | {failed} | {sum(s.prefilled for s in mine)} "
            f"| {sum(s.cached for s in mine)} | {100 * _reuse(mine):.2f}% | {_median(later):.0f} "
            f"| {same} of {len(mine)} | {sum(s.wall_ms for s in mine) / 1e3:.1f} |"
        )
    return lines


def report(samples: Sequence[Sample], a: argparse.Namespace, load: str) -> list[str]:
    ways = _ways(samples)
    sessions = sorted({s.session for s in samples})
    lines = [
        f"# kvswap bench coding: {len(sessions)} sessions ({', '.join(sessions)}) of "
        f"{a.turns} turns on one slot, a RAM budget that holds two minds",
        "",
        f"command: `kvswap bench coding --sessions {a.sessions} --turns {a.turns}"
        + (" --llama-server BIN`" if a.llama_server else "`")
        + f"; load: {load}",
        "",
        *_way_rows(samples, ways),
        "",
        "Each turn, every session's requests (TTFT: the median over the turn's requests; "
        "prefilled: their sum):",
        "",
        *_turn_rows(samples, ways),
    ]
    if len(ways) == 2:
        later = {
            w: _median([s.ttft_ms for s in samples if s.way == w and s.turn > 0]) for w in ways
        }
        if later[ways[0]] > 0:
            ratio = later[ways[1]] / later[ways[0]]
            lines += ["", f"TTFT, turns 2+ (p50): {ways[0]} {ratio:.1f}x faster than {ways[1]}."]
    return lines
