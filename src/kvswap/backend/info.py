"""`ModelInfo`: the facts about a loaded model that the rest of kvswap reads (never a pointer).

Built by `backend.model.Model` at load; a plain value, importable without libllama, so the
engine's policy objects that read it (a reconfigure's memory check and windows) build in a CPU
test on a hand-made one.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelInfo:
    """Facts about the model that the rest of kvswap reads (never a pointer)."""

    path: str
    fingerprint: str  # identifies weights + vocabulary; pages and slot files carry it
    desc: str
    n_ctx_train: int
    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    n_params: int
    size_bytes: int
    n_vocab: int
    n_swa: int
    is_recurrent: bool
    is_hybrid: bool
    chat_template: str | None
    architecture: str
    ftype: str  # quantization, e.g. "Q4_1"
    vocab_type: int  # enum llama_vocab_type
