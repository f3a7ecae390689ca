"""kvswap.tiny.cli: `kvswap make-tiny-model` argument handling and its report."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvswap.tiny import TinyParams, write_tiny_gguf
from kvswap.tiny.cli import build_parser, main, params_from_args


def test_writes_the_model_and_says_what(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "sub" / "m.gguf"
    assert (
        main(["--arch", "mamba", "--out", str(out), "--seed", "5", "--n-ctx-train", "32768"]) == 0
    )
    printed = capsys.readouterr().out
    assert str(out) in printed and "arch mamba" in printed
    assert f"{out.stat().st_size:,} bytes" in printed and "n_ctx_train 32768" in printed
    reference = tmp_path / "ref.gguf"
    write_tiny_gguf(reference, TinyParams("mamba", seed=5, n_ctx_train=32768))
    assert out.read_bytes() == reference.read_bytes()


def test_kv_like_preset_with_an_explicit_override() -> None:
    args = build_parser().parse_args(
        ["--arch", "llama", "--out", "x.gguf", "--kv-like", "smollm2-135m", "--n-ctx-train", "512"]
    )
    p = params_from_args(args)
    assert (p.n_layer, p.n_head_kv, p.head_dim, p.n_ctx_train) == (30, 3, 64, 512)


def test_kv_like_reports_the_real_models_bytes_per_token(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "m.gguf"
    assert main(["--arch", "llama", "--out", str(out), "--kv-like", "smollm2-135m"]) == 0
    assert "23,040 B/token KV" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--arch", "rwkv7", "--n-embd", "32"], "--n-embd"),
        (["--arch", "mamba", "--kv-like", "smollm2-135m"], "--kv-like"),
        (["--arch", "gpt9"], "--arch"),
        (["--arch", "llama", "--dtype", "q4_0"], "--dtype"),
    ],
)
def test_errors_return_2_and_name_the_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    out = tmp_path / "m.gguf"
    assert main([*argv, "--out", str(out)]) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()
