"""Delta segments on real libllama states: a grown state is rebuilt byte for byte from the
older generation's chunks plus its new columns, loads, and continues exactly; a state that
did not grow by appending is rewritten; a 4k-token state growing by 32 tokens writes <= 5%."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import redis

from kvswap.core.keys import mind_key
from kvswap.core.page import PageGeometry, PageLayout
from kvswap.tiers.shared.keys import MindKeys
from kvswap.tiers.shared.kvstate import split_kv_state
from kvswap.tiers.shared.lease import Lease, Leases
from kvswap.tiers.shared.store import Fetched, SharedStore
from kvswap.tiny import tiny_model_path
from kvswap.tiny.presets import realistic_kv_params
from tests.cluster.states import capture, context, decode, next_logits, prompt
from tests.cluster.util import incarnation

pytestmark = [pytest.mark.model, pytest.mark.timeout(300)]
MIND_KEY = mind_key("public", "grow")
MIND = MindKeys.of(MIND_KEY)
GEOMETRY = PageGeometry("sha256:smollm2", "f16", "f16", 1, 1024)


def _lease(client: redis.Redis) -> Lease:
    got = Leases(client, incarnation("r1"), ttl_ms=60_000).acquire(MIND)
    assert isinstance(got, Lease)
    return got


def _fetch(store: SharedStore) -> Fetched:
    got = store.fetch(MIND, fingerprint=GEOMETRY.file_fingerprint())
    assert isinstance(got, Fetched), got
    return got


def _state(page: memoryview, layout: PageLayout) -> memoryview:
    return page[layout.target.offset : layout.target.end]


@pytest.mark.parametrize("flash_attn", ["on", "off"])  # V in rows / V transposed
def test_a_grown_state_is_rebuilt_from_segments(
    smollm2: object, rclient: redis.Redis, make_store: Callable[..., SharedStore], flash_attn: str
) -> None:
    ctx = context(smollm2, 1024, flash_attn)
    fresh = context(smollm2, 1024, flash_attn)
    try:
        tokens = prompt(300 + 32)
        decode(ctx, tokens[:300], 0)
        page_a, layout_a = capture(ctx, tokens[:300], GEOMETRY)
        sections = split_kv_state(_state(page_a, layout_a))
        assert sections is not None
        v_rows = {s.n_rows for s in sections if s.name.startswith("v.")}
        assert v_rows == ({1} if flash_attn == "on" else {64 * 3})  # 3 KV heads of 64
        writer = make_store(chunk_bytes=1 << 20)
        lease = _lease(rclient)
        first = writer.publish(lease, MIND_KEY, page_a, layout_a)
        assert not first.delta and first.n_bytes_written >= layout_a.target.n_bytes
        decode(ctx, tokens[300:], 300)
        page_b, layout_b = capture(ctx, tokens, GEOMETRY)
        second = writer.publish(lease, MIND_KEY, page_b, layout_b)
        assert second.delta
        new_share = 32 / 332
        assert second.n_bytes_written <= 1.05 * new_share * layout_b.n_bytes
        assert second.n_bytes_written + second.n_bytes_reused == layout_b.n_bytes - sum(
            len(lit.data)
            for lit in _fetch(writer).manifest.plan.literals  # type: ignore[union-attr]
        )
        got = _fetch(make_store(replica_id="r2"))
        assert got.page.tobytes() == page_b.tobytes()
        assert fresh.state_set_from(0, _state(got.page, got.layout))
        assert fresh.seq_pos_max(0) == 331
        np.testing.assert_array_equal(next_logits(fresh, 42, 332), next_logits(ctx, 42, 332))
    finally:
        ctx.close()
        fresh.close()


def test_a_state_that_did_not_grow_by_appending_is_rewritten(
    smollm2: object, rclient: redis.Redis, make_store: Callable[..., SharedStore]
) -> None:
    ctx = context(smollm2, 1024)
    fresh = context(smollm2, 1024)
    try:
        tokens = prompt(300)
        decode(ctx, tokens, 0)
        store = make_store()
        lease = _lease(rclient)
        store.publish(lease, MIND_KEY, *capture(ctx, tokens, GEOMETRY))
        assert ctx.seq_rm(0, 200)  # the conversation was edited after token 200
        other = np.concatenate([tokens[:200], prompt(150, seed=9)])
        decode(ctx, other[200:], 200)
        page, layout = capture(ctx, other, GEOMETRY)
        receipt = store.publish(lease, MIND_KEY, page, layout)
        got = _fetch(store)
        assert got.page.tobytes() == page.tobytes() and got.manifest.plan is not None
        # every K and V row is rewritten; only bytes that are still equal are reused: the
        # cells' metadata (positions 0-299 did not move) and the token prefix
        for sp in got.manifest.plan.sections:
            if ".k." in sp.section.name or ".v." in sp.section.name:
                assert [e.gen for e in sp.extents] == [receipt.gen], sp.section.name
        assert receipt.n_bytes_reused <= 300 * 12 + 200 * 4
        assert fresh.state_set_from(0, _state(got.page, got.layout))
        np.testing.assert_array_equal(next_logits(fresh, 7, 350), next_logits(ctx, 7, 350))
    finally:
        ctx.close()
        fresh.close()


def test_a_4k_state_growing_by_32_tokens_writes_under_5_percent(
    rclient: redis.Redis, make_store: Callable[..., SharedStore]
) -> None:
    """On a tiny model with SmolLM2-135M's KV geometry (30 layers, 3 KV heads of 64: its state
    has exactly SmolLM2's bytes and layout), where a 4k prefill takes seconds, not minutes."""
    from kvswap.backend.model import Model

    model = Model.load(
        tiny_model_path("llama", vocab="smollm2", **realistic_kv_params("smollm2-135m"))
    )
    ctx = context(model, 4096 + 256)
    try:
        tokens = prompt(4096 + 32)
        decode(ctx, tokens[:4096], 0)
        store = make_store()
        lease = _lease(rclient)
        page_a, layout_a = capture(ctx, tokens[:4096], GEOMETRY)
        assert layout_a.target.n_bytes == 94_421_736  # SmolLM2-135M's 4096-token state, f16
        store.publish(lease, MIND_KEY, page_a, layout_a)
        decode(ctx, tokens[4096:], 4096)
        page_b, layout_b = capture(ctx, tokens, GEOMETRY)
        receipt = store.publish(lease, MIND_KEY, page_b, layout_b)
        written = receipt.n_bytes_written + receipt.n_bytes_manifest
        print(
            f"4096+32 tokens: wrote {written} of {layout_b.n_bytes} B ({written / layout_b.n_bytes:.2%})"
        )
        assert written <= 0.05 * layout_b.n_bytes
        assert _fetch(store).page.tobytes() == page_b.tobytes()
    finally:
        ctx.close()
        model.close()
