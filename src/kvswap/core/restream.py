"""Rewriting the stream header of a plain KV cache's sequence state (docs/DESIGN.md, "How large a mind can grow").

libllama's KV cache writes a sequence state as

    u32 n_stream | for each stream: u32 cell_count [meta, data when cell_count > 0]

and refuses to load it into a cache with another stream count (`n_stream mismatch`). A single
sequence has cells in one stream only (its own: stream = seq id without unified KV, 0 with it),
and the reader loads a non-empty block into the destination sequence's own stream whatever its
index. So a state moves between stream counts by rewriting the header: keep the one block, put
`n_stream - 1` empty streams beside it. Without parsing the block, the block is found from the
source's stream count and its stream index (the empty streams around it are one zero word each).

Only for models whose memory is one plain KV cache: hybrid, recurrent and sliding-window
memories write several sections and are refused by the caller.

Read by the engine (a state loaded under another stream count) and by the shared tier (which
stream a page's state holds). Pure: bytes in, bytes out (one copy).
"""

from __future__ import annotations

import struct

PREFIX_BYTES = 8  # libllama's RAM-state prefix (magic, source seq id)
_U32 = struct.Struct("<I")


class RestreamError(ValueError):
    """The state is not the single-block plain-KV layout this codec rewrites."""


def stream_count(state: memoryview) -> int:
    """The stream count a state records (the payload's first word)."""
    if len(state) < PREFIX_BYTES + 4:
        raise RestreamError("the state is too short for a stream header")
    return int(_U32.unpack_from(state, PREFIX_BYTES)[0])


def find_stream(state: memoryview, n_stream: int) -> int:
    """The one stream holding cells, found from the empty streams around it."""
    payload = state[PREFIX_BYTES:]
    found = []
    for k in range(n_stream):
        tail = 4 * (n_stream - 1 - k)
        if len(payload) < 4 * (1 + n_stream) + 4:
            break
        if any(payload[4 : 4 + 4 * k]) or (tail and any(payload[len(payload) - tail :])):
            continue
        if _U32.unpack_from(payload, 4 + 4 * k)[0] != 0:
            found.append(k)
    if len(found) != 1:
        raise RestreamError("cannot tell which stream holds the sequence")
    return found[0]


def restream(state: memoryview, n_stream_from: int, stream: int, n_stream_to: int) -> bytearray:
    """A copy of `state` (prefix + payload) rewritten for a cache of `n_stream_to` streams."""
    if not 0 <= stream < n_stream_from:
        raise RestreamError(f"stream {stream} is outside 0..{n_stream_from - 1}")
    payload = state[PREFIX_BYTES:]
    if len(payload) < 4 * (1 + n_stream_from):
        raise RestreamError("the state is too short for its stream header")
    (n_stream,) = _U32.unpack_from(payload, 0)
    if n_stream != n_stream_from:
        raise RestreamError(f"the state records {n_stream} streams, not {n_stream_from}")
    before = payload[4 : 4 + 4 * stream]
    after_start = len(payload) - 4 * (n_stream_from - 1 - stream)
    block = payload[4 + 4 * stream : after_start]
    after = payload[after_start:]
    if any(before) or any(after):
        raise RestreamError("the other streams are not empty: not a single sequence's state")
    if len(block) < 4 or _U32.unpack_from(block, 0)[0] == 0:
        raise RestreamError("the sequence's stream holds no cells")
    out = bytearray(PREFIX_BYTES + 4 + len(block) + 4 * (n_stream_to - 1))
    out[:PREFIX_BYTES] = state[:PREFIX_BYTES]
    _U32.pack_into(out, PREFIX_BYTES, n_stream_to)
    out[PREFIX_BYTES + 4 : PREFIX_BYTES + 4 + len(block)] = block
    return out
