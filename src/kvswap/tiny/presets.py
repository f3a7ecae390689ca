"""Tiny llama geometries whose KV cache costs as many bytes per token as a real model's.

Owns `KV_PRESETS` and `realistic_kv_params()`. For benchmarks of paging and copying, what
matters is the bytes of KV per token (2 * n_layer * n_head_kv * head_dim * 2 at f16), not the
weights: so the preset keeps the real layer count, KV heads and head width, and shrinks
everything else (n_embd, n_ff, query heads) to what libllama still accepts. Pure data.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvswap.tiny.params import TinyModelError

# Width of everything that does not shape the KV cache. llama.cpp accepts n_embd smaller than
# n_head * head_dim (Q/K/V project up, O projects back down), down to n_embd 2 and n_ff 1;
# 8 keeps the RMS norms meaningful and the file ~0.4 MB at f16 for SmolLM2-135M's geometry.
REALISTIC_N_EMBD = 8
REALISTIC_N_FF = 8


@dataclass(frozen=True)
class KvShape:
    """The KV-cache geometry of a real model (its config.json / GGUF)."""

    n_layer: int
    n_head_kv: int
    head_dim: int
    n_ctx_train: int

    @property
    def kv_bytes_per_token_f16(self) -> int:
        return 2 * self.n_layer * self.n_head_kv * self.head_dim * 2


KV_PRESETS: dict[str, KvShape] = {
    # SmolLM2-135M: 30 layers, 9 query / 3 KV heads of 64 (read from its GGUF): 23,040 B/token.
    "smollm2-135m": KvShape(n_layer=30, n_head_kv=3, head_dim=64, n_ctx_train=8192),
    # SmolLM2-360M: 32 layers, 15 query / 5 KV heads of 64: 40,960 B/token.
    "smollm2-360m": KvShape(n_layer=32, n_head_kv=5, head_dim=64, n_ctx_train=8192),
    # Llama-3.1-8B: 32 layers, 32 query / 8 KV heads of 128: 131,072 B/token.
    "llama-3.1-8b": KvShape(n_layer=32, n_head_kv=8, head_dim=128, n_ctx_train=131072),
}


def realistic_kv_params(name: str) -> dict[str, int]:
    """`TinyParams` fields (arch llama) for a model with the KV bytes per token of `name`."""
    shape = KV_PRESETS.get(name)
    if shape is None:
        raise TinyModelError(f"--kv-like: unknown model {name!r} ({', '.join(KV_PRESETS)})")
    return {
        "n_layer": shape.n_layer,
        "n_head": shape.n_head_kv,  # no grouped queries: the fewest Q weights
        "n_head_kv": shape.n_head_kv,
        "head_dim": shape.head_dim,
        "n_embd": REALISTIC_N_EMBD,
        "n_ff": REALISTIC_N_FF,
        "n_ctx_train": shape.n_ctx_train,
    }
