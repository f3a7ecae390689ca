"""The stream-header codec: a state moves between KV layouts with other stream counts and
continues exactly as it would have."""

from __future__ import annotations

import numpy as np
import pytest

from kvswap.backend.batch import Batch
from kvswap.backend.context import Context, ContextParams
from kvswap.core.restream import RestreamError, restream

pytestmark = pytest.mark.model

PROMPT = np.arange(1000, 1120, dtype=np.int32)


def _ctx(model, n_seq: int, unified: bool) -> Context:  # type: ignore[no-untyped-def]
    return Context(
        model,
        ContextParams(
            n_ctx=1024,
            n_seq_max=n_seq,
            n_batch=256,
            n_ubatch=128,
            kv_unified=unified,
            n_threads=2,
            n_threads_batch=2,
            flash_attn="off",
        ),
    )


def _next_logits(ctx: Context, seq: int) -> np.ndarray:
    batch = Batch(4)
    batch.add_span(np.array([77], dtype=np.int32), len(PROMPT), seq, True)
    assert ctx.decode(batch) == 0
    out = ctx.logits(0)
    batch.close()
    return out


@pytest.mark.parametrize(
    ("src", "dst"),
    [((4, False, 2), (1, True, 0)), ((1, True, 0), (3, False, 2)), ((4, False, 3), (2, False, 1))],
)
def test_a_restreamed_state_continues_exactly(smollm2, src, dst) -> None:  # type: ignore[no-untyped-def]
    n_from, unified_from, seq_from = src
    n_to, unified_to, seq_to = dst
    a = _ctx(smollm2, n_from, unified_from)
    b = _ctx(smollm2, n_to, unified_to)
    try:
        batch = Batch(len(PROMPT))
        batch.add_span(PROMPT, 0, seq_from, False)
        assert a.decode(batch) == 0
        batch.close()
        size = a.state_size(seq_from)
        state = bytearray(size)
        assert a.state_get_into(seq_from, state) == size
        streams_from = 1 if unified_from else n_from
        streams_to = 1 if unified_to else n_to
        if streams_from != streams_to:
            assert not b.state_set_from(seq_to, state)  # libllama refuses the other stream count
        moved = restream(
            memoryview(state), streams_from, 0 if unified_from else seq_from, streams_to
        )
        assert b.state_set_from(seq_to, moved)
        assert b.seq_pos_max(seq_to) == len(PROMPT) - 1
        np.testing.assert_array_equal(_next_logits(b, seq_to), _next_logits(a, seq_from))
    finally:
        a.close()
        b.close()


def test_restream_refuses_what_it_cannot_rewrite() -> None:
    prefix = bytes(8)
    with pytest.raises(RestreamError):
        restream(
            memoryview(prefix + (3).to_bytes(4, "little") + bytes(12)), 4, 1, 1
        )  # stream count differs
    with pytest.raises(RestreamError):
        restream(memoryview(prefix + (2).to_bytes(4, "little") + bytes(8)), 2, 0, 1)  # no cells
    two_blocks = (
        prefix
        + (2).to_bytes(4, "little")
        + (1).to_bytes(4, "little")
        + b"x" * 8
        + (1).to_bytes(4, "little")
    )
    with pytest.raises(RestreamError):
        restream(memoryview(two_blocks), 2, 0, 1)
