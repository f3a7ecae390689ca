"""A libllama context: KV memory, decoding, sequence state and logits.

Owns the `llama_context` pointer. Every method must be called from the engine thread (the one
owner of contexts); nothing here is thread-safe. A logits view dies at the next `decode`, so
`logits` hands out a copy and `sample` samples in C without a Python-side copy.

Sequence state moves between RAM buffers and the context with one copy each way:
`state_size` then `state_get_into(buffer)` writes straight into a buffer the caller allocated
(a page's anonymous mmap, say), and `state_set_from(buffer)` reads from any buffer.
Pages and checkpoints never use `LLAMA_STATE_SEQ_FLAGS_ON_DEVICE`.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from kvswap.backend.batch import Batch
from kvswap.backend.bindings import llama_cpp
from kvswap.backend.model import Model
from kvswap.core.errors import ContextInitError

FLAGS_FULL = 0
FLAGS_PARTIAL_ONLY = llama_cpp.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY

# llama-server's `-ctk/-ctv` names -> ggml types.
KV_CACHE_TYPES: dict[str, int] = {
    "f32": llama_cpp.GGML_TYPE_F32,
    "f16": llama_cpp.GGML_TYPE_F16,
    "bf16": 30,  # GGML_TYPE_BF16 (not exported by the bindings)
    "q8_0": llama_cpp.GGML_TYPE_Q8_0,
    "q4_0": llama_cpp.GGML_TYPE_Q4_0,
    "q4_1": llama_cpp.GGML_TYPE_Q4_1,
    "iq4_nl": llama_cpp.GGML_TYPE_IQ4_NL,
    "q5_0": llama_cpp.GGML_TYPE_Q5_0,
    "q5_1": llama_cpp.GGML_TYPE_Q5_1,
}

_FLASH_ATTN = {
    "auto": llama_cpp.LLAMA_FLASH_ATTN_TYPE_AUTO,
    "on": llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED,
    "off": llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED,
}


@dataclass(frozen=True)
class ContextParams:
    """The geometry and threads of one context."""

    n_ctx: int  # the KV pool, in cells
    n_seq_max: int  # sequences (one per slot)
    n_batch: int
    n_ubatch: int
    kv_unified: bool
    cache_type_k: str = "f16"
    cache_type_v: str = "f16"
    n_threads: int = 1
    n_threads_batch: int = 1
    flash_attn: str = "auto"
    swa_full: bool = False
    # RoPE and YaRN (`--rope-*`, `--yarn-*`): (field of llama_context_params, value); a field
    # not listed keeps libllama's default (the model's own).
    rope: tuple[tuple[str, float], ...] = ()


def _as_u8_ptr(buf: Any) -> Any:
    """A `uint8_t *` to the start of any buffer (read-only ones included), without copying."""
    arr = np.frombuffer(buf, dtype=np.uint8)
    return ctypes.cast(arr.ctypes.data, ctypes.POINTER(ctypes.c_uint8)), arr


class Context:
    """One libllama context on a loaded model."""

    def __init__(self, model: Model, params: ContextParams) -> None:
        cparams = llama_cpp.llama_context_default_params()
        cparams.n_ctx = params.n_ctx
        cparams.n_batch = params.n_batch
        cparams.n_ubatch = params.n_ubatch
        cparams.n_seq_max = params.n_seq_max
        cparams.n_threads = params.n_threads
        cparams.n_threads_batch = params.n_threads_batch
        cparams.type_k = KV_CACHE_TYPES[params.cache_type_k]
        cparams.type_v = KV_CACHE_TYPES[params.cache_type_v]
        cparams.flash_attn_type = _FLASH_ATTN[params.flash_attn]
        cparams.swa_full = params.swa_full
        cparams.kv_unified = params.kv_unified
        cparams.no_perf = True
        for name, value in params.rope:
            setattr(cparams, name, value)
        ptr = llama_cpp.llama_init_from_model(model.ptr, cparams)
        if not ptr:
            raise ContextInitError(
                f"libllama could not create a context (n_ctx={params.n_ctx}, "
                f"n_seq_max={params.n_seq_max}, kv_unified={params.kv_unified}, "
                f"cache types {params.cache_type_k}/{params.cache_type_v})"
            )
        self.ptr = ptr
        self.model = model
        self.params = params
        self.mem = llama_cpp.llama_get_memory(ptr)
        self.n_ctx: int = llama_cpp.llama_n_ctx(ptr)
        self.n_ctx_seq: int = llama_cpp.llama_n_ctx_seq(ptr)
        self.n_vocab = model.info.n_vocab

    # -- decoding ---------------------------------------------------------------------------

    def decode(self, batch: Batch) -> int:
        """llama_decode: 0 ok, 1 no room in the KV pool, 2 aborted, < 0 error."""
        return int(llama_cpp.llama_decode(self.ptr, batch.as_llama_batch()))

    def logits(self, i: int) -> npt.NDArray[np.float32]:
        """A copy of the logits of batch output `i` (valid only until the next decode)."""
        ptr = llama_cpp.llama_get_logits_ith(self.ptr, i)
        if not ptr:
            raise IndexError(f"no logits for batch index {i}")
        return np.ctypeslib.as_array(ptr, shape=(self.n_vocab,)).copy()

    def sample(self, sampler: Any, i: int) -> int:
        """Sample batch output `i` with a sampler chain (accepts the token into the chain)."""
        return int(llama_cpp.llama_sampler_sample(sampler, self.ptr, i))

    # -- memory -----------------------------------------------------------------------------

    def seq_rm(self, seq_id: int, p0: int, p1: int = -1) -> bool:
        """Remove positions [p0, p1) of a sequence; False when the memory cannot cut there."""
        return bool(llama_cpp.llama_memory_seq_rm(self.mem, seq_id, p0, p1))

    def seq_clear(self, seq_id: int) -> None:
        llama_cpp.llama_memory_seq_rm(self.mem, seq_id, -1, -1)

    def seq_cp(self, src: int, dst: int, p0: int, p1: int) -> None:
        """Add sequence `dst` to the cells of `src` at positions [p0, p1): in one stream (a
        unified pool) the cells are shared, no data copied."""
        llama_cpp.llama_memory_seq_cp(self.mem, src, dst, p0, p1)

    def seq_pos_min(self, seq_id: int) -> int:
        return int(llama_cpp.llama_memory_seq_pos_min(self.mem, seq_id))

    def seq_pos_max(self, seq_id: int) -> int:
        return int(llama_cpp.llama_memory_seq_pos_max(self.mem, seq_id))

    def clear(self) -> None:
        llama_cpp.llama_memory_clear(self.mem, True)

    # -- sequence state ---------------------------------------------------------------------

    def state_size(self, seq_id: int, flags: int = FLAGS_FULL) -> int:
        return int(llama_cpp.llama_state_seq_get_size_ext(self.ptr, seq_id, flags))

    def state_get_into(self, seq_id: int, buf: Any, flags: int = FLAGS_FULL) -> int:
        """Write a sequence's state into a writable buffer; returns bytes written (0 = failed)."""
        ptr, keep = _as_u8_ptr(buf)
        n = int(llama_cpp.llama_state_seq_get_data_ext(self.ptr, ptr, keep.nbytes, seq_id, flags))
        del keep
        return n

    def state_set_from(self, seq_id: int, buf: Any, flags: int = FLAGS_FULL) -> bool:
        """Load a state (with its 8-byte prefix) into a sequence. On failure the sequence is
        cleared, so it never holds half a state."""
        ptr, keep = _as_u8_ptr(buf)
        n = int(llama_cpp.llama_state_seq_set_data_ext(self.ptr, ptr, keep.nbytes, seq_id, flags))
        del keep
        if n == 0:
            self.seq_clear(seq_id)
            return False
        return True

    def close(self) -> None:
        if self.ptr:
            llama_cpp.llama_free(self.ptr)
            self.ptr = None
