"""Building blocks of tiny-model tensor lists: attention, feed-forward, norms, mamba mixers.

Owns `TensorSpec` (one tensor: name, shape in ggml order, how to initialise it) and the small
functions archs.py composes into per-architecture descriptions. Shapes are in ggml order, as
llama.cpp's `create_tensor()` lists them: `shape[0]` is the contiguous dimension, which for a
matmul weight is its input width. Pure: no I/O, no numpy.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from kvswap.tiny.params import Geometry

# embd: N(0, 0.5) embedding/output rows; mat: N(0, 1/sqrt(fan_in)); conv: like mat, kept f32
# (ggml_ssm_conv wants f32); one/zero: norms and biases; small: N(0, 0.1); mix: U(0, 1) lerp
# factors; ssm_a: negative decay rates; dt_bias: softplus^-1 of a small step size.
Init = Literal["embd", "mat", "conv", "one", "zero", "small", "mix", "ssm_a", "dt_bias"]

D_CONV = 4  # ssm/shortconv kernel width
D_STATE = 16  # ssm state size (and qwen35's linear-attention head width)
RMS_EPS = 1e-5
ROPE_FREQ_BASE = 10000.0


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]  # ggml order
    init: Init
    scale: float = 1.0  # multiplies the initial values


def tensor(name: str, *shape: int, init: Init = "mat") -> TensorSpec:
    return TensorSpec(name, tuple(shape), init)


def blk(il: int, name: str, *shape: int, init: Init = "mat") -> TensorSpec:
    return TensorSpec(f"blk.{il}.{name}", tuple(shape), init)


def output_tensors(g: Geometry, n_vocab: int, *, norm: str = "output_norm") -> list[TensorSpec]:
    return [
        tensor(f"{norm}.weight", g.n_embd, init="one"),
        tensor("output.weight", g.n_embd, n_vocab, init="embd"),
    ]


def attention(g: Geometry, il: int, *, q_out: int, o_in: int, qk_norm: bool) -> list[TensorSpec]:
    n, kv = g.n_embd, g.n_head_kv * g.head_dim
    out = [
        blk(il, "attn_q.weight", n, q_out),
        blk(il, "attn_k.weight", n, kv),
        blk(il, "attn_v.weight", n, kv),
        blk(il, "attn_output.weight", o_in, n),
    ]
    if qk_norm:
        out += [
            blk(il, "attn_q_norm.weight", g.head_dim, init="one"),
            blk(il, "attn_k_norm.weight", g.head_dim, init="one"),
        ]
    return out


def std_attention(g: Geometry, il: int, *, qk_norm: bool = False) -> list[TensorSpec]:
    q = g.n_head * g.head_dim
    return attention(g, il, q_out=q, o_in=q, qk_norm=qk_norm)


def ffn(g: Geometry, il: int, *, norm: bool = True) -> list[TensorSpec]:
    out = [blk(il, "ffn_norm.weight", g.n_embd, init="one")] if norm else []
    return [
        *out,
        blk(il, "ffn_gate.weight", g.n_embd, g.n_ff),
        blk(il, "ffn_up.weight", g.n_embd, g.n_ff),
        blk(il, "ffn_down.weight", g.n_ff, g.n_embd),
    ]


def norm(
    il: int, name: str, width: int, *, bias: bool = False, gain: float = 1.0
) -> list[TensorSpec]:
    out = [TensorSpec(f"blk.{il}.{name}.weight", (width,), "one", scale=gain)]
    return [*out, blk(il, f"{name}.bias", width, init="zero")] if bias else out


def base_keys(*, n_ff: int, n_head: int) -> dict[str, object]:
    return {"feed_forward_length": n_ff, "attention.head_count": n_head}


def head_count_kv_per_layer(
    g: Geometry, spec_is_attn: Callable[[Geometry, int], bool]
) -> list[int]:
    # Hybrids mark their recurrent layers with n_head_kv == 0.
    return [g.n_head_kv if spec_is_attn(g, il) else 0 for il in range(g.n_layer)]


def mamba_dt_rank(g: Geometry) -> int:
    return -(-g.n_embd // 16)  # ceil(n_embd / 16), as in Mamba


def mamba1_keys(g: Geometry) -> dict[str, object]:
    return {
        "ssm.conv_kernel": D_CONV,
        "ssm.inner_size": 2 * g.n_embd,  # llama.cpp only supports an expansion factor of 2
        "ssm.state_size": D_STATE,
        "ssm.time_step_rank": mamba_dt_rank(g),
    }


def mamba1(g: Geometry, il: int, *, bc_norms: bool) -> list[TensorSpec]:
    d_inner, dt_rank = 2 * g.n_embd, mamba_dt_rank(g)
    out = [
        blk(il, "ssm_in.weight", g.n_embd, 2 * d_inner),
        blk(il, "ssm_conv1d.weight", D_CONV, d_inner, init="conv"),
        blk(il, "ssm_conv1d.bias", d_inner, init="zero"),
        blk(il, "ssm_x.weight", d_inner, dt_rank + 2 * D_STATE),
        blk(il, "ssm_dt.weight", dt_rank, d_inner),
        blk(il, "ssm_dt.bias", d_inner, init="dt_bias"),
        blk(il, "ssm_a", D_STATE, d_inner, init="ssm_a"),
        blk(il, "ssm_d", d_inner, init="one"),
        blk(il, "ssm_out.weight", d_inner, g.n_embd),
    ]
    if bc_norms:  # jamba normalises dt, B and C
        out += [
            blk(il, "ssm_dt_norm.weight", dt_rank, init="one"),
            blk(il, "ssm_b_norm.weight", D_STATE, init="one"),
            blk(il, "ssm_c_norm.weight", D_STATE, init="one"),
        ]
    return out


def mamba2_keys(g: Geometry, n_ssm_head: int) -> dict[str, object]:
    return {**mamba1_keys(g), "ssm.time_step_rank": n_ssm_head, "ssm.group_count": 1}


def mamba2(g: Geometry, il: int, n_ssm_head: int) -> list[TensorSpec]:
    d_inner, n_group = 2 * g.n_embd, 1
    conv_dim = d_inner + 2 * n_group * D_STATE  # x, B, C go through the conv
    return [
        blk(il, "ssm_in.weight", g.n_embd, d_inner + conv_dim + n_ssm_head),  # z, xBC, dt
        blk(il, "ssm_conv1d.weight", D_CONV, conv_dim, init="conv"),
        blk(il, "ssm_conv1d.bias", conv_dim, init="zero"),
        blk(il, "ssm_dt.bias", n_ssm_head, init="dt_bias"),
        blk(il, "ssm_a", 1, n_ssm_head, init="ssm_a"),
        blk(il, "ssm_d", 1, n_ssm_head, init="one"),
        blk(il, "ssm_norm.weight", d_inner // n_group, n_group, init="one"),
        blk(il, "ssm_out.weight", d_inner, g.n_embd),
    ]
