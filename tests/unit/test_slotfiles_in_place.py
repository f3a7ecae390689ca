"""A mind written to disk in place (`tiers.slotfiles.open_in_place`, `publish_in_place`): the
slot's capture goes straight into the staged file's mapping, and the generation published is
the same, file for file and byte for byte, as the one written from a RAM page; a disk that
refuses the file's blocks refuses at opening, and a generation dropped leaves nothing staged."""

from __future__ import annotations

import errno
import os
import resource
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

from kvswap.core.page import PageGeometry, PageLayout, plan_layout, write_tokens
from kvswap.files import FilesIOError, Publisher
from kvswap.files.seqfile import write_state_prefix
from kvswap.tiers.slotfiles import open_in_place, page_of, publish_in_place, publish_state

GEOMETRY = PageGeometry("model", "f16", "f16", n_stream=1, n_ctx_slot=4096)
N_TOKENS = 300


def _layout() -> PageLayout:
    # a target state, a draft state and two checkpoints, as a speculating hybrid's slot has
    checkpoints = ((100, 0, 99, 4096), (200, 0, 199, 8192))
    return plan_layout(N_TOKENS, 3 << 20, GEOMETRY, draft_bytes=65536, checkpoints=checkpoints,
                       draft_n_tokens=N_TOKENS)  # fmt: skip


def _capture(page: memoryview, layout: PageLayout) -> None:
    """What a slot's capture writes: its tokens, then each state (with the RAM prefix)."""
    write_tokens(page, layout, np.arange(7, 7 + N_TOKENS, dtype=np.int32))
    rng = np.random.default_rng(5)
    spans = [layout.target, layout.draft, *(c.span for c in layout.checkpoints)]
    for span in spans:
        assert span is not None
        page[span.offset : span.end] = rng.integers(0, 256, span.n_bytes, dtype=np.uint8).tobytes()
        write_state_prefix(page[span.offset : span.end])


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


def test_a_generation_written_in_place_is_the_one_written_from_ram(tmp_path: Path) -> None:
    layout = _layout()
    ram = bytearray(layout.n_bytes)
    _capture(memoryview(ram), layout)
    (tmp_path / "ram").mkdir()
    (tmp_path / "in-place").mkdir()
    with Publisher(tmp_path / "ram") as publisher:
        publish_state(publisher, "mind", ram, layout)
    with Publisher(tmp_path / "in-place") as publisher:
        staged = open_in_place(publisher, "mind", layout)
        with page_of(staged) as page:
            _capture(page, layout)
        receipt = publish_in_place(publisher, staged, layout)
        assert staged.buffer.closed and staged.fd == -1
    written = _files(tmp_path / "in-place")
    assert set(written) == {"mind", "mind.ckpt", "mind.dft"}
    assert written == _files(tmp_path / "ram")
    assert receipt.n_bytes == sum(len(b) for b in written.values())
    assert not list((tmp_path / "in-place" / ".kvswap" / "stage").iterdir())


def test_a_generation_dropped_before_publishing_leaves_nothing(tmp_path: Path) -> None:
    with Publisher(tmp_path) as publisher:
        staged = open_in_place(publisher, "mind", _layout())
        publisher.cancel_in_place(staged)
        assert publisher.list_generations() == []
    assert not list((tmp_path / ".kvswap" / "stage").iterdir())
    assert [p.name for p in tmp_path.iterdir()] == [".kvswap"]


@contextmanager
def _file_size_limit(n_bytes: int) -> Iterator[None]:
    """A file-size limit on this process: the kernel refuses blocks past it (EFBIG), as a full
    disk refuses them (ENOSPC)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    old = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (n_bytes, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, old)


def test_a_disk_that_refuses_the_blocks_refuses_at_opening(tmp_path: Path) -> None:
    with Publisher(tmp_path) as publisher:
        with _file_size_limit(1 << 20), pytest.raises(FilesIOError) as err:
            open_in_place(publisher, "mind", _layout())
        assert err.value.errno == errno.EFBIG
        assert publisher.list_generations() == []
    assert not list((tmp_path / ".kvswap" / "stage").iterdir())
    assert os.listdir(tmp_path) == [".kvswap"]


def test_the_slots_copy_into_an_opened_file_takes_no_page_fault(tmp_path: Path) -> None:
    """Defect caught: the engine's copy of a 780 MiB slot into the mapping of the file it leaves
    for faulted every page-cache page in itself (240-1,490 ms on the engine thread, while the
    switch waited, against a 69 ms memcpy). The file's pages are faulted in writable when it is
    opened (on the demoter's thread), so the capture faults none of them."""
    layout = _layout()
    data = np.random.default_rng(9).integers(0, 256, layout.n_bytes, dtype=np.uint8).tobytes()
    with Publisher(tmp_path) as publisher:
        staged = open_in_place(publisher, "mind", layout)
        with page_of(staged) as page:
            before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
            page[:] = data[: len(page)]
            faults = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - before
        publisher.cancel_in_place(staged)
    n_pages = layout.n_bytes // os.sysconf("SC_PAGE_SIZE")
    assert faults < n_pages // 20, f"{faults} faults copying {n_pages} pages"
