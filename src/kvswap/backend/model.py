"""A loaded GGUF model: weights, vocabulary, metadata and a fingerprint.

Owns the `llama_model` pointer (freed by `close`). Loading the model is separate from creating
contexts, so a reconfigure rebuilds contexts while the weights stay mapped. Read-only accessors
(metadata, vocabulary) are safe from any thread; contexts are created by the engine thread.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvswap.backend.bindings import llama_cpp
from kvswap.backend.info import ModelInfo
from kvswap.backend.vocab import Vocab

# How much of the file the fingerprint hashes: the header and tensor table live at the front.
_FINGERPRINT_HEAD_BYTES = 16 << 20
_FINGERPRINT_TAIL_BYTES = 1 << 20


class ModelLoadError(RuntimeError):
    """The GGUF file could not be loaded by libllama."""


@dataclass(frozen=True)
class ModelParams:
    """How to load the weights (from `ModelSettings`)."""

    n_gpu_layers: int = -1  # -1: all layers that fit, as llama-server's default
    use_mmap: bool = True
    use_mlock: bool = False
    kv_overrides: tuple[str, ...] = ()  # KEY=TYPE:VALUE (`--override-kv`), checked already


def _kv_overrides(items: tuple[str, ...]) -> Any:
    """libllama's array of metadata overrides (ended by an empty key), or None for none."""
    if not items:
        return None
    array = (llama_cpp.llama_model_kv_override * (len(items) + 1))()
    for entry, item in zip(array, items, strict=False):
        key, _, rest = item.partition("=")
        kind, _, value = rest.partition(":")
        entry.key = key.encode()
        if kind == "int":
            entry.tag, entry.value.val_i64 = llama_cpp.LLAMA_KV_OVERRIDE_TYPE_INT, int(value)
        elif kind == "float":
            entry.tag, entry.value.val_f64 = llama_cpp.LLAMA_KV_OVERRIDE_TYPE_FLOAT, float(value)
        elif kind == "bool":
            entry.tag = llama_cpp.LLAMA_KV_OVERRIDE_TYPE_BOOL
            entry.value.val_bool = value == "true"
        else:
            entry.tag, entry.value.val_str = llama_cpp.LLAMA_KV_OVERRIDE_TYPE_STR, value.encode()
    return array


def _meta_str(model: llama_cpp.llama_model_p, key: str) -> str | None:
    size = llama_cpp.llama_model_meta_val_str(model, key.encode(), None, 0)
    if size < 0:
        return None
    buf = ctypes.create_string_buffer(size + 1)
    llama_cpp.llama_model_meta_val_str(model, key.encode(), buf, size + 1)
    return buf.value.decode("utf-8", "replace")


def fingerprint_file(path: str) -> str:
    """Hash of the file's size, head (header, metadata, tensor table) and tail.

    Hashing the whole file would cost seconds for a large model at every start; the head holds
    every metadata key and tensor offset, and the tail the last tensor's bytes.
    """
    digest = hashlib.sha256()
    size = os.path.getsize(path)
    digest.update(size.to_bytes(8, "little"))
    with open(path, "rb") as f:
        digest.update(f.read(_FINGERPRINT_HEAD_BYTES))
        if size > _FINGERPRINT_HEAD_BYTES:
            f.seek(max(_FINGERPRINT_HEAD_BYTES, size - _FINGERPRINT_TAIL_BYTES))
            digest.update(f.read())
    return digest.hexdigest()[:32]


class Model:
    """A loaded model. Create with `Model.load`, release with `close`."""

    def __init__(self, ptr: llama_cpp.llama_model_p, info: ModelInfo) -> None:
        self.ptr: llama_cpp.llama_model_p | None = ptr
        self.info = info
        self.vocab = Vocab(llama_cpp.llama_model_get_vocab(ptr))

    @classmethod
    def load(cls, path: str | Path, params: ModelParams | None = None) -> Model:
        params = params or ModelParams()
        path = str(path)
        if not os.path.isfile(path):
            raise ModelLoadError(f"model file not found: {path}")
        llama_cpp.llama_backend_init()
        mparams = llama_cpp.llama_model_default_params()
        mparams.n_gpu_layers = params.n_gpu_layers if params.n_gpu_layers >= 0 else 999
        mparams.use_mmap = params.use_mmap
        mparams.use_mlock = params.use_mlock
        overrides = _kv_overrides(params.kv_overrides)  # read while loading: kept alive here
        if overrides is not None:
            mparams.kv_overrides = ctypes.cast(
                overrides, ctypes.POINTER(llama_cpp.llama_model_kv_override)
            )
        ptr = llama_cpp.llama_model_load_from_file(path.encode(), mparams)
        if not ptr:
            raise ModelLoadError(f"libllama could not load the model: {path}")
        desc = ctypes.create_string_buffer(256)
        llama_cpp.llama_model_desc(ptr, desc, 256)
        template = llama_cpp.llama_model_chat_template(ptr, None)
        info = ModelInfo(
            path=path,
            fingerprint=fingerprint_file(path),
            desc=desc.value.decode("utf-8", "replace"),
            n_ctx_train=llama_cpp.llama_model_n_ctx_train(ptr),
            n_embd=llama_cpp.llama_model_n_embd(ptr),
            n_layer=llama_cpp.llama_model_n_layer(ptr),
            n_head=llama_cpp.llama_model_n_head(ptr),
            n_head_kv=llama_cpp.llama_model_n_head_kv(ptr),
            n_params=llama_cpp.llama_model_n_params(ptr),
            size_bytes=llama_cpp.llama_model_size(ptr),
            n_vocab=llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(ptr)),
            n_swa=llama_cpp.llama_model_n_swa(ptr),
            is_recurrent=bool(llama_cpp.llama_model_is_recurrent(ptr)),
            is_hybrid=bool(llama_cpp.llama_model_is_hybrid(ptr)),
            chat_template=template.decode("utf-8", "replace") if template else None,
            architecture=_meta_str(ptr, "general.architecture") or "",
            ftype=(llama_cpp.llama_ftype_name(llama_cpp.llama_model_ftype(ptr)) or b"").decode(),
            vocab_type=llama_cpp.llama_vocab_type(llama_cpp.llama_model_get_vocab(ptr)),
        )
        return cls(ptr, info)

    def meta(self, key: str) -> str | None:
        """A GGUF metadata value as a string, or None when the key is absent."""
        assert self.ptr is not None, "model is closed"
        return _meta_str(self.ptr, key)

    def close(self) -> None:
        if self.ptr:
            llama_cpp.llama_model_free(self.ptr)
            self.ptr = None
