"""The floors `kvswap bench paging` sets a switch's parts beside (`bench.switch_floors`): they
move the bytes they claim to (a floor that skipped work would flatter nothing but itself), and
the mind they time is the prefilled one."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kvswap.bench.switch_floors import (
    WriteFloor,
    drop_cache,
    measure_floors,
    read_into,
    write_fsync,
)
from kvswap.tiny import tiny_model_path


def test_the_write_and_both_reads_move_every_byte(tmp_path: Path) -> None:
    data = np.random.default_rng(5).integers(0, 256, 3 * (1 << 20) + 17, dtype=np.uint8)
    path = tmp_path / "floor.bin"
    write_fsync(path, data)
    assert path.stat().st_size == len(data)
    for cold in (False, True):
        if cold:
            drop_cache(path)
        back = np.zeros_like(data)
        read_into(path, back)
        assert np.array_equal(back, data), cold


@pytest.mark.model
def test_the_floors_time_the_prefilled_minds_state(tmp_path: Path) -> None:
    """The state timed is the mind's: twice the tokens, about twice the bytes; every floor ran
    (a read of a file never written, a set of an empty state, would take no time)."""
    model = str(tiny_model_path("llama", seed=7, vocab="tiny"))
    words = [10 + i % 40 for i in range(512)]  # within the tiny vocabulary
    small = measure_floors(model, words[:256], 1024, 1, tmp_path, 2)
    large = measure_floors(model, words, 1024, 1, tmp_path, 2)
    assert 1.8 < large.n_bytes / small.n_bytes < 2.1, (small, large)
    for floors in (small, large):
        times = [floors.memcpy_ms, floors.get_data_ms, floors.set_data_ms,
                 floors.read_warm_ms, floors.read_cold_ms]  # fmt: skip
        assert all(ms > 0 for ms in times), floors
    assert not (tmp_path / "floor.bin").exists()


def test_the_write_floor_replaces_its_file_as_a_publication_does(tmp_path: Path) -> None:
    """Each write is a new file written beside the last, which then goes: the floor neither
    reuses blocks it freed before writing nor fills the disk."""
    floor = WriteFloor(tmp_path, 1 << 20)
    assert floor() > 0
    first = list(tmp_path.iterdir())
    assert floor() > 0
    second = list(tmp_path.iterdir())
    assert len(first) == len(second) == 1 and first != second
    assert second[0].stat().st_size == 1 << 20
    floor.clear()
    assert list(tmp_path.iterdir()) == []
