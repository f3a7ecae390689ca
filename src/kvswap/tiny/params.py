"""Parameters of a tiny random-weight model, and their validation.

Owns `TinyParams` (what a caller asks for, with `None` meaning "the architecture's default"),
`Geometry` (the same request with every default resolved, the single input of the writer and
the cache key), and `TinyModelError`. Pure: no I/O, no numpy, no libllama.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

Dtype = Literal["f32", "f16"]
VocabName = Literal["tiny", "smollm2"]

DTYPES: tuple[Dtype, ...] = ("f32", "f16")
VOCABS: tuple[VocabName, ...] = ("tiny", "smollm2")


class TinyModelError(ValueError):
    """A tiny-model request that cannot be generated; the message names the offending flag."""


@dataclass(frozen=True)
class TinyParams:
    """What to generate. `None` fields take the architecture's default."""

    arch: str
    seed: int = 0
    n_embd: int = 64
    n_layer: int | None = None  # None: the architecture's default (2, 3 for hybrids, 4 qwen35)
    n_ctx_train: int = 4096
    n_head: int = 4  # attention heads (ignored by pure recurrent architectures)
    n_head_kv: int = 2
    head_dim: int | None = None  # None: n_embd // n_head
    n_ff: int | None = None  # None: 2 * n_embd
    vocab: VocabName = "tiny"
    dtype: Dtype = "f32"
    clean_text: bool = False  # zero the output rows of control and non-printable tokens


@dataclass(frozen=True)
class Geometry:
    """A `TinyParams` with every default resolved and validated against its architecture."""

    arch: str
    seed: int
    n_embd: int
    n_layer: int
    n_ctx_train: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ff: int
    vocab: VocabName
    dtype: Dtype
    clean_text: bool

    def as_dict(self) -> dict[str, object]:
        return dataclasses.asdict(self)


def _fail(flag: str, message: str) -> TinyModelError:
    return TinyModelError(f"{flag}: {message}")


def resolve(
    params: TinyParams,
    *,
    n_layer_default: int,
    n_embd_multiple: int,
    head_dim_fixed_by_n_embd: bool,
    has_attention: bool,
) -> Geometry:
    """Fill defaults and check the request; the architecture supplies its own constraints.

    `n_embd_multiple`: n_embd must be a multiple of it (rwkv7 heads are 64 wide, mamba2 heads 16).
    `head_dim_fixed_by_n_embd`: the architecture's Q/O projections are n_embd x n_embd, so
    n_head * head_dim must equal n_embd. Without attention the head parameters are ignored
    and resolve to 0, so they neither fail validation nor split the cache.
    """
    if params.seed < 0:
        raise _fail("--seed", f"must be >= 0 (got {params.seed})")
    if params.n_embd <= 0 or params.n_embd % n_embd_multiple != 0:
        raise _fail(
            "--n-embd",
            f"must be a positive multiple of {n_embd_multiple} for {params.arch} "
            f"(got {params.n_embd})",
        )
    n_layer = n_layer_default if params.n_layer is None else params.n_layer
    if n_layer <= 0:
        raise _fail("--n-layer", f"must be >= 1 (got {n_layer})")
    if params.n_ctx_train <= 0:
        raise _fail("--n-ctx-train", f"must be >= 1 (got {params.n_ctx_train})")
    n_head, n_head_kv, head_dim = (
        _attention_heads(params, head_dim_fixed_by_n_embd) if has_attention else (0, 0, 0)
    )
    n_ff = 2 * params.n_embd if params.n_ff is None else params.n_ff
    if n_ff <= 0:
        raise _fail("--n-ff", f"must be >= 1 (got {n_ff})")
    if params.vocab not in VOCABS:
        raise _fail("--vocab", f"must be one of {', '.join(VOCABS)} (got {params.vocab!r})")
    if params.dtype not in DTYPES:
        raise _fail("--dtype", f"must be one of {', '.join(DTYPES)} (got {params.dtype!r})")
    return Geometry(
        arch=params.arch,
        seed=params.seed,
        n_embd=params.n_embd,
        n_layer=n_layer,
        n_ctx_train=params.n_ctx_train,
        n_head=n_head,
        n_head_kv=n_head_kv,
        head_dim=head_dim,
        n_ff=n_ff,
        vocab=params.vocab,
        dtype=params.dtype,
        clean_text=params.clean_text,
    )


def _attention_heads(params: TinyParams, head_dim_fixed_by_n_embd: bool) -> tuple[int, int, int]:
    """(n_head, n_head_kv, head_dim), checked."""
    if params.n_head <= 0 or params.n_head_kv <= 0 or params.n_head % params.n_head_kv != 0:
        raise _fail(
            "--n-head/--n-head-kv",
            "need n_head a positive multiple of n_head_kv "
            f"(got {params.n_head}/{params.n_head_kv})",
        )
    if params.head_dim is None:
        if params.n_embd % params.n_head != 0:
            raise _fail(
                "--n-head",
                f"must divide n_embd when --head-dim is not given "
                f"(got n_embd {params.n_embd}, n_head {params.n_head})",
            )
        head_dim = params.n_embd // params.n_head
    else:
        head_dim = params.head_dim
    if head_dim <= 0 or head_dim % 2 != 0:
        raise _fail("--head-dim", f"must be a positive even number (got {head_dim})")
    if head_dim_fixed_by_n_embd and head_dim * params.n_head != params.n_embd:
        raise _fail(
            "--head-dim",
            f"{params.arch} needs n_head * head_dim == n_embd "
            f"(got {params.n_head} * {head_dim} != {params.n_embd})",
        )
    return params.n_head, params.n_head_kv, head_dim
