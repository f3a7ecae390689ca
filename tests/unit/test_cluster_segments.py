"""Delta segments without Redis or a model: states in libllama's plain-KV layout, built by
hand, grown turn after turn, rebuilt from the generations' blobs; and the layouts that are
stored whole."""

from __future__ import annotations

import itertools
import struct
from dataclasses import replace

import numpy as np
import pytest

from kvswap.core.page import PageGeometry, PageLayout, plan_layout, write_tokens
from kvswap.files.seqfile import STATE_MAGIC
from kvswap.tiers.shared.kvstate import split_kv_state
from kvswap.tiers.shared.segments import (
    BlobScatter,
    GenerationWrite,
    PagePlan,
    SectionPlan,
    plan_generation,
    split_page,
    write_literals,
)

N_LAYER, K_ROW, V_EMBD, EL = 3, 24, 6, 2
MAX_CELLS = 600
GEOMETRY = PageGeometry("m", "f16", "f16", 2, 1024)
_CELLS = np.random.default_rng(1).integers(0, 256, (2 * N_LAYER, MAX_CELLS, K_ROW), dtype=np.uint8)


def kv_state(n_cells: int, v_trans: bool, n_stream: int = 1, ext: int = 0) -> bytes:
    """A single sequence's state as `llama_kv_cache::state_write` lays it out; cell i's rows are
    the same in every state, as when a sequence grows by appending."""
    out = [struct.pack("<II", STATE_MAGIC, 0), struct.pack("<I", n_stream)]
    for stream in range(n_stream):
        if stream != n_stream - 1:
            out.append(struct.pack("<I", 0))
            continue
        out.append(struct.pack("<I", n_cells))
        for i in range(n_cells):
            out.append(struct.pack("<iI", i, 1) + bytes(ext) + struct.pack("<i", 0))
        out.append(struct.pack("<II", int(v_trans), N_LAYER))
        for layer in range(N_LAYER):
            out.append(struct.pack("<iQ", 1, K_ROW) + _CELLS[layer, :n_cells].tobytes())
        for layer in range(N_LAYER):
            rows = _CELLS[N_LAYER + layer, :n_cells, : V_EMBD * EL]
            if v_trans:  # V_EMBD rows of n_cells elements
                by_channel = rows.reshape(n_cells, V_EMBD, EL).transpose(1, 0, 2)
                out.append(struct.pack("<iII", 1, EL, V_EMBD) + by_channel.tobytes())
            else:
                out.append(struct.pack("<iQ", 1, V_EMBD * EL) + rows.tobytes())
    return b"".join(out)


def page_of(n_cells: int, v_trans: bool) -> tuple[memoryview, PageLayout]:
    state = kv_state(n_cells, v_trans, n_stream=2)
    layout = plan_layout(n_cells, len(state), GEOMETRY)
    page = memoryview(bytearray(layout.n_bytes))
    write_tokens(page, layout, np.arange(n_cells, dtype=np.int32) + 5)
    page[layout.target.offset : layout.target.end] = state
    return page, layout


def rebuild(plan: PagePlan, blobs: dict[int, bytes]) -> bytes:
    out = memoryview(bytearray(plan.n_bytes))
    for gen in plan.gens():
        BlobScatter(plan, gen).scatter(out, 0, memoryview(blobs[gen]))
    write_literals(out, plan.literals)
    return out.tobytes()


def _blob(write: GenerationWrite) -> bytes:
    return b"".join(bytes(p) for p in write.blob)


@pytest.mark.parametrize("v_trans", [False, True])
def test_sections_follow_the_layer_major_layout(v_trans: bool) -> None:
    sections = split_kv_state(memoryview(kv_state(10, v_trans, n_stream=3)))
    assert sections is not None
    names = [s.name for s in sections]
    assert names == ["meta"] + [f"k.{i}" for i in range(N_LAYER)] + [
        f"v.{i}" for i in range(N_LAYER)
    ]
    v = sections[-1]
    assert (v.n_rows, v.row_bytes) == ((V_EMBD, 10 * EL) if v_trans else (1, 10 * V_EMBD * EL))
    with_ext = split_kv_state(memoryview(kv_state(10, v_trans, ext=12)))
    assert with_ext is not None and with_ext[0].row_bytes == 10 * 24


def test_other_layouts_are_not_split() -> None:
    plain = kv_state(10, False)
    assert split_kv_state(memoryview(plain + struct.pack("<I", 0))) is None  # trailing bytes
    assert split_kv_state(memoryview(plain + plain[8:])) is None  # two caches (iSWA, hybrid)
    two_streams = kv_state(10, False, n_stream=2)
    busy = bytearray(two_streams)
    busy[12:16] = struct.pack("<I", 3)  # the first stream is not empty
    assert split_kv_state(memoryview(bytes(busy))) is None
    assert split_kv_state(memoryview(b"\x00" * 64)) is None


@pytest.mark.parametrize("v_trans", [False, True])
def test_forty_appended_turns_rebuild_exactly_with_few_extents(v_trans: bool) -> None:
    blobs: dict[int, bytes] = {}
    plan: PagePlan | None = None
    n_cells, n_written, n_appended = 200, 0, 0
    rng = np.random.default_rng(3)
    for gen in range(1, 41):
        page, layout = page_of(n_cells, v_trans)
        write = plan_generation(page, split_page(page, layout), plan, gen)
        blobs[gen] = _blob(write)
        plan = write.plan
        assert rebuild(plan, blobs) == page.tobytes()
        if gen > 1:
            n_written += write.n_blob_bytes
        for sp in plan.sections:  # widths halve from left to right: O(log) extents
            widths = [e.width for e in sp.extents]
            assert all(a >= 2 * b for a, b in itertools.pairwise(widths)), widths
        grow = int(rng.integers(1, 12))
        n_appended += grow
        n_cells += grow
    page_bytes_per_cell = layout.n_bytes / (n_cells - grow)
    # each appended byte is rewritten a few times (log of the turns), the base never
    print(f"wrote {n_written / (n_appended * page_bytes_per_cell):.1f}x the appended bytes")
    assert n_written < 8 * n_appended * page_bytes_per_cell


def test_a_changed_cell_rewrites_its_sections_and_keeps_the_rest() -> None:
    page, layout = page_of(100, False)
    first = plan_generation(page, split_page(page, layout), None, 1)
    changed = bytearray(page)
    k1 = next(s for s in split_page(page, layout).sections if s.name == "target.k.1")
    changed[k1.offset + 50 * K_ROW] ^= 0xFF  # one byte of cell 50 in layer 1's K
    view = memoryview(changed)
    second = plan_generation(view, split_page(view, layout), first.plan, 2)
    rewritten = [sp.section.name for sp in second.plan.sections if sp.extents[0].gen == 2]
    assert rewritten == ["target.k.1"]
    assert rebuild(second.plan, {1: _blob(first), 2: _blob(second)}) == bytes(changed)


def test_an_extent_of_a_first_version_manifest_is_never_reused() -> None:
    """Audit A8: reuse was decided by CRC-32, so a changed extent was kept once in 2^32,
    silently (its chunks' own CRCs pass). Extents now carry a 128-bit digest; those of a
    version-1 manifest (a CRC-32 only) read back, but the next generation rewrites them."""
    page, layout = page_of(100, False)
    first = plan_generation(page, split_page(page, layout), None, 1)
    assert all(len(e.digest) == 16 for sp in first.plan.sections for e in sp.extents)
    legacy = PagePlan(
        first.plan.n_bytes,
        tuple(
            SectionPlan(sp.section, tuple(replace(e, digest=b"") for e in sp.extents))
            for sp in first.plan.sections
        ),
        first.plan.literals,
    )
    again = plan_generation(page, split_page(page, layout), legacy, 2)
    assert again.n_reused_bytes == 0 and again.n_blob_bytes == first.n_blob_bytes
    kept = plan_generation(page, split_page(page, layout), first.plan, 3)
    assert kept.n_blob_bytes == 0  # the same bytes under a digest: all reused
