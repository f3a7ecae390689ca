"""Tiny random LoRA adapters for a tiny base model: the GGUF that `--lora` loads.

Owns `write_tiny_lora()` and its cache (`tiny_lora_path`). The file is what llama.cpp's
`convert_lora_to_gguf.py` writes and `llama-adapter.cpp` expects: `general.type = "adapter"`,
`general.architecture` equal to the base's, `adapter.type = "lora"`, `adapter.lora.alpha`, and
for each adapted base weight `W` (ggml shape `[n_in, n_out]`) two tensors

    <W>.lora_a  ggml [n_in, rank]    (numpy (rank, n_in))
    <W>.lora_b  ggml [rank, n_out]   (numpy (n_out, rank))

so that libllama adds `scale * alpha / rank * B(A x)` to `W x`. The base is read with
`gguf.GGUFReader` for its architecture and shapes only. The adapted weights are every 2-D
attention and feed-forward matrix of the blocks (never the embedding or output). Weights are
random (not zero, as a fresh LoRA's B would be) so an adapter visibly changes greedy output.
Same base, seed, rank and alpha give a byte-identical file. Never imports libllama.
"""

from __future__ import annotations

import hashlib
import os
import re
import uuid
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGUFReader, GGUFWriter

from kvswap.tiny.cache import tiny_models_dir
from kvswap.tiny.params import TinyModelError

# Bump whenever the bytes written for the same base and parameters change.
LORA_GENERATOR_VERSION = 1

# Block matrices a LoRA adapts (llama.cpp's tensor names).
_TARGET = re.compile(r"^blk\.\d+\.(attn_(q|k|v|output)|ffn_(gate|up|down))\.weight$")
A_STD = 0.5
B_STD = 0.5


@dataclass(frozen=True)
class WrittenLora:
    path: Path
    n_bytes: int
    arch: str
    rank: int
    alpha: float
    n_adapted: int  # base weights adapted (two tensors each)


def _field_str(reader: GGUFReader, key: str) -> str:
    field = reader.fields.get(key)
    if field is None:
        raise TinyModelError(f"--base: the file has no {key}")
    return str(field.contents())


def adapted_weights(base: Path) -> tuple[str, list[tuple[str, int, int]]]:
    """The base's architecture and its adapted weights as (name, n_in, n_out)."""
    try:
        reader = GGUFReader(base)
    except (OSError, ValueError) as err:
        raise TinyModelError(f"--base: cannot read {base}: {err}") from err
    if "general.type" in reader.fields and _field_str(reader, "general.type") == "adapter":
        raise TinyModelError(f"--base: {base} is an adapter, not a model")
    arch = _field_str(reader, "general.architecture")
    weights = [
        (t.name, int(t.shape[0]), int(t.shape[1]))  # ggml order: [n_in, n_out]
        for t in reader.tensors
        if _TARGET.match(t.name) and len(t.shape) == 2
    ]
    if not weights:
        raise TinyModelError(f"--base: {base} has no attention or feed-forward matrices to adapt")
    return arch, weights


def _draw(name: str, seed: int, shape: tuple[int, int], std: float) -> np.ndarray:
    rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
    return rng.standard_normal(shape, dtype=np.float32) * np.float32(std / np.sqrt(shape[1]))


def write_tiny_lora(
    base: Path, out: Path, *, seed: int = 0, rank: int = 4, alpha: float | None = None
) -> WrittenLora:
    """Write a random LoRA adapter for `base` to `out` (atomically)."""
    if rank < 1:
        raise TinyModelError("--lora-rank: at least 1")
    alpha = float(rank if alpha is None else alpha)  # alpha = rank: scale 1 is the plain B(Ax)
    arch, weights = adapted_weights(Path(base))
    out = Path(out)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.{uuid.uuid4().hex}.tmp")
    writer = GGUFWriter(tmp, arch)
    try:
        writer.add_type("adapter")
        writer.add_string("adapter.type", "lora")
        writer.add_float32("adapter.lora.alpha", alpha)
        writer.add_string("general.name", f"tiny-random-lora-{arch}")
        for name, n_in, n_out in weights:
            stem = name.removesuffix(".weight")
            a = _draw(f"{stem}.lora_a", seed, (rank, n_in), A_STD)
            b = _draw(f"{stem}.lora_b", seed, (n_out, rank), B_STD)
            writer.add_tensor(f"{name}.lora_a", a)
            writer.add_tensor(f"{name}.lora_b", b)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        os.replace(tmp, out)
    finally:
        writer.close()
        tmp.unlink(missing_ok=True)
    return WrittenLora(out, out.stat().st_size, arch, rank, alpha, len(weights))


def tiny_lora_path(base: Path, *, seed: int = 0, rank: int = 4) -> Path:
    """Path of a tiny LoRA for `base` (by its content), generated on first use."""
    digest = hashlib.sha256(Path(base).read_bytes()).hexdigest()[:16]
    key = f"v{LORA_GENERATOR_VERSION}-{digest}-s{seed}-r{rank}"
    path = tiny_models_dir() / f"lora-{key}.gguf"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        write_tiny_lora(base, path, seed=seed, rank=rank)
    return path
