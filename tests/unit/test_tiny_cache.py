"""kvswap.tiny.cache: one file per resolved parameter set, atomic under concurrent callers."""

from __future__ import annotations

import functools
import multiprocessing
from pathlib import Path

import pytest

from kvswap.tiny import (
    TinyModelError,
    TinyParams,
    tiny_model_path,
    tiny_models_dir,
    write_tiny_gguf,
)
from kvswap.tiny import cache as cache_module


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("KVSWAP_CACHE_DIR", str(tmp_path))
    return tmp_path / "tiny-models"


def test_generates_once_under_the_env_folder(
    cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tiny_model_path("llama", seed=1)
    assert path.parent == cache_dir == tiny_models_dir()
    assert path.name.startswith("llama-") and path.suffix == ".gguf"

    def refuse(*args: object) -> None:
        raise AssertionError("a cached model was generated again")

    monkeypatch.setattr(cache_module, "write_tiny_gguf", refuse)
    assert tiny_model_path("llama", seed=1) == path


def test_key_is_the_resolved_parameters(cache_dir: Path) -> None:
    base = tiny_model_path("llama")
    assert tiny_model_path("llama", n_layer=2, n_embd=64, head_dim=16, n_ff=128) == base
    others = {
        tiny_model_path("llama", seed=1),
        tiny_model_path("llama", n_ctx_train=32768),
        tiny_model_path("llama", dtype="f16"),
        tiny_model_path("llama", clean_text=True),
        tiny_model_path("mamba"),
    }
    assert base not in others and len(others) == 5


def test_bad_requests_raise(cache_dir: Path) -> None:
    with pytest.raises(TypeError):
        tiny_model_path("llama", n_embed=64)
    with pytest.raises(TinyModelError):
        tiny_model_path("rwkv7", n_embd=48)
    assert not cache_dir.exists() or not any(cache_dir.iterdir())


def test_default_folder_is_the_repo_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KVSWAP_CACHE_DIR", raising=False)
    repo = Path(__file__).resolve().parents[2]
    if not Path(cache_module.__file__).resolve().is_relative_to(repo / "src"):
        pytest.skip("kvswap is not imported from this checkout")
    assert tiny_models_dir() == repo / ".cache" / "tiny-models"


@pytest.mark.timeout(120)
def test_concurrent_callers_get_one_complete_file(cache_dir: Path) -> None:
    make = functools.partial(tiny_model_path, "jamba", seed=11)
    with multiprocessing.get_context("spawn").Pool(4) as pool:
        paths = pool.starmap(make, [()] * 8)
    assert len(set(paths)) == 1
    assert [p.name for p in cache_dir.iterdir()] == [paths[0].name]  # no temp files left
    reference = cache_dir.parent / "reference.gguf"
    write_tiny_gguf(reference, TinyParams("jamba", seed=11))
    assert paths[0].read_bytes() == reference.read_bytes()
