"""LoRA adapters on the real libllama: loading by hash, and the LoRA set a page carries through
real engine threads (a page whose adapters are not loaded is refused and stays)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvswap.backend.lora import AdapterLoadError, Adapters
from kvswap.backend.model import Model
from kvswap.core.errors import ErrorKind, KvswapError
from kvswap.core.keys import PageKey, page_key
from kvswap.engine.commands import PageIn, PageMoved, PageOut
from kvswap.engine.engine import Engine
from kvswap.engine.kv.buffers import new_buffer
from kvswap.tiny import tiny_model_path
from kvswap.tiny.lora import tiny_lora_path
from tests.engine.harness import call, complete, make_engine, request

pytestmark = pytest.mark.model

PROMPT = [3 + (i * 37) % 256 for i in range(40)]


@pytest.fixture(scope="module")
def base() -> Path:
    return tiny_model_path("llama", seed=7, clean_text=True)


@pytest.fixture(scope="module")
def model(base: Path) -> Iterator[Model]:
    m = Model.load(base)
    yield m
    m.close()


def test_adapters_load_in_order_and_are_named_by_file_hash(model: Model, base: Path) -> None:
    paths = [tiny_lora_path(base, seed=1), tiny_lora_path(base, seed=2)]
    adapters = Adapters.load(model, [(str(paths[0]), 1.0), (str(paths[1]), 0.5)], apply=False)
    try:
        assert [(a.id, a.path, a.scale) for a in adapters.infos] == [
            (0, str(paths[0]), 0.0),
            (1, str(paths[1]), 0.0),
        ]
        for info, path in zip(adapters.infos, paths, strict=True):
            assert info.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    finally:
        adapters.close()


def test_an_adapter_for_another_model_is_a_load_error(model: Model, tmp_path: Path) -> None:
    wider = tiny_model_path("llama", seed=7, n_embd=128)
    with pytest.raises(AdapterLoadError, match="failed to load lora adapter"):
        Adapters.load(model, [(str(tiny_lora_path(wider)), 1.0)])
    with pytest.raises(AdapterLoadError):
        Adapters.load(model, [(str(tmp_path / "missing.gguf"), 1.0)])


def _copy_page(src: Engine, dst: Engine, name: PageKey) -> None:
    """Put `src`'s page `name` into `dst`'s store, byte for byte (another server's page)."""
    assert src.store is not None and dst.store is not None
    page = src.store.hold(name)
    try:
        buffer = new_buffer(page.layout.n_bytes)
        with page.view() as view:
            buffer[: page.layout.n_bytes] = view[: page.layout.n_bytes]
        reservation = dst.store.reserve(name, page.layout.n_bytes)
        dst.store.commit(reservation, buffer, page.layout)
    finally:
        src.store.release(page)


def test_a_page_whose_adapter_is_not_loaded_is_refused_and_stays(model: Model, base: Path) -> None:
    adapters = Adapters.load(model, [(str(tiny_lora_path(base, seed=1)), 1.0)])
    with_lora = make_engine(
        model, n_ctx=512, n_parallel=2, page_ram_bytes=32 << 20, adapters=adapters
    )
    without = make_engine(model, n_ctx=512, n_parallel=2, page_ram_bytes=32 << 20)
    try:
        lora = ((0, 1.0),)
        first = complete(with_lora, request(PROMPT, 8, id_slot=0, lora=lora))
        moved = call(with_lora, lambda rid, reply: PageOut(rid, 0, page_key("t", "mind"), reply))
        assert isinstance(moved, PageMoved)
        _copy_page(with_lora, without, page_key("t", "mind"))

        refused = call(without, lambda rid, reply: PageIn(rid, 1, page_key("t", "mind"), reply))
        assert isinstance(refused, KvswapError), refused
        assert refused.kind is ErrorKind.INVALID_REQUEST and "not loaded" in refused.message
        assert without.store is not None and without.store.n_pages == 1
        assert without.slots[1].lora == () and len(without.slots[1].tokens) == 0

        # Where the adapter is loaded, the page comes back under it: the slot takes its set.
        back = call(with_lora, lambda rid, reply: PageIn(rid, 1, page_key("t", "mind"), reply))
        assert isinstance(back, PageMoved), back
        assert with_lora.slots[1].lora == lora
        follow = PROMPT + list(first.tokens)
        nxt = complete(with_lora, request(follow, 4, id_slot=1, lora=lora))
        assert nxt.timings.cache_n == len(follow) - 1
    finally:
        with_lora.close()
        without.close()
        adapters.close()
