"""A page cut into sections, and generations that rewrite only the sections' new columns.

A page (`core.page.PageLayout`: tokens | target state | draft state | checkpoints) is
split into **sections**, each `n_rows` rows of `row_bytes` at an offset: the tokens, every
section of the target and draft states found by `kvstate.split_kv_state` (the cells' metadata,
each layer's K and V), and each checkpoint whole. What lies between sections (state headers) is
kept as small literals. When a mind grows by appending tokens, each section of the new page
starts, row by row, with the old section's bytes:

    old section   | e0 (gen 3) | e1 (gen 7) |
    new section   | e0 (gen 3) | e1 (gen 7) | new columns (gen 9) |

A generation's plan lists, per section, the **extents** covering its columns in order, each
naming the generation whose blob holds it, where, its width and a 128-bit BLAKE2b digest of
its bytes. Planning a new generation keeps the previous plan's extents while the new page's
bytes match their digest (checked on the page, so a section that changed in any way is
rewritten, never patched; a CRC-32 here would keep a changed extent once in 2^32, silently,
since the chunks' own CRCs still pass), and
writes the remaining columns into the new generation's blob. To bound the extent count (and the
generations a page references), the new extent absorbs the trailing kept extents narrower than
twice itself, so widths at least halve from left to right: a section has O(log(row_bytes))
extents, and a byte is rewritten O(log) times, each time into an extent 1.5 times as wide. A page that is not an append (another slot's stream, a context shift, KV
recomputed) rewrites whatever changed, a full page at worst.

Owns the split, the planning and the reassembly (`scatter`). Pure: buffers in, buffers out; no
Redis, no libllama.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from kvswap.core.page import PageLayout, Span
from kvswap.tiers.shared.kvstate import split_kv_state

MAX_LITERAL_BYTES = 4096  # a gap wider than this between sections is stored as a section
DIGEST_BYTES = 16  # an extent's digest: 128 bits


@dataclass(frozen=True)
class Section:
    """`n_rows` rows of `row_bytes`, back to back from `offset` in the page."""

    name: str
    offset: int
    n_rows: int
    row_bytes: int

    @property
    def n_bytes(self) -> int:
        return self.n_rows * self.row_bytes


@dataclass(frozen=True)
class Literal:
    """Bytes between sections (state headers), stored in the manifest itself."""

    offset: int
    data: bytes


@dataclass(frozen=True)
class PageSplit:
    n_bytes: int
    sections: tuple[Section, ...]  # by offset; with the literals they tile [0, n_bytes)
    literals: tuple[Literal, ...]


@dataclass(frozen=True)
class Extent:
    """Columns of a section held in generation `gen`'s blob, row-major from `blob_offset`."""

    gen: int
    blob_offset: int
    width: int  # columns (bytes of each row) it covers
    digest: bytes  # BLAKE2b-128 of its n_rows x width bytes, row by row (b"": never reused)


@dataclass(frozen=True)
class SectionPlan:
    section: Section
    extents: tuple[Extent, ...]  # cover columns [0, row_bytes) left to right


@dataclass(frozen=True)
class PagePlan:
    """How to rebuild one generation of a page from blobs."""

    n_bytes: int
    sections: tuple[SectionPlan, ...]
    literals: tuple[Literal, ...]

    def gens(self) -> frozenset[int]:
        return frozenset(e.gen for s in self.sections for e in s.extents)


@dataclass(frozen=True)
class GenerationWrite:
    """A planned generation: its plan and the bytes of its own blob."""

    plan: PagePlan
    blob: tuple[memoryview, ...]  # the new blob, in order (views of the page where possible)
    n_blob_bytes: int
    n_reused_bytes: int  # section bytes served by older generations' blobs


def split_page(page: memoryview, layout: PageLayout) -> PageSplit:
    """Cut a page into sections and literals (the states parsed when they are plain KV)."""
    view = page.cast("B") if page.format != "B" else page
    n_bytes = layout.n_bytes
    if len(view) < n_bytes:
        raise ValueError(f"the page buffer has {len(view)} bytes, its layout {n_bytes}")
    sections: list[Section] = []
    _add_span(sections, "tokens", layout.tokens)
    _add_state(sections, view, "target", layout.target)
    if layout.draft is not None:
        _add_state(sections, view, "draft", layout.draft)
    for i, ckpt in enumerate(layout.checkpoints):
        _add_span(sections, f"ckpt.{i}", ckpt.span)
    sections.sort(key=lambda s: s.offset)
    literals: list[Literal] = []
    out: list[Section] = []
    cursor = 0
    for section in [*sections, Section("end", n_bytes, 1, 0)]:
        if section.offset < cursor:
            raise ValueError(f"section {section.name} overlaps the one before it")
        gap = section.offset - cursor
        if gap > MAX_LITERAL_BYTES:
            out.append(Section(f"gap.{len(out)}", cursor, 1, gap))
        elif gap:
            literals.append(Literal(cursor, bytes(view[cursor : section.offset])))
        if section.name != "end":
            out.append(section)
        cursor = section.offset + section.n_bytes
    return PageSplit(n_bytes, tuple(out), tuple(literals))


def _add_span(out: list[Section], name: str, span: Span) -> None:
    if span.n_bytes:
        out.append(Section(name, span.offset, 1, span.n_bytes))


def _add_state(out: list[Section], view: memoryview, name: str, span: Span) -> None:
    if not span.n_bytes:
        return
    parsed = split_kv_state(view[span.offset : span.end])
    if parsed is None:
        out.append(Section(name, span.offset, 1, span.n_bytes))
        return
    for s in parsed:
        if s.n_bytes:
            out.append(Section(f"{name}.{s.name}", span.offset + s.offset, s.n_rows, s.row_bytes))


def region_digest(page: memoryview, section: Section, col: int, width: int) -> bytes:
    """BLAKE2b-128 of columns [col, col + width) of every row, row by row."""
    h = hashlib.blake2b(digest_size=DIGEST_BYTES)
    for row in range(section.n_rows):
        start = section.offset + row * section.row_bytes + col
        h.update(page[start : start + width])
    return h.digest()


def region_bytes(page: memoryview, section: Section, col: int, width: int) -> memoryview:
    """Columns [col, col + width) of every row, row-major: a view when one row, else a copy."""
    if section.n_rows == 1:
        start = section.offset + col
        return page[start : start + width]
    rows = np.frombuffer(page, np.uint8, section.n_bytes, section.offset)
    block = rows.reshape(section.n_rows, section.row_bytes)[:, col : col + width]
    return np.ascontiguousarray(block).data.cast("B")


def plan_generation(
    page: memoryview, split: PageSplit, previous: PagePlan | None, gen: int
) -> GenerationWrite:
    """Plan generation `gen` of the page, reusing `previous`'s extents where bytes match."""
    view = page.cast("B") if page.format != "B" else page
    before = {s.section.name: s for s in previous.sections} if previous is not None else {}
    plans: list[SectionPlan] = []
    blob: list[memoryview] = []
    n_blob = 0
    n_reused = 0
    for section in split.sections:
        kept = list(_matching_prefix(view, section, before.get(section.name)))
        col = sum(e.width for e in kept)
        width = section.row_bytes - col
        # keep widths halving from left to right: the new extent absorbs kept extents
        # narrower than twice itself (O(log) extents, each byte rewritten O(log) times)
        while kept and width and kept[-1].width < 2 * width:
            dropped = kept.pop()
            col -= dropped.width
            width += dropped.width
        if width:
            data = region_bytes(view, section, col, width)
            digest = hashlib.blake2b(data, digest_size=DIGEST_BYTES).digest()
            kept.append(Extent(gen, n_blob, width, digest))
            blob.append(data)
            n_blob += len(data)
        n_reused += sum(e.width for e in kept if e.gen != gen) * section.n_rows
        plans.append(SectionPlan(section, tuple(kept)))
    plan = PagePlan(split.n_bytes, tuple(plans), split.literals)
    return GenerationWrite(plan, tuple(blob), n_blob, n_reused)


def _matching_prefix(
    view: memoryview, section: Section, before: SectionPlan | None
) -> Iterator[Extent]:
    """The previous extents, left to right, while the new page's bytes still match them."""
    if before is None or before.section.n_rows != section.n_rows:
        return
    col = 0
    for extent in before.extents:
        if col + extent.width > section.row_bytes:
            return
        if not extent.digest or region_digest(view, section, col, extent.width) != extent.digest:
            return
        yield extent
        col += extent.width


@dataclass(frozen=True)
class _Target:
    """Where one extent's blob bytes go in the page."""

    blob_offset: int
    n_bytes: int
    dst: int  # page offset of the extent's first byte (row 0)
    width: int
    stride: int  # the section's row_bytes


class BlobScatter:
    """Copies a generation's blob, chunk by chunk, into the page its extents describe.

    Chunks may arrive in any order and from several threads: every blob byte lands in one
    place of the page, and distinct chunks never write the same bytes.
    """

    def __init__(self, plan: PagePlan, gen: int) -> None:
        targets = []
        for sp in plan.sections:
            col = 0
            for e in sp.extents:
                if e.gen == gen:
                    dst = sp.section.offset + col
                    n = e.width * sp.section.n_rows
                    targets.append(_Target(e.blob_offset, n, dst, e.width, sp.section.row_bytes))
                col += e.width
        self._targets = sorted(targets, key=lambda t: t.blob_offset)
        self._starts = [t.blob_offset for t in self._targets]

    def scatter(self, page: memoryview, blob_pos: int, data: memoryview) -> None:
        """Copy `data`, found at `blob_pos` in the blob, to its places in `page`."""
        end = blob_pos + len(data)
        first = max(0, int(np.searchsorted(self._starts, blob_pos, side="right")) - 1)
        for t in self._targets[first:]:
            if t.blob_offset >= end:
                break
            lo = max(blob_pos, t.blob_offset)
            hi = min(end, t.blob_offset + t.n_bytes)
            if lo < hi:
                _copy_rows(page, t, lo - t.blob_offset, data[lo - blob_pos : hi - blob_pos])


def _copy_rows(page: memoryview, t: _Target, local: int, data: memoryview) -> None:
    if t.width == t.stride:  # one row, or full rows: contiguous in the page too
        page[t.dst + local : t.dst + local + len(data)] = data
        return
    done = 0
    while done < len(data):
        row, col = divmod(local + done, t.width)
        take = min(t.width - col, len(data) - done)
        start = t.dst + row * t.stride + col
        page[start : start + take] = data[done : done + take]
        done += take


def write_literals(page: memoryview, literals: Sequence[Literal]) -> None:
    for lit in literals:
        page[lit.offset : lit.offset + len(lit.data)] = lit.data
