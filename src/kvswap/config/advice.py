"""What a request too long for its slot is told: llama-server's words, then the flags that fix it.

Owns `exceeds_context_message` and `WindowShape` (what it reads of a context geometry: the
engine's `Geometry` fits it). A slot's window is capped by whichever of four limits binds first,
and each has its own remedy:

- the model's training context: a `-c` that gives a slot more lifts it, kvswap extending the
  context by YaRN (`config.extension`; llama-server's four flags for it are named too);
- `--kv-unified-per-slot N`, a cap per slot;
- `-np N` without `-kvu`: the pool `-c` is split into N fixed windows, so a mind can never grow
  past `-c / N` even while the other slots are empty (llama-server turns unified KV on only
  when `-np` is auto);
- the pool `-c` itself.

The message starts with llama-server's own sentence (clients and llama.cpp's test suite match
"exceeds the available context size"); the advice follows it, naming the flags for a restart
and the `POST /reconfigure` fields for a live server. Pure: no I/O, no libllama.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from kvswap.config.extension import yarn_factor


@dataclass(frozen=True)
class Trained:
    """What the model says of its training context: the length a slot is capped at, its
    metadata key's prefix (`general.architecture`), which `--override-kv` names, and the
    model's own length where an extension raised the cap (0: the same)."""

    n_ctx: int
    arch: str
    n_ctx_model: int = 0


class WindowShape(Protocol):
    """The part of a context geometry a slot's window comes from."""

    @property
    def n_ctx(self) -> int: ...  # the KV pool (-c)

    @property
    def n_parallel(self) -> int: ...  # slots (-np)

    @property
    def kv_unified(self) -> bool: ...  # -kvu

    @property
    def kv_unified_per_slot(self) -> int: ...  # --kv-unified-per-slot; 0 = no cap

    def n_ctx_seq(self) -> int: ...  # cells one sequence may use, as libllama computes it


def exceeds_context_message(
    n_prompt: int, n_ctx_slot: int, shape: WindowShape | None, trained: Trained | None = None
) -> str:
    """The refusal of a prompt of `n_prompt` tokens in slots of `n_ctx_slot`; without a shape,
    llama-server's sentence alone. `trained`: the model's training context (its extension is
    named when it binds)."""
    head = (
        f"request ({n_prompt} tokens) exceeds the available context size "
        f"({n_ctx_slot} tokens), try increasing it"
    )
    if shape is None:
        return head
    return f"{head}: {_advice(n_prompt, n_ctx_slot, shape, trained)}"


def _advice(n_prompt: int, n_ctx_slot: int, shape: WindowShape, trained: Trained | None) -> str:
    per_slot = shape.kv_unified_per_slot
    if n_ctx_slot < shape.n_ctx_seq() and not 0 < per_slot <= n_ctx_slot:
        return _extension(n_prompt, n_ctx_slot, trained, shape)
    if 0 < per_slot <= n_ctx_slot:
        return (
            f"--kv-unified-per-slot {per_slot} caps every slot; start with a larger value, "
            "or without it"
        )
    if not shape.kv_unified and shape.n_parallel > 1:
        return (
            f"-np {shape.n_parallel} without -kvu splits the pool (-c {shape.n_ctx}) into "
            f"{shape.n_parallel} fixed windows; start with -kvu so that one slot may use the "
            f"whole pool, or with -c above {n_prompt * shape.n_parallel}; on this server: "
            f'POST /reconfigure {{"n_parallel": 1}} or a larger "n_ctx"'
        )
    if trained is not None and 0 < trained.n_ctx <= n_prompt:
        # The training context binds too (it is -c's default): a -c past it extends it.
        return _extension(n_prompt, trained.n_ctx, trained, shape)
    # The training context may bind here too when it is not known: say so.
    return (
        f"the whole KV pool is -c {shape.n_ctx} tokens; start with -c above {n_prompt}, or "
        f'on this server: POST /reconfigure {{"n_ctx": {_round_up(n_prompt + 1)}}}, if the '
        "model was trained on that many tokens (no slot takes more than its training context)"
    )


def _extension(n_prompt: int, n_cap: int, trained: Trained | None, shape: WindowShape) -> str:
    """A slot capped by the training context (`n_cap`): the `-c` whose slot holds the prompt
    (kvswap extends the context by the smallest power-of-two YaRN factor that covers a slot),
    and llama-server's flags for the smallest extension that holds the prompt."""
    n_train = (trained.n_ctx_model if trained is not None else 0) or n_cap
    factor = yarn_factor(n_prompt + 1, n_train)
    n_ctx = n_train * factor
    pool = max(shape.n_ctx, n_ctx)
    if not shape.kv_unified and shape.n_parallel > 1:
        pool_flags = f"-c {pool} -kvu"  # a split pool's windows are -c / -np
    else:
        pool_flags = f"-c {pool}"
    extended = f", extended to {n_cap} by YaRN" if n_cap != n_train else ""
    arch = trained.arch if trained is not None and trained.arch else "<arch>"
    return (
        f"the model was trained on {n_train} tokens{extended}, the most one slot takes; start "
        f"with {pool_flags} and no --rope-* flag: kvswap extends the context "
        f"{yarn_factor(pool, n_train)}x by YaRN (llama-server extends it {factor}x with "
        f"--rope-scaling yarn --rope-scale {factor} --yarn-orig-ctx {n_train} --override-kv "
        f"{arch}.context_length=int:{n_ctx} {pool_flags}), or serve a model trained on a "
        "longer context"
    )


def _round_up(n_tokens: int, step: int = 1024) -> int:
    return -(-n_tokens // step) * step
