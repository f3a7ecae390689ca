"""A `llama_batch` filled through numpy views of its arrays.

`llama_batch_init` allocates one small `seq_id` array per token. Every token kvswap submits
belongs to exactly one sequence, so at creation the per-token pointers are swapped for pointers
into one contiguous int32 array that numpy can fill in a single assignment; the original
pointers are put back before `llama_batch_free`, which frees them.

Owns the batch memory; used only by the engine thread.
"""

from __future__ import annotations

import ctypes

import numpy as np
import numpy.typing as npt

from kvswap.backend.bindings import llama_cpp


class Batch:
    """A reusable token batch of up to `capacity` tokens."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._raw = llama_cpp.llama_batch_init(capacity, 0, 1)
        raw = self._raw
        self.token = np.ctypeslib.as_array(raw.token, shape=(capacity,))
        self.pos = np.ctypeslib.as_array(raw.pos, shape=(capacity,))
        self.n_seq_id = np.ctypeslib.as_array(raw.n_seq_id, shape=(capacity,))
        logits_ptr = ctypes.cast(raw.logits, ctypes.POINTER(ctypes.c_int8))
        self.logits = np.ctypeslib.as_array(logits_ptr, shape=(capacity,))
        # Swap per-token seq_id pointers for pointers into one contiguous array.
        ptr_array = ctypes.cast(raw.seq_id, ctypes.POINTER(ctypes.c_uint64))
        self._seq_ptrs = np.ctypeslib.as_array(ptr_array, shape=(capacity,))
        self._orig_seq_ptrs = self._seq_ptrs.copy()
        self.seq_id: npt.NDArray[np.int32] = np.zeros(capacity, dtype=np.int32)
        base = self.seq_id.ctypes.data
        self._seq_ptrs[:] = base + 4 * np.arange(capacity, dtype=np.uint64)
        self.n_seq_id[:] = 1
        self.n_tokens = 0

    def clear(self) -> None:
        self.n_tokens = 0

    def add_span(
        self, tokens: npt.NDArray[np.int32], pos0: int, seq_id: int, want_last_logits: bool
    ) -> int:
        """Append `tokens` at positions pos0.. of `seq_id`; returns the batch index of the last."""
        n = len(tokens)
        start = self.n_tokens
        end = start + n
        if end > self.capacity:
            raise ValueError(f"batch overflow: {end} > {self.capacity}")
        self.token[start:end] = tokens
        self.pos[start:end] = np.arange(pos0, pos0 + n, dtype=np.int32)
        self.seq_id[start:end] = seq_id
        self.logits[start:end] = 0
        if want_last_logits:
            self.logits[end - 1] = 1
        self.n_tokens = end
        return end - 1

    def add_outputs(self, tokens: npt.NDArray[np.int32], pos0: int, seq_id: int) -> int:
        """Append `tokens` with logits requested for every one; returns the first index."""
        start = self.n_tokens
        self.add_span(tokens, pos0, seq_id, False)
        self.logits[start : self.n_tokens] = 1
        return start

    def as_llama_batch(self) -> llama_cpp.llama_batch:
        self._raw.n_tokens = self.n_tokens
        return self._raw

    def close(self) -> None:
        if self._raw is not None:
            self._seq_ptrs[:] = self._orig_seq_ptrs
            llama_cpp.llama_batch_free(self._raw)
            self._raw = None
