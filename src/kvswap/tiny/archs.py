"""What each supported architecture's GGUF contains: metadata keys and tensor shapes.

Owns `ARCHS`, one `ArchSpec` per architecture, each composed from the shared pieces in
blocks.py. The shapes and keys follow llama.cpp `0c1e570` (llama-cpp-python 0.3.36), read from
llama.cpp's `src/llama-arch.cpp` and `src/llama-model.cpp`; the tests load every one of them with libllama.
Pure: no I/O, no numpy.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kvswap.tiny import blocks as b
from kvswap.tiny.params import Geometry

SLIDING_WINDOW = 16  # gemma2/gemma3: small, so tests see the window slide
SLIDING_WINDOW_PATTERN = 2  # every second layer is full attention
# gemma2's output is token_embd (llama.cpp accepts no output.weight) and its input embedding is
# scaled by sqrt(n_embd), so with unit norms the residual stream is mostly the last token's own
# embedding and greedy decoding repeats that token forever. A large gain on the position-wise
# FFN's post-norm lets a random function of the token dominate instead: varied greedy text.
GEMMA2_FFW_GAIN = 32.0


@dataclass(frozen=True)
class ArchSpec:
    """One architecture. Key names are given without the `{arch}.` prefix."""

    name: str
    n_layer_default: int
    keys: Callable[[Geometry], dict[str, object]]
    layer: Callable[[Geometry, int], list[b.TensorSpec]]
    # Global tensors besides token_embd.weight (which every architecture has), given n_vocab.
    global_tensors: Callable[[Geometry, int], list[b.TensorSpec]]
    # Layers with an attention KV cache; the others are recurrent (or there are none).
    is_attention_layer: Callable[[Geometry, int], bool]
    n_embd_multiple: int = 2
    head_dim_fixed_by_n_embd: bool = False
    output_is_token_embd: bool = False  # gemma2 ties its output to token_embd (no output.weight)
    recurrent: bool = False  # what llama_model_is_recurrent / _is_hybrid should report
    hybrid: bool = False


# --- plain attention and sliding window -------------------------------------------------------


def _llama_keys(g: Geometry) -> dict[str, object]:
    return {
        **b.base_keys(n_ff=g.n_ff, n_head=g.n_head),
        "attention.head_count_kv": g.n_head_kv,
        "attention.layer_norm_rms_epsilon": b.RMS_EPS,
        "rope.freq_base": b.ROPE_FREQ_BASE,
        "rope.dimension_count": g.head_dim,  # llama requires n_rot == head_dim
        "attention.key_length": g.head_dim,  # lets head_dim differ from n_embd / n_head
        "attention.value_length": g.head_dim,
    }


def _gemma_keys(g: Geometry) -> dict[str, object]:
    return {
        **b.base_keys(n_ff=g.n_ff, n_head=g.n_head),
        "attention.head_count_kv": g.n_head_kv,
        "attention.layer_norm_rms_epsilon": b.RMS_EPS,
        "rope.freq_base": b.ROPE_FREQ_BASE,
        "attention.key_length": g.head_dim,
        "attention.value_length": g.head_dim,
        "attention.sliding_window": SLIDING_WINDOW,
        "attention.sliding_window_pattern": SLIDING_WINDOW_PATTERN,
    }


def _gemma_layer(
    g: Geometry, il: int, *, qk_norm: bool, ffw_gain: float = 1.0
) -> list[b.TensorSpec]:
    return [
        *b.norm(il, "attn_norm", g.n_embd),
        *b.std_attention(g, il, qk_norm=qk_norm),
        *b.norm(il, "post_attention_norm", g.n_embd),
        *b.ffn(g, il),
        *b.norm(il, "post_ffw_norm", g.n_embd, gain=ffw_gain),
    ]


def _always(g: Geometry, il: int) -> bool:
    return True


def _never(g: Geometry, il: int) -> bool:
    return False


LLAMA = ArchSpec(
    name="llama",
    n_layer_default=2,
    keys=_llama_keys,
    global_tensors=lambda g, n_vocab: b.output_tensors(g, n_vocab),
    layer=lambda g, il: [
        *b.norm(il, "attn_norm", g.n_embd),
        *b.std_attention(g, il),
        *b.ffn(g, il),
    ],
    is_attention_layer=_always,
)

GEMMA2 = ArchSpec(
    name="gemma2",
    n_layer_default=2,
    keys=lambda g: {
        **_gemma_keys(g),
        "attn_logit_softcapping": 50.0,
        "final_logit_softcapping": 30.0,
    },
    global_tensors=lambda g, n_vocab: [b.tensor("output_norm.weight", g.n_embd, init="one")],
    layer=lambda g, il: _gemma_layer(g, il, qk_norm=False, ffw_gain=GEMMA2_FFW_GAIN),
    is_attention_layer=_always,
    output_is_token_embd=True,
)

GEMMA3 = ArchSpec(
    name="gemma3",
    n_layer_default=2,
    keys=lambda g: {**_gemma_keys(g), "rope.freq_base_swa": b.ROPE_FREQ_BASE},
    global_tensors=lambda g, n_vocab: b.output_tensors(g, n_vocab),
    layer=lambda g, il: _gemma_layer(g, il, qk_norm=True),
    is_attention_layer=_always,
)

# --- pure recurrent ---------------------------------------------------------------------------

MAMBA = ArchSpec(
    name="mamba",
    n_layer_default=2,
    keys=lambda g: {
        **b.base_keys(n_ff=0, n_head=0),
        "attention.layer_norm_rms_epsilon": b.RMS_EPS,
        **b.mamba1_keys(g),
    },
    global_tensors=lambda g, n_vocab: b.output_tensors(g, n_vocab),
    layer=lambda g, il: [*b.norm(il, "attn_norm", g.n_embd), *b.mamba1(g, il, bc_norms=False)],
    is_attention_layer=_never,
    recurrent=True,
)


def _mamba2_heads(g: Geometry) -> int:
    return g.n_embd // 8  # 16-wide heads over d_inner = 2 * n_embd


MAMBA2 = ArchSpec(
    name="mamba2",
    n_layer_default=2,
    keys=lambda g: {
        **b.base_keys(n_ff=0, n_head=0),
        "attention.layer_norm_rms_epsilon": b.RMS_EPS,
        **b.mamba2_keys(g, _mamba2_heads(g)),
    },
    global_tensors=lambda g, n_vocab: b.output_tensors(g, n_vocab),
    layer=lambda g, il: [*b.norm(il, "attn_norm", g.n_embd), *b.mamba2(g, il, _mamba2_heads(g))],
    is_attention_layer=_never,
    n_embd_multiple=8,
    recurrent=True,
)

RWKV6_HEAD_SIZE = 16
RWKV6_MIX_EXTRA_DIM = 8
RWKV6_DECAY_EXTRA_DIM = 16


def _rwkv_keys(g: Geometry, head_size: int) -> dict[str, object]:
    return {
        **b.base_keys(n_ff=g.n_ff, n_head=0),
        "attention.layer_norm_epsilon": b.RMS_EPS,
        "wkv.head_size": head_size,
    }


def _rwkv_globals(g: Geometry, n_vocab: int) -> list[b.TensorSpec]:
    return [
        b.tensor("token_embd_norm.weight", g.n_embd, init="one"),
        b.tensor("token_embd_norm.bias", g.n_embd, init="zero"),
        b.tensor("output_norm.bias", g.n_embd, init="zero"),
        *b.output_tensors(g, n_vocab),
    ]


def _rwkv_common(g: Geometry, il: int) -> list[b.TensorSpec]:
    """Norms, the K/V/R/O projections and the channel mix that rwkv6 and rwkv7 share."""
    n = g.n_embd
    return [
        *b.norm(il, "attn_norm", n, bias=True),
        *b.norm(il, "attn_norm_2", n, bias=True),
        b.blk(il, "time_mix_key.weight", n, n),
        b.blk(il, "time_mix_value.weight", n, n),
        b.blk(il, "time_mix_receptance.weight", n, n),
        *b.norm(il, "time_mix_ln", n, bias=True),
        b.blk(il, "time_mix_output.weight", n, n),
        b.blk(il, "channel_mix_lerp_k.weight", n, 1, 1, init="mix"),
        b.blk(il, "channel_mix_key.weight", n, g.n_ff),
        b.blk(il, "channel_mix_value.weight", g.n_ff, n),
    ]


def _rwkv6_layer(g: Geometry, il: int) -> list[b.TensorSpec]:
    n, mix, decay = g.n_embd, RWKV6_MIX_EXTRA_DIM, RWKV6_DECAY_EXTRA_DIM
    return [
        *_rwkv_common(g, il),
        b.blk(il, "time_mix_w1.weight", n, mix * 5, init="small"),
        b.blk(il, "time_mix_w2.weight", mix, n, 5, init="small"),
        b.blk(il, "time_mix_lerp_x.weight", n, 1, 1, init="mix"),
        b.blk(il, "time_mix_lerp_fused.weight", n, 1, 1, 5, init="mix"),
        b.blk(il, "time_mix_first.weight", RWKV6_HEAD_SIZE, n // RWKV6_HEAD_SIZE, init="small"),
        b.blk(il, "time_mix_decay.weight", n, init="small"),
        b.blk(il, "time_mix_decay_w1.weight", n, decay, init="small"),
        b.blk(il, "time_mix_decay_w2.weight", decay, n, init="small"),
        b.blk(il, "time_mix_gate.weight", n, n),
        b.blk(il, "channel_mix_lerp_r.weight", n, 1, 1, init="mix"),
        b.blk(il, "channel_mix_receptance.weight", n, n),
    ]


RWKV6 = ArchSpec(
    name="rwkv6",
    n_layer_default=2,
    keys=lambda g: {
        **_rwkv_keys(g, RWKV6_HEAD_SIZE),
        "time_mix_extra_dim": RWKV6_MIX_EXTRA_DIM,
        "time_decay_extra_dim": RWKV6_DECAY_EXTRA_DIM,
        "rescale_every_n_layers": 0,
    },
    global_tensors=_rwkv_globals,
    layer=_rwkv6_layer,
    is_attention_layer=_never,
    n_embd_multiple=RWKV6_HEAD_SIZE,
    recurrent=True,
)

# Head size 64: smaller heads read out of bounds in ggml's AVX-512 rwkv7 kernel.
RWKV7_HEAD_SIZE = 64
RWKV7_LORA_RANK = 8  # decay, iclr and value-residual-mix LoRA ranks
RWKV7_GATE_RANK = 16


def _rwkv7_layer(g: Geometry, il: int) -> list[b.TensorSpec]:
    n, r = g.n_embd, RWKV7_LORA_RANK
    out = _rwkv_common(g, il)
    for p in ("w", "a", "v"):  # decay, in-context learning rate, value residual mix
        out += [
            b.blk(il, f"time_mix_{p}0.weight", n, init="small"),
            b.blk(il, f"time_mix_{p}1.weight", n, r, init="small"),
            b.blk(il, f"time_mix_{p}2.weight", r, n, init="small"),
        ]
    return [
        *out,
        b.blk(il, "time_mix_g1.weight", n, RWKV7_GATE_RANK, init="small"),
        b.blk(il, "time_mix_g2.weight", RWKV7_GATE_RANK, n, init="small"),
        b.blk(il, "time_mix_lerp_fused.weight", n, 1, 1, 6, init="mix"),
        b.blk(il, "time_mix_k_k.weight", n, init="small"),
        b.blk(il, "time_mix_k_a.weight", n, init="small"),
        b.blk(il, "time_mix_r_k.weight", n, init="small"),
    ]


RWKV7 = ArchSpec(
    name="rwkv7",
    n_layer_default=2,
    keys=lambda g: {
        **_rwkv_keys(g, RWKV7_HEAD_SIZE),
        "attention.decay_lora_rank": RWKV7_LORA_RANK,
        "attention.iclr_lora_rank": RWKV7_LORA_RANK,
        "attention.value_residual_mix_lora_rank": RWKV7_LORA_RANK,
        "attention.gate_lora_rank": RWKV7_GATE_RANK,
    },
    global_tensors=_rwkv_globals,
    layer=_rwkv7_layer,
    is_attention_layer=_never,
    n_embd_multiple=RWKV7_HEAD_SIZE,
    recurrent=True,
)

# --- hybrids: recurrent layers plus attention layers ------------------------------------------


def _odd_layers(g: Geometry, il: int) -> bool:
    return il % 2 == 1  # 3 layers: recurrent, attention, recurrent


def _hybrid_keys(g: Geometry, is_attn: Callable[[Geometry, int], bool]) -> dict[str, object]:
    return {
        **b.base_keys(n_ff=g.n_ff, n_head=g.n_head),
        "attention.head_count_kv": b.head_count_kv_per_layer(g, is_attn),
        "attention.layer_norm_rms_epsilon": b.RMS_EPS,
        "rope.freq_base": b.ROPE_FREQ_BASE,
    }


def _lfm2_layer(g: Geometry, il: int) -> list[b.TensorSpec]:
    n = g.n_embd
    if _odd_layers(g, il):
        mixer = b.attention(g, il, q_out=n, o_in=n, qk_norm=True)
    else:
        mixer = [
            b.blk(il, "shortconv.conv.weight", b.D_CONV, n, init="conv"),
            b.blk(il, "shortconv.in_proj.weight", n, 3 * n),
            b.blk(il, "shortconv.out_proj.weight", n, n),
        ]
    return [*b.norm(il, "attn_norm", n), *mixer, *b.ffn(g, il)]


LFM2 = ArchSpec(
    name="lfm2",
    n_layer_default=3,
    keys=lambda g: {**_hybrid_keys(g, _odd_layers), "shortconv.l_cache": b.D_CONV},
    # lfm2's final norm is named token_embd_norm.
    global_tensors=lambda g, n_vocab: b.output_tensors(g, n_vocab, norm="token_embd_norm"),
    layer=_lfm2_layer,
    is_attention_layer=_odd_layers,
    head_dim_fixed_by_n_embd=True,
    hybrid=True,
)


def _granite_heads(g: Geometry) -> int:
    return g.n_embd // 16  # 32-wide heads over d_inner = 2 * n_embd


def _granite_layer(g: Geometry, il: int) -> list[b.TensorSpec]:
    mixer = b.std_attention(g, il) if _odd_layers(g, il) else b.mamba2(g, il, _granite_heads(g))
    return [*b.norm(il, "attn_norm", g.n_embd), *mixer, *b.ffn(g, il)]


GRANITEHYBRID = ArchSpec(
    name="granitehybrid",
    n_layer_default=3,
    keys=lambda g: {
        **_hybrid_keys(g, _odd_layers),
        **b.mamba2_keys(g, _granite_heads(g)),
        "rope.dimension_count": g.head_dim,
    },
    global_tensors=lambda g, n_vocab: b.output_tensors(g, n_vocab),
    layer=_granite_layer,
    is_attention_layer=_odd_layers,
    n_embd_multiple=16,
    hybrid=True,
)


def _jamba_layer(g: Geometry, il: int) -> list[b.TensorSpec]:
    n = g.n_embd
    if _odd_layers(g, il):
        mixer = b.attention(g, il, q_out=n, o_in=n, qk_norm=False)
    else:
        mixer = b.mamba1(g, il, bc_norms=True)
    return [*b.norm(il, "attn_norm", n), *mixer, *b.ffn(g, il)]


JAMBA = ArchSpec(
    name="jamba",
    n_layer_default=3,
    keys=lambda g: {**_hybrid_keys(g, _odd_layers), **b.mamba1_keys(g)},
    global_tensors=lambda g, n_vocab: b.output_tensors(g, n_vocab),
    layer=_jamba_layer,
    is_attention_layer=_odd_layers,
    head_dim_fixed_by_n_embd=True,
    hybrid=True,
)

QWEN35_FULL_ATTN_INTERVAL = 4
QWEN35_K_HEADS = 2  # ssm.group_count
QWEN35_V_HEADS = 4  # ssm.time_step_rank


def _qwen35_is_attn(g: Geometry, il: int) -> bool:
    return (il + 1) % QWEN35_FULL_ATTN_INTERVAL == 0


def _qwen35_keys(g: Geometry) -> dict[str, object]:
    n_rot = g.head_dim // 2  # partial rotary
    return {
        **b.base_keys(n_ff=g.n_ff, n_head=g.n_head),
        "attention.head_count_kv": g.n_head_kv,
        "attention.layer_norm_rms_epsilon": b.RMS_EPS,
        "rope.freq_base": b.ROPE_FREQ_BASE,
        "attention.key_length": g.head_dim,
        "attention.value_length": g.head_dim,
        "rope.dimension_count": n_rot,
        "rope.dimension_sections": [n_rot // 4, n_rot // 4, 0, 0],  # sums to n_rot / 2
        "ssm.conv_kernel": b.D_CONV,
        "ssm.inner_size": b.D_STATE * QWEN35_V_HEADS,
        "ssm.state_size": b.D_STATE,
        "ssm.time_step_rank": QWEN35_V_HEADS,
        "ssm.group_count": QWEN35_K_HEADS,
        "full_attention_interval": QWEN35_FULL_ATTN_INTERVAL,
    }


def _qwen35_layer(g: Geometry, il: int) -> list[b.TensorSpec]:
    n = g.n_embd
    if _qwen35_is_attn(g, il):
        q = g.n_head * g.head_dim
        mixer = b.attention(g, il, q_out=2 * q, o_in=q, qk_norm=True)  # Q and its gate, fused
    else:  # gated delta net: K and V heads are b.D_STATE wide
        key_dim, value_dim = b.D_STATE * QWEN35_K_HEADS, b.D_STATE * QWEN35_V_HEADS
        conv_dim = 2 * key_dim + value_dim
        mixer = [
            b.blk(il, "attn_qkv.weight", n, conv_dim),
            b.blk(il, "attn_gate.weight", n, value_dim),
            b.blk(il, "ssm_conv1d.weight", b.D_CONV, conv_dim, init="conv"),
            b.blk(il, "ssm_dt.bias", QWEN35_V_HEADS, init="dt_bias"),
            b.blk(il, "ssm_a", QWEN35_V_HEADS, init="ssm_a"),
            b.blk(il, "ssm_beta.weight", n, QWEN35_V_HEADS),
            b.blk(il, "ssm_alpha.weight", n, QWEN35_V_HEADS),
            b.blk(il, "ssm_norm.weight", b.D_STATE, init="one"),
            b.blk(il, "ssm_out.weight", value_dim, n),
        ]
    norms = [*b.norm(il, "attn_norm", n), *b.norm(il, "post_attention_norm", n)]
    return [*norms, *mixer, *b.ffn(g, il, norm=False)]


QWEN35 = ArchSpec(
    name="qwen35",
    n_layer_default=4,
    keys=_qwen35_keys,
    global_tensors=lambda g, n_vocab: b.output_tensors(g, n_vocab),
    layer=_qwen35_layer,
    is_attention_layer=_qwen35_is_attn,
    n_embd_multiple=2,
    hybrid=True,
)

ARCHS: dict[str, ArchSpec] = {
    spec.name: spec
    for spec in (
        LLAMA,
        GEMMA2,
        GEMMA3,
        MAMBA,
        MAMBA2,
        RWKV6,
        RWKV7,
        LFM2,
        GRANITEHYBRID,
        JAMBA,
        QWEN35,
    )
}


def n_attention_layers(spec: ArchSpec, g: Geometry) -> int:
    return sum(1 for il in range(g.n_layer) if spec.is_attention_layer(g, il))


def kv_bytes_per_token(spec: ArchSpec, g: Geometry, *, bytes_per_value: int = 2) -> int:
    """K and V bytes one token takes in the attention cache (f16 K/V by default); recurrent
    state is per sequence, not per token, and is not counted."""
    return 2 * n_attention_layers(spec, g) * g.n_head_kv * g.head_dim * bytes_per_value
