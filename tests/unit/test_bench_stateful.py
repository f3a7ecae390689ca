"""`kvswap bench stateful`'s targets (`bench.stateful_report`): the stored turn is set beside
its own floor, the same turn on a mind resident in its slot, at every turn, and the worst turn
is the one named."""

from __future__ import annotations

from kvswap.bench.stateful_report import WAYS, TurnFigures, targets


def _way(way: str, ttft_ms: list[float]) -> list[TurnFigures]:
    return [
        TurnFigures(way, agent, turn, ms, ms + 100, 700, 1000.0, 300 * (turn + 1), 260)
        for turn, ms in enumerate(ttft_ms)
        for agent in range(2)
    ]


def test_the_stored_turn_is_set_beside_the_same_turn_resident_in_its_slot() -> None:
    stored = _way(WAYS[0], [900, 1100, 1300, 1380])
    resident = _way(WAYS[3], [900, 1000, 1000, 1200])
    lines = targets({WAYS[0]: stored, WAYS[3]: resident}, 4)
    floor = [line for line in lines if "resident in its slot" in line]
    assert floor == [
        "- stored vs the same turn on a mind resident in its slot (its floor): TTFT p50 1.30x at "
        "worst (turn 3), 1.15x at turn 4 (target <= 1.15x at every turn)"
    ]


def test_without_the_resident_way_no_floor_is_claimed() -> None:
    lines = targets({WAYS[0]: _way(WAYS[0], [900, 1100])}, 2)
    assert not any("resident" in line for line in lines)
