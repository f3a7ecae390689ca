"""A live reconfigure (`engine.reconfigure.Reconfigurer`) on the CPU: the plan carried out, the
rollback when libllama cannot build the new geometry, and every refusal that changes nothing.

The reconfigurer works on the engine side's real owners (`standins`: page store, slot table,
mind registry, anonymous cache) and a stand-in runtime whose rebuild succeeds or raises
`ContextInitError` as libllama would; slot states are their tokens, so a state moved to the
wrong slot, lost, or left behind in the store shows at once. No libllama, no threads.
"""

from __future__ import annotations

import numpy as np

from kvswap.backend.info import ModelInfo
from kvswap.core.errors import ErrorKind, KvswapError
from kvswap.core.keys import PageKey, PageKind, mind_key
from kvswap.engine.commands import Reconfigure, ReconfigureReceipt
from kvswap.engine.plan.geometry import Geometry, ReconfigureSpec
from kvswap.engine.reconfigure import Finished, Reconfigurer
from kvswap.engine.seats.anoncache import BLOCK_TOKENS
from tests.unit.standins import NS, EngineSide, engine_side, page_tokens, put_page, tokens

INFO = ModelInfo(
    path="model.gguf",
    fingerprint="model",
    desc="a stand-in",
    n_ctx_train=8192,
    n_embd=64,
    n_layer=2,
    n_head=0,
    n_head_kv=0,
    n_params=0,
    size_bytes=0,
    n_vocab=1000,
    n_swa=0,
    is_recurrent=False,
    is_hybrid=False,
    chat_template=None,
    architecture="llama",
    ftype="F16",
    vocab_type=1,
)  # fmt: skip  (n_head 0: the memory check counts no KV)


class _Running:
    """A request running on a slot (the reconfigurer only moves it, never runs it)."""


def _m(name: str) -> PageKey:
    return mind_key(NS, name)


def _setup(
    n_slots: int = 3, ceiling_bytes: int = 1 << 20, kv_unified: bool = False
) -> tuple[EngineSide, Reconfigurer]:
    side = engine_side(
        n_slots=n_slots, n_ctx=1024 * n_slots, ceiling_bytes=ceiling_bytes, kv_unified=kv_unified
    )
    reconfigurer = Reconfigurer(
        runtime=side.runtime,
        slots=side.slots,
        store=side.store,
        model_info=INFO,
        registry=side.registry,
        anon=side.anon,
        buffers=side.worker,  # type: ignore[arg-type]
    )
    return side, reconfigurer


def _ask(r: Reconfigurer, spec: ReconfigureSpec) -> list[object]:
    replies: list[object] = []
    r.submit(Reconfigure(1, spec, replies.append))
    return replies


def _finish(r: Reconfigurer, n_ticks: int = 2) -> Finished:
    """Tick as the engine does between steps: the first tick has the moves' buffers mapped
    (the worker maps at once here), the next one runs the pause."""
    for _ in range(n_ticks - 1):
        assert r.tick(captures_pending=False) is None
    finished = r.tick(captures_pending=False)
    assert finished is not None
    return finished


def _running(side: EngineSide, slot_id: int, n_tokens: int, start: int) -> _Running:
    run = _Running()
    slot = side.slots[slot_id]
    slot.tokens.replace(np.array(tokens(n_tokens, start), dtype=np.int32))
    slot.running = run  # type: ignore[assignment]
    return run


def _fates(receipt: ReconfigureReceipt) -> dict[int, tuple[int | None, str]]:
    return {f.old_slot: (f.new_slot, f.fate) for f in receipt.slots}


def test_the_plan_moves_running_requests_first_and_the_mind_follows_its_state() -> None:
    """Decision (plan_seats, carried out): fewer slots, so the request on slot 2 takes the
    lowest free seat and the idle mind of slot 0 moves to the next; the request keeps running
    on its new slot with its exact tokens, and the registry says where the mind is now (a stale
    entry would send its next turn to another mind's slot)."""
    side, r = _setup()
    ann = _m("ann")
    side.seated(0, ann, 30, start=100)
    run = _running(side, 2, 20, start=500)
    assert _ask(r, ReconfigureSpec(n_parallel=2)) == [] and not r.admission_open
    finished = _finish(r)
    assert finished.changed and isinstance(finished.result, ReconfigureReceipt)
    assert _fates(finished.result) == {2: (0, "moved"), 0: (1, "moved")}
    assert side.slots[0].running is run
    assert side.slots[0].tokens.view().tolist() == tokens(20, 500)
    assert side.slots[1].mind == ann and side.slots[1].tokens.view().tolist() == tokens(30, 100)
    assert side.registry.residents() == {ann: 1}
    assert side.store.n_pages == 0 and side.store.reservations() == []
    assert len(side.slots) == 2 and side.runtime.geometry.n_parallel == 2
    assert r.admission_open and r.total == 1
    side.check()


def test_what_finds_no_seat_stays_findable() -> None:
    """Decision: with one seat left the running request keeps it; the idle mind stays its own
    RAM page (its next turn pages it in) and the idle anonymous prompt joins the anonymous
    cache, where a later prompt finds it."""
    side, r = _setup()
    side.with_cache(-1)
    ann = _m("ann")
    _running(side, 0, 10, start=0)
    side.seated(1, ann, 40, start=100)
    anon = tokens(BLOCK_TOKENS * 2, start=700)
    side.slots[2].tokens.replace(np.array(anon, dtype=np.int32))
    side.slots[2].namespace = "kb"  # the tenant whose prompt it is stays its owner
    _ask(r, ReconfigureSpec(n_parallel=1))
    finished = _finish(r)
    assert isinstance(finished.result, ReconfigureReceipt)
    assert _fates(finished.result) == {0: (0, "kept"), 1: (None, "paged"), 2: (None, "cached")}
    assert page_tokens(side.store, ann) == tokens(40, 100)
    assert side.registry.residents() == {}
    prompt = np.array([*anon, 1], dtype=np.int32)
    best = side.anon.best(prompt, "kb")
    assert best is not None and best[1] == len(anon)
    assert side.anon.best(prompt, "ka") is None
    side.check()


def test_a_geometry_libllama_cannot_build_rolls_back_with_every_state_in_place() -> None:
    """Defect caught: a failed rebuild leaving the server without its contexts or its states.
    The old geometry is built again and every state goes back to its own slot; the answer is a
    typed 400 carrying the receipt, and nothing is left in the page store."""
    side, r = _setup()
    ann = _m("ann")
    side.seated(0, ann, 30, start=100)
    run = _running(side, 2, 20, start=500)
    old = side.runtime.geometry
    target = Geometry(**{**vars(old), "n_parallel": 2, "n_ctx": old.n_ctx, "generation": 1})
    side.runtime.refuse.add(target)
    _ask(r, ReconfigureSpec(n_parallel=2))
    finished = _finish(r)
    err = finished.result
    assert isinstance(err, KvswapError) and err.kind is ErrorKind.INVALID_REQUEST
    assert "rolled back" in err.message and "cannot build" in err.message
    receipt = err.extra["receipt"]
    assert isinstance(receipt, ReconfigureReceipt) and receipt.rolled_back
    assert _fates(receipt) == {0: (0, "kept"), 2: (2, "kept")}
    assert finished.changed and side.runtime.geometry == old and len(side.slots) == 3
    assert side.slots[2].running is run and side.slots[2].tokens.view().tolist() == tokens(20, 500)
    assert side.slots[0].mind == ann and side.registry.residents() == {ann: 0}
    assert side.store.n_pages == 0 and side.store.reservations() == []
    assert r.failed_total == 1 and r.admission_open
    side.check()


def test_a_store_that_cannot_hold_the_moves_refuses_before_anything_changes() -> None:
    """Decision: the moves' buffers are reserved before the pause; a page store that cannot
    hold them refuses the reconfigure (a typed 503 naming --page-ram-bytes) with every slot as
    it was and the contexts never closed."""
    side, r = _setup(ceiling_bytes=6000)
    side.seated(0, _m("ann"), 300)
    side.seated(1, _m("bob"), 300)
    _ask(r, ReconfigureSpec(n_parallel=2))
    finished = r.tick(captures_pending=False)
    assert finished is not None and not finished.changed
    err = finished.result
    assert isinstance(err, KvswapError) and err.kind is ErrorKind.UNAVAILABLE
    assert "--page-ram-bytes 6000" in err.message and "nothing changed" in err.message
    assert side.runtime.installed == [] and side.runtime.n_closed == 0
    assert [len(s.tokens) for s in side.slots] == [300, 300, 0]
    assert side.store.reservations() == [] and r.admission_open
    side.check()


def test_requests_past_the_new_slot_count_drain_first_or_the_reconfigure_is_refused() -> None:
    """Decision: while more requests run than the new geometry has slots, the engine keeps
    decoding with admission closed; once they end, the reconfigure runs. Past the drain
    timeout it is refused (503), changing nothing."""
    side, r = _setup()
    _running(side, 0, 10, start=0)
    _running(side, 1, 10, start=100)
    _ask(r, ReconfigureSpec(n_parallel=1, drain_timeout_s=60.0))
    assert r.tick(captures_pending=False) is None and not r.admission_open
    side.slots[1].running = None  # its request ended
    assert isinstance(_finish(r).result, ReconfigureReceipt)

    side, r = _setup()
    _running(side, 0, 10, start=0)
    _running(side, 1, 10, start=100)
    _ask(r, ReconfigureSpec(n_parallel=1, drain_timeout_s=0.0))
    finished = r.tick(captures_pending=False)
    assert finished is not None and not finished.changed
    assert isinstance(finished.result, KvswapError)
    assert finished.result.kind is ErrorKind.UNAVAILABLE
    assert "did not drain" in finished.result.message
    assert side.runtime.installed == [] and r.admission_open


def test_a_running_request_longer_than_the_new_window_refuses_it() -> None:
    """Decision: nothing is truncated: a running request that would not fit the new window
    refuses the reconfigure (a typed 400) before any state moves."""
    side, r = _setup()
    _running(side, 0, 300, start=0)
    _ask(r, ReconfigureSpec(n_ctx=512, n_parallel=2))
    finished = _finish(r)
    assert isinstance(finished.result, KvswapError)
    assert finished.result.kind is ErrorKind.INVALID_REQUEST
    assert "holds 301 tokens" in finished.result.message
    assert side.runtime.installed == [] and len(side.slots[0].tokens) == 300
    assert side.store.n_pages == 0


def test_a_kv_type_change_needs_force_and_leaves_every_state_as_tokens() -> None:
    """Decision: other KV types cannot load old states. Without `force` the change is refused
    at once; with it, every idle state (a resident mind, a mind's RAM page) becomes tokens that
    re-prefill on page_in, and the anonymous cache is emptied."""
    side, r = _setup()
    ann, bob = _m("ann"), _m("bob")
    side.seated(0, ann, 30, start=100)
    put_page(side.store, bob, 25, start=300)
    replies = _ask(r, ReconfigureSpec(cache_type_k="q8_0"))
    assert len(replies) == 1 and isinstance(replies[0], KvswapError)
    assert '"force": true' in replies[0].message and r.admission_open

    _ask(r, ReconfigureSpec(cache_type_k="q8_0", force=True))
    finished = _finish(r)
    assert isinstance(finished.result, ReconfigureReceipt)
    assert _fates(finished.result) == {0: (None, "token_only")}
    for key, first in ((ann, 100), (bob, 300)):
        page = side.store.get(key)
        assert page.layout.token_only and page.key.kind is PageKind.MIND
        assert page_tokens(side.store, key)[:3] == tokens(3, first)
    assert side.registry.residents() == {}
    side.check()
