"""`kvswap bench stateful`'s targets (`bench.stateful_report`): the stored turn is set beside
its own floor, the same agent's turn on a mind resident in its slot, at every turn, and the
worst turn is the one named, with what the server spent moving the stored turn's mind."""

from __future__ import annotations

from kvswap.bench.stateful_report import WAYS, TurnFigures, targets


def _way(way: str, ttft_ms: list[list[float]], moved_ms: float = 0.0) -> list[TurnFigures]:
    """Each turn's TTFT of each agent (`ttft_ms[turn][agent]`)."""
    return [
        TurnFigures(
            way, agent, turn, ms, ms + 100, 700, 1000.0, 300 * (turn + 1), 260, moved_ms * turn
        )
        for turn, by_agent in enumerate(ttft_ms)
        for agent, ms in enumerate(by_agent)
    ]


def test_each_stored_turn_is_set_beside_the_same_agents_turn_resident_in_its_slot() -> None:
    stored = _way(WAYS[0], [[900] * 3, [1100] * 3, [1300, 2600, 1300], [1380] * 3], moved_ms=20)
    resident = _way(WAYS[3], [[900] * 3, [1000] * 3, [2600, 1000, 1000], [1200] * 3])
    lines = targets({WAYS[0]: stored, WAYS[3]: resident}, 4)
    floor = [line for line in lines if "resident in its slot" in line]
    # turn 3: the p50s are equal (1,300 ms each way) but agents 2 and 3 took 2.6x and 1.3x their
    # own floor: the median of each agent's ratio is 1.30x
    assert floor == [
        "- stored vs the same turn on a mind resident in its slot (its floor; the median of each "
        "agent's ratio): TTFT 1.30x at worst (turn 3), 1.15x at turn 4 (target <= 1.15x at every "
        "turn)"
    ]
    moves = [line for line in lines if "moves of the turn's mind" in line]
    assert moves == [
        "- stored: the server's moves of the turn's mind (switch out and in, read from disk, "
        "restore) p50 60 ms at most (turn 4, TTFT p50 1380 ms)"
    ]


def test_without_the_resident_way_no_floor_is_claimed() -> None:
    lines = targets({WAYS[0]: _way(WAYS[0], [[900] * 2, [1100] * 2])}, 2)
    assert not any("resident" in line for line in lines)
