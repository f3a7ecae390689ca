"""Random weights and GGUF writing for tiny models.

Owns `write_tiny_gguf()`: resolve a `TinyParams` against its architecture (archs.py), draw
every tensor from a generator seeded by (seed, tensor name), and write the GGUF with
`gguf.GGUFWriter` to a temporary file that is renamed into place, so a reader never sees half a
file. Same parameters and GENERATOR_VERSION give a byte-identical file. Does not decide where
files live (cache.py does) and never imports libllama.
"""

from __future__ import annotations

import json
import os
import uuid
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGUFValueType, GGUFWriter

from kvswap.tiny.archs import ARCHS, ArchSpec, kv_bytes_per_token
from kvswap.tiny.blocks import TensorSpec
from kvswap.tiny.params import Geometry, TinyModelError, TinyParams, resolve
from kvswap.tiny.vocab import Vocab, clean_token_mask, load_vocab

# Bump whenever the bytes written for the same parameters change (shapes, keys, init, vocab).
GENERATOR_VERSION = 1

EMBD_STD = 0.5  # wide top-1/top-2 logit gaps: stable greedy decoding (see TINY-MODELS.md)
SMALL_STD = 0.1
FILE_TYPE = {"f32": 0, "f16": 1}  # general.file_type: LLAMA_FTYPE_ALL_F32, _MOSTLY_F16


@dataclass(frozen=True)
class WrittenModel:
    path: Path
    n_bytes: int
    geometry: Geometry
    n_vocab: int
    n_tensors: int
    kv_bytes_per_token: int  # f16 K+V bytes per token in the attention cache (0: recurrent)


def resolve_params(params: TinyParams) -> tuple[ArchSpec, Geometry]:
    spec = ARCHS.get(params.arch)
    if spec is None:
        raise TinyModelError(f"--arch: unknown architecture {params.arch!r} ({', '.join(ARCHS)})")
    geometry = resolve(
        params,
        n_layer_default=spec.n_layer_default,
        n_embd_multiple=spec.n_embd_multiple,
        head_dim_fixed_by_n_embd=spec.head_dim_fixed_by_n_embd,
        has_attention=not spec.recurrent,
    )
    return spec, geometry


def tensor_specs(spec: ArchSpec, g: Geometry, n_vocab: int) -> list[TensorSpec]:
    out = [TensorSpec("token_embd.weight", (g.n_embd, n_vocab), "embd")]
    out += spec.global_tensors(g, n_vocab)
    for il in range(g.n_layer):
        out += spec.layer(g, il)
    return out


def init_tensor(ts: TensorSpec, seed: int) -> np.ndarray:
    """Float32 values for one tensor, in numpy order (ggml's shape reversed).

    Each tensor has its own generator, seeded by (seed, crc32(name)), so adding or resizing one
    tensor leaves the others' values alone.
    """
    values = _draw(ts, seed)
    return values if ts.scale == 1.0 else values * np.float32(ts.scale)


def _draw(ts: TensorSpec, seed: int) -> np.ndarray:
    rng = np.random.default_rng([seed, zlib.crc32(ts.name.encode())])
    shape = ts.shape[::-1]
    match ts.init:
        case "embd":
            return rng.standard_normal(shape, dtype=np.float32) * np.float32(EMBD_STD)
        case "mat" | "conv":  # fan-in scaling keeps activations O(1) through the layers
            scale = np.float32(1.0 / np.sqrt(ts.shape[0]))
            return rng.standard_normal(shape, dtype=np.float32) * scale
        case "small":
            return rng.standard_normal(shape, dtype=np.float32) * np.float32(SMALL_STD)
        case "one":
            return np.ones(shape, dtype=np.float32)
        case "zero":
            return np.zeros(shape, dtype=np.float32)
        case "mix":
            return rng.random(shape, dtype=np.float32)
        case "ssm_a":  # A = -exp(A_log) < 0: the state decays instead of blowing up
            return -rng.uniform(0.5, 4.0, shape).astype(np.float32)
        case "dt_bias":  # softplus(bias) ~ 0.02-0.13, the usual Mamba time-step range
            return rng.uniform(-4.0, -2.0, shape).astype(np.float32)
    raise AssertionError(f"unhandled init {ts.init!r}")


def _stored(ts: TensorSpec, values: np.ndarray, g: Geometry) -> np.ndarray:
    # Only 2-D matmul weights go to f16; norms, biases, conv kernels and SSM parameters stay
    # f32, as llama.cpp's converters keep them (several ggml ops want them f32).
    if g.dtype == "f16" and ts.init in ("embd", "mat") and len(ts.shape) == 2:
        return values.astype(np.float16)
    return values


def _add_key(writer: GGUFWriter, key: str, value: object) -> None:
    # Python type -> GGUF type, matching what llama.cpp's converters write.
    if isinstance(value, bool):
        writer.add_bool(key, value)
    elif isinstance(value, int):
        writer.add_uint32(key, value)
    elif isinstance(value, float):
        writer.add_float32(key, value)
    elif isinstance(value, str):
        writer.add_key_value(key, value, GGUFValueType.STRING)
    elif isinstance(value, list) and value and isinstance(value[0], str):
        writer.add_key_value(key, value, GGUFValueType.ARRAY, GGUFValueType.STRING)
    elif isinstance(value, list) and value and isinstance(value[0], int):
        writer.add_key_value(key, value, GGUFValueType.ARRAY, GGUFValueType.INT32)
    else:
        raise TypeError(f"no GGUF type for {key} = {value!r}")


def model_keys(spec: ArchSpec, g: Geometry, vocab: Vocab) -> dict[str, object]:
    """Every metadata key of the file except general.architecture (GGUFWriter adds it)."""
    arch_keys = {
        "context_length": g.n_ctx_train,
        "embedding_length": g.n_embd,
        "block_count": g.n_layer,
        "vocab_size": vocab.n_tokens,
        **spec.keys(g),
    }
    description = {"generator": "kvswap.tiny", "version": GENERATOR_VERSION, **g.as_dict()}
    return {
        "general.name": f"tiny-random-{g.arch}",
        "general.description": json.dumps(description, sort_keys=True),
        "general.file_type": FILE_TYPE[g.dtype],
        **{f"{g.arch}.{k}": v for k, v in arch_keys.items()},
        **vocab.gguf_keys(),
    }


def write_tiny_gguf(path: Path, params: TinyParams) -> WrittenModel:
    """Generate the model `params` describes and write it to `path` (atomically)."""
    spec, g = resolve_params(params)
    vocab = load_vocab(g.vocab)
    specs = tensor_specs(spec, g, vocab.n_tokens)
    output_name = "token_embd.weight" if spec.output_is_token_embd else "output.weight"
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex}.tmp")
    writer = GGUFWriter(tmp, g.arch)
    try:
        for key, value in model_keys(spec, g, vocab).items():
            _add_key(writer, key, value)
        for ts in specs:
            values = init_tensor(ts, g.seed)
            if g.clean_text and ts.name == output_name:
                # Rows are tokens: a zero row gives logit 0, far below the best of hundreds of
                # N(0, ~4) logits, so greedy decoding never picks these tokens.
                values[~clean_token_mask(vocab)] = 0.0
            writer.add_tensor(ts.name, _stored(ts, values, g))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        os.replace(tmp, path)
    finally:
        writer.close()
        tmp.unlink(missing_ok=True)
    return WrittenModel(
        path=path,
        n_bytes=path.stat().st_size,
        geometry=g,
        n_vocab=vocab.n_tokens,
        n_tensors=len(specs),
        kv_bytes_per_token=kv_bytes_per_token(spec, g),
    )
