"""Real libllama sequence states made into pages, for the delta-segment tests and benchmark."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from kvswap.backend.batch import Batch
from kvswap.backend.context import Context, ContextParams
from kvswap.core.page import PageGeometry, PageLayout, plan_layout, write_tokens

UBATCH = 256


def context(model: object, n_ctx: int, flash_attn: str = "auto", n_threads: int = 1) -> Context:
    return Context(
        model,  # type: ignore[arg-type]
        ContextParams(
            n_ctx=n_ctx,
            n_seq_max=1,
            n_batch=UBATCH,
            n_ubatch=UBATCH,
            kv_unified=True,
            n_threads=n_threads,
            n_threads_batch=n_threads,
            flash_attn=flash_attn,
        ),
    )


def prompt(n_tokens: int, seed: int = 0) -> npt.NDArray[np.int32]:
    rng = np.random.default_rng(seed)
    return rng.integers(100, 40000, n_tokens).astype(np.int32)


def decode(
    ctx: Context, tokens: npt.NDArray[np.int32], pos0: int, last_logits: bool = False
) -> None:
    """Decode `tokens` at positions pos0.. in batches of UBATCH."""
    for i in range(0, len(tokens), UBATCH):
        part = tokens[i : i + UBATCH]
        batch = Batch(len(part))
        want = last_logits and i + len(part) == len(tokens)
        batch.add_span(part, pos0 + i, 0, want)
        assert ctx.decode(batch) == 0
        batch.close()


def capture(
    ctx: Context, tokens: npt.NDArray[np.int32], geometry: PageGeometry
) -> tuple[memoryview, PageLayout]:
    """The sequence's state as a page (tokens | target state), as the engine lays one out."""
    n_state = ctx.state_size(0)
    layout = plan_layout(len(tokens), n_state, geometry)
    page = memoryview(bytearray(layout.n_bytes))
    write_tokens(page, layout, tokens)
    target = layout.target
    assert ctx.state_get_into(0, page[target.offset : target.end]) == n_state
    return page, layout


def next_logits(ctx: Context, token: int, pos: int) -> npt.NDArray[np.float32]:
    batch = Batch(1)
    batch.add_span(np.array([token], dtype=np.int32), pos, 0, True)
    assert ctx.decode(batch) == 0
    out = ctx.logits(0)
    batch.close()
    return out
