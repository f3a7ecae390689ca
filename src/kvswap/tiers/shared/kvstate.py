"""Where the cells' rows lie in libllama's sequence state of a plain KV cache.

`llama_state_seq_get_data` for one sequence of a plain KV cache writes (llama-kv-cache.cpp,
`state_write`, `state_write_meta`, `state_write_data`; all little-endian):

    u32 magic 0xaf143cd8 | u32 source seq id                        (the RAM-state prefix)
    u32 n_stream
    per stream: u32 cell_count, and when cell_count > 0:
        cell_count x meta  = i32 pos | u32 n_seq_id (1) | [12-byte ext: M-RoPE, n-gram] | i32 seq
        u32 v_trans | u32 n_layer
        n_layer x  (i32 k_type | u64 k_row | cell_count x k_row bytes)
        v_trans == 0: per layer with V: (i32 v_type | u64 v_row | cell_count x v_row bytes)
        v_trans == 1: per layer with V: (i32 v_type | u32 el | u32 n_embd_v |
                                         n_embd_v rows x (cell_count x el bytes))

so the state is layer-major: each section (the cells' metadata, each layer's K, each layer's V)
holds `n_rows` rows whose length grows with the cell count (one row, except the transposed V
with one row per embedding channel). When a sequence grows by appending cells, every section of
the old state is a prefix of the same section's rows in the new one: `segments` stores rows by
column range and rewrites only the new columns.

`split_kv_state` finds the sections, or returns None for any other layout: several non-empty
streams, hybrid/recurrent memory and iSWA (two caches written back to back) do not parse to the
exact end and are stored whole. Whether cells carry the 12-byte extension depends on the model;
both readings are tried and exactly one must consume the block. Headers only are read; pure.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Final

import numpy as np

from kvswap.files.seqfile import STATE_MAGIC, STATE_PREFIX_BYTES

CELL_EXT_BYTES: Final = 12  # llama_kv_cell_ext: x, y, tok
_MAX_STREAMS: Final = 4096
_MAX_LAYERS: Final = 4096
_MAX_GGML_TYPE: Final = 64
_U32 = struct.Struct("<I")
_I32_U64 = struct.Struct("<iQ")
_I32_U32_U32 = struct.Struct("<iII")


@dataclass(frozen=True)
class StateSection:
    """Rows of a state: `n_rows` rows of `row_bytes`, back to back from `offset`."""

    name: str  # "meta", "k.<layer>", "v.<i>" (i counts layers that have V)
    offset: int  # bytes from the start of the state (prefix included)
    n_rows: int
    row_bytes: int

    @property
    def n_bytes(self) -> int:
        return self.n_rows * self.row_bytes


class _Malformed(Exception):
    pass


def split_kv_state(state: memoryview) -> tuple[StateSection, ...] | None:
    """The sections of a single sequence's plain-KV state, or None for any other layout."""
    view = state.cast("B") if state.format != "B" else state
    n = len(view)
    if n < STATE_PREFIX_BYTES + 8 or _U32.unpack_from(view, 0)[0] != STATE_MAGIC:
        return None
    n_stream = _U32.unpack_from(view, STATE_PREFIX_BYTES)[0]
    if not 0 < n_stream <= _MAX_STREAMS:
        return None
    pos = STATE_PREFIX_BYTES + 4
    for stream in range(n_stream):
        if pos + 4 > n:
            return None
        n_cells = _U32.unpack_from(view, pos)[0]
        pos += 4
        if n_cells == 0:
            continue
        # The one non-empty stream; the streams after it must be empty (one zero word each).
        end = n - 4 * (n_stream - 1 - stream)
        if end < pos or any(view[end:]):
            return None
        readings = []
        for ext in (0, CELL_EXT_BYTES):
            try:
                readings.append(_block_sections(view, pos, end, n_cells, ext))
            except _Malformed:
                continue
        return readings[0] if len(readings) == 1 else None
    return None  # no cells at all


def _block_sections(
    view: memoryview, pos: int, end: int, n_cells: int, ext: int
) -> tuple[StateSection, ...]:
    meta_row = 4 + 4 + ext + 4  # pos, n_seq_id == 1, ext, the one seq id
    meta_bytes = n_cells * meta_row
    if pos + meta_bytes + 8 > end:
        raise _Malformed
    words = np.frombuffer(view, dtype="<i4", count=meta_bytes // 4, offset=pos)
    if not np.all(words.reshape(n_cells, meta_row // 4)[:, 1] == 1):
        raise _Malformed
    sections = [StateSection("meta", pos, 1, meta_bytes)]
    pos += meta_bytes
    v_trans, n_layer = struct.unpack_from("<II", view, pos)
    pos += 8
    if v_trans > 1 or not 0 < n_layer <= _MAX_LAYERS:
        raise _Malformed
    for layer in range(n_layer):
        pos = _row_section(view, pos, end, n_cells, f"k.{layer}", sections)
    n_v = 0
    while pos < end:
        if n_v == n_layer:
            raise _Malformed
        if v_trans:
            pos = _transposed_section(view, pos, end, n_cells, f"v.{n_v}", sections)
        else:
            pos = _row_section(view, pos, end, n_cells, f"v.{n_v}", sections)
        n_v += 1
    if pos != end:
        raise _Malformed
    return tuple(sections)


def _row_section(
    view: memoryview, pos: int, end: int, n_cells: int, name: str, out: list[StateSection]
) -> int:
    if pos + _I32_U64.size > end:
        raise _Malformed
    type_id, row = _I32_U64.unpack_from(view, pos)
    pos += _I32_U64.size
    if not 0 <= type_id < _MAX_GGML_TYPE or row == 0 or pos + n_cells * row > end:
        raise _Malformed
    out.append(StateSection(name, pos, 1, n_cells * row))
    return pos + n_cells * row


def _transposed_section(
    view: memoryview, pos: int, end: int, n_cells: int, name: str, out: list[StateSection]
) -> int:
    if pos + _I32_U32_U32.size > end:
        raise _Malformed
    type_id, el, n_embd = _I32_U32_U32.unpack_from(view, pos)
    pos += _I32_U32_U32.size
    row = n_cells * el
    if not 0 <= type_id < _MAX_GGML_TYPE or el == 0 or n_embd == 0 or pos + n_embd * row > end:
        raise _Malformed
    out.append(StateSection(name, pos, n_embd, row))
    return pos + n_embd * row
