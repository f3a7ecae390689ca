"""kvswap.tiny.writer and archs: deterministic bytes, keys, shapes, dtypes, clean text."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType

from kvswap.tiny import ARCH_NAMES, ARCHS, TinyModelError, TinyParams, write_tiny_gguf
from kvswap.tiny.vocab import clean_token_mask, tiny_vocab
from kvswap.tiny.writer import resolve_params

# Shapes (ggml order) derived by formula rather than copied, at the defaults (n_embd 64), as
# listed for models that load in /work/shared/notes/TINY-GGUF-ARCH-SPECS.md.
GOLDEN_SHAPES = {
    "llama": {"blk.1.attn_k.weight": [64, 32], "blk.1.ffn_down.weight": [128, 64]},
    "gemma3": {"blk.0.attn_q_norm.weight": [16]},
    "mamba": {"blk.0.ssm_x.weight": [128, 36], "blk.0.ssm_a": [16, 128]},
    "mamba2": {"blk.0.ssm_in.weight": [64, 296], "blk.0.ssm_conv1d.weight": [4, 160]},
    "rwkv6": {"blk.0.time_mix_w2.weight": [8, 64, 5], "blk.0.time_mix_first.weight": [16, 4]},
    "rwkv7": {"blk.1.time_mix_lerp_fused.weight": [64, 1, 1, 6]},
    "lfm2": {"blk.0.shortconv.in_proj.weight": [64, 192], "blk.1.attn_k.weight": [64, 32]},
    "granitehybrid": {"blk.0.ssm_in.weight": [64, 292], "blk.0.ssm_norm.weight": [128, 1]},
    "jamba": {"blk.2.ssm_dt_norm.weight": [4], "blk.1.attn_output.weight": [64, 64]},
    "qwen35": {"blk.0.attn_qkv.weight": [64, 128], "blk.3.attn_q.weight": [64, 128]},
}
HYBRID_HEAD_COUNT_KV = [0, 2, 0]


def _write(tmp_path: Path, name: str, **params: object) -> Path:
    path = tmp_path / f"{name}.gguf"
    write_tiny_gguf(path, TinyParams(**params))  # type: ignore[arg-type]
    return path


@pytest.mark.parametrize("arch", ARCH_NAMES)
def test_same_params_give_identical_bytes(tmp_path: Path, arch: str) -> None:
    a = _write(tmp_path, "a", arch=arch, seed=3)
    b = _write(tmp_path, "b", arch=arch, seed=3)
    c = _write(tmp_path, "c", arch=arch, seed=4)
    assert a.read_bytes() == b.read_bytes()
    assert a.read_bytes() != c.read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.gguf", "b.gguf", "c.gguf"]


@pytest.mark.parametrize("arch", ARCH_NAMES)
def test_file_has_the_described_tensors_and_keys(tmp_path: Path, arch: str) -> None:
    reader = GGUFReader(_write(tmp_path, arch, arch=arch))
    shapes = {t.name: [int(d) for d in t.shape] for t in reader.tensors}
    for name, shape in GOLDEN_SHAPES.get(arch, {}).items():
        assert shapes[name] == shape, name
    assert shapes["token_embd.weight"] == [64, 384]
    assert ("output.weight" in shapes) == (arch != "gemma2")
    fields = reader.fields
    assert fields["general.architecture"].contents() == arch
    assert fields[f"{arch}.vocab_size"].contents() == 384
    assert fields[f"{arch}.context_length"].types == [GGUFValueType.UINT32]
    spec = ARCHS[arch]
    if spec.hybrid and arch != "qwen35":
        kv = fields[f"{arch}.attention.head_count_kv"]
        assert kv.types == [GGUFValueType.ARRAY, GGUFValueType.INT32]
        assert kv.contents() == HYBRID_HEAD_COUNT_KV


def test_n_ctx_train_and_layers_are_written(tmp_path: Path) -> None:
    fields = GGUFReader(_write(tmp_path, "m", arch="llama", n_ctx_train=32768, n_layer=5)).fields
    assert fields["llama.context_length"].contents() == 32768
    assert fields["llama.block_count"].contents() == 5


def test_f16_stores_matmul_weights_only(tmp_path: Path) -> None:
    reader = GGUFReader(_write(tmp_path, "m", arch="mamba", dtype="f16"))
    types = {t.name: t.tensor_type for t in reader.tensors}
    assert types["token_embd.weight"] == GGMLQuantizationType.F16
    assert types["blk.0.ssm_in.weight"] == GGMLQuantizationType.F16
    for f32 in ("blk.0.attn_norm.weight", "blk.0.ssm_conv1d.weight", "blk.0.ssm_a"):
        assert types[f32] == GGMLQuantizationType.F32, f32
    assert reader.fields["general.file_type"].contents() == 1


def _rows(path: Path, name: str) -> np.ndarray:
    tensor = next(t for t in GGUFReader(path).tensors if t.name == name)
    return np.asarray(tensor.data)


@pytest.mark.parametrize(
    ("arch", "output"), [("llama", "output.weight"), ("gemma2", "token_embd.weight")]
)
def test_clean_text_zeroes_exactly_the_unclean_output_rows(
    tmp_path: Path, arch: str, output: str
) -> None:
    unclean = ~clean_token_mask(tiny_vocab())
    clean_rows = _rows(_write(tmp_path, "clean", arch=arch, clean_text=True), output)
    plain_rows = _rows(_write(tmp_path, "plain", arch=arch), output)
    assert not clean_rows[unclean].any()
    assert np.array_equal(clean_rows[~unclean], plain_rows[~unclean])
    assert (np.abs(plain_rows[unclean]).sum(axis=1) > 0).all()


def test_defaults_resolve_per_architecture() -> None:
    assert resolve_params(TinyParams("llama"))[1].n_layer == 2
    assert resolve_params(TinyParams("jamba"))[1].n_layer == 3
    g = resolve_params(TinyParams("qwen35"))[1]
    assert (g.n_layer, g.head_dim, g.n_ff) == (4, 16, 128)


def test_recurrent_architectures_ignore_head_parameters() -> None:
    g = resolve_params(TinyParams("mamba", n_embd=6, n_head=4, n_head_kv=3))[1]
    assert (g.n_head, g.n_head_kv, g.head_dim) == (0, 0, 0)
    assert (
        resolve_params(TinyParams("rwkv7", n_head=5))[1] == resolve_params(TinyParams("rwkv7"))[1]
    )


@pytest.mark.parametrize(
    ("params", "flag"),
    [
        (TinyParams("rwkv7", n_embd=32), "--n-embd"),
        (TinyParams("llama", n_head=4, n_head_kv=3), "--n-head/--n-head-kv"),
        (TinyParams("llama", n_embd=60, n_head=8), "--n-head"),
        (TinyParams("jamba", head_dim=32), "--head-dim"),
        (TinyParams("llama", n_layer=0), "--n-layer"),
        (TinyParams("llama", dtype="bf16"), "--dtype"),  # type: ignore[arg-type]
        (TinyParams("gpt9"), "--arch"),
    ],
)
def test_invalid_requests_name_the_flag(params: TinyParams, flag: str) -> None:
    with pytest.raises(TinyModelError, match=f"^{flag}"):
        resolve_params(params)


def test_arch_flags_partition_the_architectures() -> None:
    recurrent = {a for a, s in ARCHS.items() if s.recurrent}
    hybrid = {a for a, s in ARCHS.items() if s.hybrid}
    assert recurrent == {"mamba", "mamba2", "rwkv6", "rwkv7"}
    assert hybrid == {"lfm2", "granitehybrid", "jamba", "qwen35"}
