"""Minds of hundreds of megabytes on disk: a SIGKILL in the middle of a mind's write, and a disk
that refuses one.

The model is a tiny llama with a real 8B model's KV bytes per token and more (32 layers x 64 KV
heads x 128, f16: 1 MiB a token), so a mind of `BIG_MIB` tokens is `BIG_MIB` MiB. CI runs
192 MiB minds; `KVSWAP_BIG_MIND_MIB=4096 pytest -s tests/reliability/test_big_minds.py` runs
4 GiB ones (about 12 GiB of memory: the KV pool, the page store and the written page).

- A SIGKILL while a mind's new generation is being written (its staged file seen growing):
  a restart serves that mind from its previous generation, exactly, and every other mind, and
  the cut publication is gone.
- A disk that refuses a mind's write (the server runs under a file-size limit below that mind:
  the kernel refuses the write, EFBIG, as a full disk refuses one, ENOSPC): the spill answers a
  typed 503, the mind stays in RAM and its next turn finds it whole, nothing is left staged, and
  every file written before is unchanged and served after a restart.
- A resident mind written behind (the quiet second's flush) is copied into memory the page
  store charges: the server's anonymous memory (the OS's count) rises by no copy of it.
- A mind larger than the whole page store leaves its slot for disk through its file's mapping:
  no copy in anonymous memory; a disk that refuses its file refuses the switch (typed 503) and
  the mind keeps its slot.
"""

from __future__ import annotations

import os
import resource
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import httpx
import pytest

from kvswap.bench.paging import wide_model
from kvswap.bench.server import RssPeaks
from kvswap.tiers.mindfiles import MINDS_DIR
from tests.reliability.soak import TOKEN_HI, TOKEN_LO
from tests.server.harness import ServerProcess

BIG_MIB = int(os.environ.get("KVSWAP_BIG_MIND_MIB", "192"))
pytestmark = [pytest.mark.model, pytest.mark.timeout(300 + BIG_MIB // 4)]

MIB = 1 << 20
SMALL_TOKENS = 48  # a small mind: 48 MiB


def _args(*, flush_s: int = 0, ram_bytes: int = 4 * (BIG_MIB + 16) * MIB) -> list[str]:
    model = wide_model(BIG_MIB)  # 1 MiB of KV a token
    n_ctx = 256 * (BIG_MIB // 256 + 2)  # one slot of a big mind and its next turns
    return ["-m", str(model), "-c", str(n_ctx), "-np", "1", "-t", "2", "-tb", "2",
            "-b", "256", "-ub", "256", "--page-flush-seconds", str(flush_s),
            "--page-ram-bytes", str(ram_bytes)]  # fmt: skip


class Mind:
    """A mind's conversation as its client keeps it: the tokens its KV holds after each turn."""

    def __init__(self, name: str, n_tokens: int, seed: int) -> None:
        self.name = name
        self.tokens = _tokens(n_tokens, seed)
        self.kv = 0

    def turn(self, server: ServerProcess, n_more: int = 8) -> dict[str, Any]:
        prompt = self.tokens + _tokens(n_more, len(self.tokens))
        body = {"prompt": prompt, "n_predict": 2, "temperature": 0, "ignore_eos": True,
                "return_tokens": True, "mind": self.name}  # fmt: skip
        resp = server.post("/completion", body)
        assert resp.status_code == 200, resp.text
        out = resp.json()
        self.tokens = prompt + out["tokens"]
        self.kv = len(self.tokens) - 1
        return out["mind"] | {"cache_n": out["timings"]["cache_n"]}

    def spill(self, server: ServerProcess) -> httpx.Response:
        return server.post(f"/minds/{self.name}?action=spill")


def _tokens(n: int, seed: int) -> list[int]:
    span = TOKEN_HI - TOKEN_LO + 1
    return [TOKEN_LO + (seed * 7919 + i * 104729) % span for i in range(n)]


def _staged(save: Path) -> list[Path]:
    """The files the minds' publications staged and did not finish."""
    stage = save / MINDS_DIR / ".kvswap" / "stage"
    found: list[Path] = []
    for folder in stage.glob("*"):
        with suppress(FileNotFoundError, NotADirectoryError):  # a lock file, a stage gone
            found += folder.iterdir()
    return sorted(found)


def _staged_bytes(save: Path) -> int:
    """The most bytes a staged file holds now (0: none); a stage that goes meanwhile counts 0."""
    sizes = [0]
    for path in _staged(save):
        with suppress(FileNotFoundError):
            sizes.append(path.stat().st_size)
    return max(sizes)


def _minds_files(save: Path) -> dict[str, tuple[int, int]]:
    """Each committed mind file's size and modification time (ns)."""
    root = save / MINDS_DIR
    return {p.name: (p.stat().st_size, p.stat().st_mtime_ns) for p in root.iterdir() if p.is_file()}


def test_a_sigkill_mid_write_of_a_big_mind_keeps_its_previous_generation(
    start: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    save = tmp_path / "save"
    first = start(*_args(), save=save)
    big, other = Mind("big", BIG_MIB, 1), Mind("other", SMALL_TOKENS, 2)
    big.turn(first)
    assert big.spill(first).status_code == 200  # generation 1 on disk
    kv_committed = big.kv
    other.turn(first)
    assert other.spill(first).status_code == 200
    assert big.turn(first)["tier_before"] == "disk"  # grows past generation 1

    answered: list[object] = []

    def spill() -> None:
        try:
            answered.append(big.spill(first).status_code)
        except httpx.TransportError as err:
            answered.append(err)

    writer = threading.Thread(target=spill)
    writer.start()
    deadline = time.monotonic() + 120
    while not (n_staged := _staged_bytes(save)):
        assert time.monotonic() < deadline and writer.is_alive(), "no write of generation 2 seen"
        time.sleep(0.001)
    first.proc.send_signal(signal.SIGKILL)
    writer.join(60)
    print(f"\nkilled with {n_staged / MIB:.0f} MiB of a {big.kv} MiB mind staged")
    assert first.proc.wait(30) == -signal.SIGKILL
    assert answered and isinstance(answered[0], httpx.TransportError), answered  # cut mid-way
    first.stop()

    again = start(*_args(), save=save)
    assert _staged(save) == []  # the cut publication is gone
    for mind, kv in ((big, kv_committed), (other, other.kv)):
        served = mind.turn(again)
        assert served["tier_before"] == "disk", (mind.name, served)
        assert served["n_tokens_before"] == kv and served["cache_n"] == kv, (mind.name, served)


@contextmanager
def _file_size_limit(n_bytes: int) -> Iterator[None]:
    """Processes started inside inherit a file-size limit of `n_bytes`: a write past it fails
    with EFBIG (Python ignores SIGXFSZ). The test's own process keeps it only meanwhile."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (n_bytes, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))


def test_a_disk_that_refuses_a_big_minds_write_loses_nothing(tmp_path: Path) -> None:
    save = tmp_path / "save"
    save.mkdir()
    args = [*_args(), "--slot-save-path", str(save)]
    with _file_size_limit((SMALL_TOKENS + 64) * MIB):
        server = ServerProcess(args, tmp_path / "limited.log")
    try:
        small, big = Mind("small", SMALL_TOKENS, 1), Mind("big", BIG_MIB, 2)
        small.turn(server)
        assert small.spill(server).status_code == 200
        before = _minds_files(save)
        big.turn(server)
        refused = big.spill(server)
        assert refused.status_code == 503, refused.text
        error = refused.json()["error"]
        assert error["type"] == "unavailable_error" and "stays in RAM" in error["message"]
        assert "File too large" in error["message"], error  # the write's own error
        assert _staged(save) == [] and _minds_files(save) == before
        kv = big.kv
        served = big.turn(server)  # whole, from RAM
        assert served["tier_before"] == "ram" and served["cache_n"] == kv, served
        kv = small.kv
        served = small.turn(server)
        assert served["tier_before"] == "disk" and served["cache_n"] == kv, served
    finally:
        server.stop()  # the exit's spill of the big mind is refused again (logged)
    again = ServerProcess(args, tmp_path / "again.log")
    try:
        kv = small.kv
        served = small.turn(again)
        assert served["tier_before"] == "disk" and served["cache_n"] == kv, served
    finally:
        again.stop()


def test_a_resident_minds_write_behind_costs_no_memory_outside_the_budget(
    start: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    """Issue 32 (peak RSS over the bound by half a 1 GiB mind): the flush of a resident mind
    copied it into a buffer nothing charged. It now borrows the switch's spare (or charged room):
    while the flush writes, the anonymous memory stays where it was."""
    ram_bytes = int(2.4 * (BIG_MIB + 16) * MIB)  # a page and the next switch's spare
    server = start(*_args(flush_s=30, ram_bytes=ram_bytes), "--metrics", save=tmp_path / "save")
    first, resident = Mind("first", BIG_MIB, 1), Mind("resident", BIG_MIB, 2)
    first.turn(server)
    resident.turn(server)  # the first mind to its RAM page, the next switch's spare mapped
    settled = _settled_anon(server)  # the next switch's spare mapped, before the flush
    assert not _written(server, resident)
    peaks = RssPeaks(server.proc.pid, every_s=0.002)
    deadline = time.monotonic() + 60
    while not _written(server, resident):  # the quiet second's flush, from its slot
        assert time.monotonic() < deadline, "the resident mind was not written behind"
        time.sleep(0.05)
    peaks.stop()
    print(
        f"\nanonymous {settled / MIB:.0f} MiB before the flush, {peaks.anon_bytes / MIB:.0f} at most"
    )
    assert peaks.anon_bytes <= settled + 32 * MIB  # no copy of the mind (BIG_MIB MiB)


def test_a_mind_larger_than_the_store_leaves_its_slot_with_no_copy_in_memory(
    start: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    """Issue 32 (no buffer may cost the budget a whole mind): a mind the page store cannot hold
    was copied out into a fresh buffer nothing charged, then written. It is now captured from
    its slot into its file's mapping: while it leaves for disk the anonymous memory rises by no
    copy of it, and its next turn finds it whole on disk."""
    ram_bytes = (BIG_MIB // 4) * MIB  # a quarter of the mind: it can never be a page
    server = start(*_args(ram_bytes=ram_bytes), "--metrics", save=tmp_path / "save")
    big, small = Mind("big", BIG_MIB, 1), Mind("small", SMALL_TOKENS // 4, 2)
    big.turn(server)
    settled = _settled_anon(server)
    peaks = RssPeaks(server.proc.pid, every_s=0.002)
    assert small.turn(server)["tier_before"] == "new"  # the big mind left the one slot first
    peaks.stop()
    print(f"\nanonymous {settled / MIB:.0f} MiB before, {peaks.anon_bytes / MIB:.0f} at most")
    assert peaks.anon_bytes <= settled + 32 * MIB  # no copy of the mind (BIG_MIB MiB)
    assert _staged(tmp_path / "save") == []
    kv = big.kv
    served = big.turn(server)
    assert served["tier_before"] == "disk" and served["cache_n"] == kv, served


def test_a_full_disk_refuses_a_mind_leaving_its_slot_and_keeps_it(tmp_path: Path) -> None:
    """A mind the page store cannot hold, whose file the disk refuses (a file-size limit below
    it: EFBIG, as a full disk's ENOSPC): the switch that needed its slot answers a typed 503,
    the mind keeps its slot and its next turn finds it whole, nothing stays staged."""
    save = tmp_path / "save"
    save.mkdir()
    args = [*_args(ram_bytes=(BIG_MIB // 4) * MIB), "--slot-save-path", str(save)]
    with _file_size_limit((SMALL_TOKENS + 64) * MIB):
        server = ServerProcess(args, tmp_path / "limited.log")
    try:
        big, small = Mind("big", BIG_MIB, 1), Mind("small", SMALL_TOKENS // 4, 2)
        big.turn(server)
        body = {"prompt": small.tokens, "n_predict": 1, "mind": small.name}
        refused = server.post("/completion", body)
        assert refused.status_code == 503, refused.text
        assert "--page-ram-bytes" in refused.json()["error"]["message"]
        assert _staged(save) == []
        kv = big.kv
        served = big.turn(server)
        assert served["tier_before"] == "slot" and served["cache_n"] == kv, served
    finally:
        server.stop()


def _settled_anon(server: ServerProcess) -> int:
    """The server's anonymous memory once it has stopped moving (two readings 50 ms apart
    within 1 MiB)."""
    sampler = RssPeaks(server.proc.pid, every_s=3600)
    last = sampler.now()[0]
    while True:
        time.sleep(0.05)
        now = sampler.now()[0]
        if abs(now - last) < MIB:
            sampler.stop()
            return now
        last = now


def _written(server: ServerProcess, mind: Mind) -> bool:
    """The mind's state, as its slot holds it, is on disk."""
    (view,) = [m for m in server.client.get("/pages").json()["minds"] if m["mind"] == mind.name]
    assert view["tier"] == "slot", view
    return bool(view["on_disk"]) and view["n_tokens_on_disk"] == view["n_tokens"]
