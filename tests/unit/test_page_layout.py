"""A page's layout: its parts back to back, and the token count it reports."""

from __future__ import annotations

import pytest

from kvswap.core.page import TOKEN_BYTES, PageGeometry, plan_layout

pytestmark = pytest.mark.timeout(30)

GEOMETRY = PageGeometry("model", "f16", "f16", n_stream=1, n_ctx_slot=1024)


def test_checkpoints_do_not_change_the_pages_token_count() -> None:
    """A hybrid slot of 45 tokens with checkpoints after 20 and 36 is a page of 45 tokens (the
    count a save's `n_saved`, a page_out and /pages report), not of its last checkpoint's."""
    layout = plan_layout(45, 1000, GEOMETRY, checkpoints=((20, 0, 19, 64), (36, 0, 35, 64)))
    assert layout.n_tokens == 45
    assert layout.tokens.n_bytes == 45 * TOKEN_BYTES
    assert [c.n_tokens for c in layout.checkpoints] == [20, 36]
    assert [c.span.offset for c in layout.checkpoints] == [
        45 * TOKEN_BYTES + 1000,
        45 * TOKEN_BYTES + 1064,
    ]
    assert layout.n_bytes == 45 * TOKEN_BYTES + 1000 + 128
