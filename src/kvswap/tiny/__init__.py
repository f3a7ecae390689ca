"""Tiny random-weight GGUF models for tests, speculative drafts and benchmarks.

`kvswap.tiny` writes small models of every architecture kvswap must serve (plain attention,
sliding window, recurrent, hybrid) with a real byte-level BPE vocabulary (or SmolLM2's), so the
real libllama can load and run them in milliseconds. Modules: params (what to generate),
vocab (tokenizer keys), archs (keys and tensor shapes per architecture), presets (realistic
KV bytes per token), writer (weights + GGUF), cache (shared folder of generated models),
cli (`kvswap make-tiny-model`). Nothing here imports libllama.
"""

from kvswap.tiny.archs import ARCHS, ArchSpec
from kvswap.tiny.cache import tiny_model_path, tiny_models_dir
from kvswap.tiny.params import Geometry, TinyModelError, TinyParams
from kvswap.tiny.presets import KV_PRESETS, realistic_kv_params
from kvswap.tiny.writer import GENERATOR_VERSION, WrittenModel, write_tiny_gguf

ARCH_NAMES: tuple[str, ...] = tuple(ARCHS)

__all__ = [
    "ARCHS",
    "ARCH_NAMES",
    "GENERATOR_VERSION",
    "KV_PRESETS",
    "ArchSpec",
    "Geometry",
    "TinyModelError",
    "TinyParams",
    "WrittenModel",
    "realistic_kv_params",
    "tiny_model_path",
    "tiny_models_dir",
    "write_tiny_gguf",
]
