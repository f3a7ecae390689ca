"""kvswap.tiny.lora and `make-tiny-model --lora`: the adapter GGUF llama.cpp expects."""

from __future__ import annotations

from pathlib import Path

import pytest
from gguf import GGUFReader

from kvswap.tiny import TinyModelError, TinyParams, write_tiny_gguf
from kvswap.tiny.cli import main
from kvswap.tiny.lora import write_tiny_lora


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("base") / "llama.gguf"
    write_tiny_gguf(path, TinyParams("llama", seed=3))
    return path


def test_the_adapter_has_llama_cpp_keys_and_transposed_a_b_pairs(
    base: Path, tmp_path: Path
) -> None:
    written = write_tiny_lora(base, tmp_path / "l.gguf", seed=1, rank=4)
    reader = GGUFReader(written.path)
    fields = reader.fields
    assert fields["general.type"].contents() == "adapter"
    assert fields["general.architecture"].contents() == "llama"
    assert fields["adapter.type"].contents() == "lora"
    assert fields["adapter.lora.alpha"].contents() == 4.0
    base_shapes = {t.name: [int(d) for d in t.shape] for t in GGUFReader(base).tensors}
    shapes = {t.name: [int(d) for d in t.shape] for t in reader.tensors}
    adapted = sorted(n.removesuffix(".lora_a") for n in shapes if n.endswith(".lora_a"))
    assert len(adapted) == written.n_adapted == 2 * 7  # 2 layers x q, k, v, o, gate, up, down
    for name in adapted:
        n_in, n_out = base_shapes[name]
        # llama-adapter.cpp: W [n_in, n_out], A [n_in, rank], B [rank, n_out] (ggml order)
        assert shapes[f"{name}.lora_a"] == [n_in, 4]
        assert shapes[f"{name}.lora_b"] == [4, n_out]
    assert not any(n.startswith(("token_embd", "output")) for n in shapes)


def test_same_base_and_seed_give_identical_bytes(base: Path, tmp_path: Path) -> None:
    a = write_tiny_lora(base, tmp_path / "a.gguf", seed=1).path
    b = write_tiny_lora(base, tmp_path / "b.gguf", seed=1).path
    c = write_tiny_lora(base, tmp_path / "c.gguf", seed=2).path
    assert a.read_bytes() == b.read_bytes() != c.read_bytes()


def test_cli_lora_mode(base: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "sub" / "l.gguf"
    assert main(["--lora", "--base", str(base), "--out", str(out), "--seed", "1"]) == 0
    printed = capsys.readouterr().out
    assert str(out) in printed and "LoRA adapter for llama" in printed
    assert (
        out.read_bytes() == write_tiny_lora(base, tmp_path / "ref.gguf", seed=1).path.read_bytes()
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--lora"], "--base"),
        (["--lora", "--base", "BASE", "--arch", "llama"], "--arch"),
        (["--lora", "--base", "ADAPTER"], "is an adapter"),
        (["--lora", "--base", "MISSING"], "--base"),
        ([], "--arch is required"),
    ],
)
def test_lora_mode_errors_return_2_and_name_the_flag(
    base: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    adapter = write_tiny_lora(base, tmp_path / "adapter.gguf").path
    names = {"BASE": str(base), "ADAPTER": str(adapter), "MISSING": str(tmp_path / "none.gguf")}
    out = tmp_path / "l.gguf"
    assert main([*(names.get(a, a) for a in argv), "--out", str(out)]) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


def test_a_base_without_matrices_to_adapt_is_refused(tmp_path: Path) -> None:
    mamba = tmp_path / "mamba.gguf"
    write_tiny_gguf(mamba, TinyParams("mamba"))
    with pytest.raises(TinyModelError, match="no attention or feed-forward"):
        write_tiny_lora(mamba, tmp_path / "l.gguf")
