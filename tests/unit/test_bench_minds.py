"""`kvswap bench minds`' bookkeeping: what a case reports from its turns (pure, no server)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from kvswap.bench.minds_report import memory_lines, parts_lines, ratio_lines, table_lines
from kvswap.bench.minds_script import Case, Result, Turn, estimate
from kvswap.bench.server import RssPeaks, peak_rss_bytes


def _turn(mind: int, rnd: int, content: str, *, lost_ms: float = 0.0, n_lost: int = 0) -> Turn:
    return Turn(mind, rnd, content, wall_ms=100.0, ttft_ms=60.0, prompt_n=50, cache_n=500,
                moved_ms=5.0, lost_ms=lost_ms, n_lost=n_lost)  # fmt: skip


CASE = Case("fit", "m.gguf", 2, 500, 1, 2, budget_bytes=1 << 30)


def test_switching_counts_rounds_after_the_first_and_splits_out_the_re_prefill() -> None:
    r = Result("fit", "llama-server")
    r.turns = [_turn(0, 0, "a"), _turn(1, 0, "b"), _turn(0, 1, "c", lost_ms=900.0, n_lost=500)]
    assert r.first_round_s == 0.2
    assert r.switch_s == (5.0 + 900.0) / 1e3  # round 1 only: the move and the re-prefill
    assert (r.lost_s, r.n_lost) == (0.9, 500)


def test_text_is_compared_turn_for_turn_and_estimated_turns_are_never_compared() -> None:
    kvswap, other = Result("fit", "kvswap"), Result("fit", "llama-server")
    kvswap.turns = [_turn(0, 0, "a"), _turn(0, 1, "b")]
    other.turns = [_turn(0, 0, "a"), _turn(0, 1, "b")]
    assert other.identical_to(kvswap)
    other.turns[1] = _turn(0, 1, "x")
    assert "round 1, mind 0" in other.first_difference(kvswap)
    other.turns[1:] = estimate(other.turns[:1], range(1, 2), n_minds=1, growth=30)
    assert other.estimated and other.identical_to(kvswap)
    rows = table_lines([(CASE, {"kvswap": kvswap, "llama-server": other}, "load 1.0")])
    assert "llama-server (est.)" in rows[-1]


def test_estimated_turns_re_prefill_the_whole_mind_at_the_measured_rate() -> None:
    measured = [_turn(0, 0, "a")]  # 50 tokens prefilled in 60 ms (1.2 ms a token)
    [later] = estimate(measured, range(1, 2), n_minds=1, growth=30)
    assert later.estimated and later.prompt_n == 550 + 30
    assert later.n_lost == 550 and abs(later.lost_ms - 550 * 1.2) < 1e-6


def test_ratios_read_llama_server_over_kvswap() -> None:
    kvswap, other = Result("fit", "kvswap"), Result("fit", "llama-server")
    kvswap.turns = [_turn(0, 0, "a"), _turn(0, 1, "b")]
    other.turns = [_turn(0, 0, "a"), _turn(0, 1, "b", lost_ms=995.0, n_lost=500)]
    kvswap.total_s, other.total_s = 1.0, 2.0
    [row] = ratio_lines([(CASE, {"kvswap": kvswap, "llama-server": other}, "")])[2:]
    assert row.startswith("| fit | 1.00x | 1.00x | 200.00x |") and row.endswith("| 2.00x |")


def test_a_switch_from_disk_is_shown_in_parts_against_its_floor() -> None:
    """The over-budget case's claim: kvswap's later turns split into the read, the restore
    and the prefill, with the read's floor (page cache into a ready buffer) beside it; a
    baseline tree without those counters shows its turn times and dashes, never zeros."""
    this, base = Result("exceed", "kvswap"), Result("exceed", "kvswap baseline")
    disk = _turn(0, 1, "a")
    disk.read_ms, disk.restore_ms, disk.floor_read_ms, disk.prompt_ms = 12.0, 6.0, 4.0, 40.0
    this.turns = [_turn(0, 0, "a"), disk, _turn(1, 1, "b")]
    base.turns = [_turn(0, 0, "a"), _turn(0, 1, "a")]
    rows = parts_lines([(CASE, {"kvswap": this, "kvswap baseline": base}, "load 1")])
    assert rows[2] == "| fit | kvswap | 100.0 | 60.0 | 20.0 | 1 of 2 | 12.0 | 6.0 | 4.0 | 1.80x |"
    assert rows[3] == "| fit | kvswap baseline | 100.0 | 60.0 | 0.0 | 0 of 1 | - | - | - | - |"


def test_peak_rss_is_shown_beside_what_the_flags_mean_the_server_to_hold() -> None:
    """Issue 32: the bench prints each server's peak RSS beside weights + KV pool + RAM budget,
    so a copy of a mind nothing charged shows as MiB over."""
    r = Result("fit", "kvswap")
    r.peak_rss_bytes, r.rss_bound_bytes = 1536 << 20, 1024 << 20
    r.peak_anon_bytes, r.anon_bound_bytes, r.peak_file_bytes = 1100 << 20, 1000 << 20, 436 << 20
    [row] = memory_lines([(CASE, {"kvswap": r}, "")])[2:]
    assert row == "| fit | kvswap | 1,536 | 1,024 | 512 | 1,100 | 1,000 | 100 | 436 |"
    assert peak_rss_bytes(os.getpid()) > 0  # this process's, from /proc


def test_the_anonymous_peak_is_sampled_apart_from_mapped_files(tmp_path: Path) -> None:
    """A mind's file mapped while it is restored is page cache, not memory the server holds:
    the sampler keeps the anonymous and the file-backed peaks apart (here a child process
    that touches 64 MiB of anonymous memory, then maps and reads a 32 MiB file, and holds both
    until the sampler has seen them)."""
    path = tmp_path / "file"
    path.write_bytes(b"\1" * (32 << 20))
    child = subprocess.Popen(
        [sys.executable, "-c", _TOUCHER, str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None and child.stdin is not None
    peaks = RssPeaks(child.pid, every_s=0.005)
    assert child.stdout.readline() == "ready\n"

    def both_seen() -> bool:
        return peaks.anon_bytes >= 64 << 20 and peaks.file_bytes >= 32 << 20

    deadline = time.monotonic() + 30
    while not both_seen() and time.monotonic() < deadline:
        time.sleep(0.01)
    child.communicate("go", timeout=60)
    peaks.stop()
    assert both_seen(), vars(peaks)
    assert peaks.anon_bytes < (64 + 32) << 20, vars(peaks)  # the file is not counted as held


_TOUCHER = """
import mmap, sys
anon = b"\\1" * (64 << 20)
with open(sys.argv[1], "rb") as f:
    m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
    total = sum(m[i] for i in range(0, len(m), 4096))
print("ready", flush=True)
sys.stdin.read()
"""
