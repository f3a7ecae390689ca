"""Context geometry: pool size, slot count, unified KV and each slot's window, and a change of
it that a client asks for (`ReconfigureSpec`, the body of POST /reconfigure).

Pure arithmetic on the settings and the model's training context, following llama-server:
`-np` auto means 4 slots with unified KV; `--kv-unified-per-slot N` without `-c` sizes the pool
to `n_parallel * N`; with unified KV every slot may use the whole pool; without it each slot has
its own stream of `n_ctx / n_parallel` cells (libllama pads it up to a multiple of 256). A slot's
window `n_ctx_slot` is then capped by `--kv-unified-per-slot` and the training context.
"""

from __future__ import annotations

from dataclasses import dataclass

AUTO_N_PARALLEL = 4
_STREAM_PAD = 256


@dataclass(frozen=True)
class Geometry:
    """What the engine builds contexts and slots from."""

    n_ctx: int  # KV pool requested from libllama (cells)
    n_parallel: int  # slots
    kv_unified: bool
    n_batch: int
    n_ubatch: int
    cache_type_k: str
    cache_type_v: str
    kv_unified_per_slot: int  # 0: no cap
    generation: int = 0  # bumped by every live reconfigure

    def n_ctx_seq(self) -> int:
        """Cells one sequence can use, as libllama computes `n_ctx_seq`."""
        if self.kv_unified:
            return self.n_ctx
        per = self.n_ctx // self.n_parallel
        return (per + _STREAM_PAD - 1) // _STREAM_PAD * _STREAM_PAD

    def unbuildable_reason(self) -> str | None:
        """Why libllama would abort the process building this geometry, or None.

        libllama caps a batch at `min(n_ctx, n_batch)` outputs and reserves one per sequence:
        fewer than `n_parallel` fails a GGML_ASSERT (an abort, not an error it returns).
        """
        if min(self.n_ctx, self.n_batch) < self.n_parallel:
            return (
                f"n_ctx ({self.n_ctx}) and n_batch ({self.n_batch}) must each be at least "
                f"n_parallel ({self.n_parallel})"
            )
        return None

    def n_ctx_slot(self, n_ctx_train: int) -> int:
        """Each slot's window, as llama-server's `n_ctx_slot()`."""
        res = self.n_ctx_seq()
        if self.kv_unified_per_slot > 0:
            res = min(res, self.kv_unified_per_slot)
        return min(res, n_ctx_train)


def resolve_geometry(
    *,
    n_ctx: int,
    n_parallel: int,
    kv_unified: bool | None,
    kv_unified_per_slot: int,
    n_batch: int,
    n_ubatch: int,
    cache_type_k: str,
    cache_type_v: str,
    n_ctx_train: int,
) -> Geometry:
    """Turn the flags (with their auto values) into a concrete geometry."""
    unified = bool(kv_unified)
    if n_parallel < 0:
        n_parallel = AUTO_N_PARALLEL
        unified = True
    if n_ctx == 0 and kv_unified_per_slot > 0:
        n_ctx = n_parallel * kv_unified_per_slot
    elif n_ctx == 0:
        n_ctx = n_ctx_train
    n_ubatch = min(n_ubatch, n_batch)
    geometry = Geometry(
        n_ctx=n_ctx,
        n_parallel=n_parallel,
        kv_unified=unified,
        n_batch=n_batch,
        n_ubatch=n_ubatch,
        cache_type_k=cache_type_k,
        cache_type_v=cache_type_v,
        kv_unified_per_slot=kv_unified_per_slot,
    )
    reason = geometry.unbuildable_reason()
    if reason is not None:
        raise ValueError(reason)
    return geometry


@dataclass(frozen=True)
class ReconfigureSpec:
    """The body of POST /reconfigure; None keeps the current value."""

    n_ctx: int | None = None
    n_parallel: int | None = None
    cache_type_k: str | None = None
    cache_type_v: str | None = None
    n_batch: int | None = None
    n_ubatch: int | None = None
    force: bool = False  # allow a KV type change (residents and pages become token-only)
    drain_timeout_s: float = 30.0  # how long requests past the new n_parallel may drain
