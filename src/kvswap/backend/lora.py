"""LoRA adapters: loading them on a model, and setting a context's active set.

Owns the `llama_adapter_lora` pointers of the adapters loaded at start-up (`--lora`,
`--lora-scaled`), in load order, and frees them (before the model) in `close`. Each adapter is
identified outside this process by the SHA-256 of its file, not by its index: pages and slot
files name the adapters their KV was computed under by hash, so a server that loads the same
files in another order still recognises them.

libllama applies adapters per context (`llama_set_adapters_lora`, which re-plans the compute
graph only when the set changes), so the engine thread calls `apply` before each decode with
the set of the slots in that batch. `load` runs on the loader thread before the engine starts;
`apply` only on the engine thread.
"""

from __future__ import annotations

import ctypes
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

from kvswap.backend.bindings import llama_cpp
from kvswap.backend.context import Context
from kvswap.backend.model import Model


class AdapterLoadError(RuntimeError):
    """A LoRA adapter file could not be loaded for this model."""


@dataclass(frozen=True)
class AdapterInfo:
    """One loaded adapter, as /lora-adapters reports it and pages identify it."""

    id: int  # its index in load order (what requests and POST /lora-adapters name)
    path: str
    sha256: str  # of the whole file
    scale: float  # the start-up global scale (--lora 1.0, --lora-scaled S, 0 without apply)
    task_name: str
    prompt_prefix: str


def file_sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _meta(ptr: llama_cpp.llama_adapter_lora_p, key: str) -> str:
    buf = ctypes.create_string_buffer(1024)
    n = llama_cpp.llama_adapter_meta_val_str(ptr, key.encode(), buf, len(buf))
    return buf.value.decode("utf-8", "replace") if n >= 0 else ""


class Adapters:
    """The adapters loaded on one model, in load order."""

    def __init__(self) -> None:
        self._ptrs: list[llama_cpp.llama_adapter_lora_p] = []
        self.infos: tuple[AdapterInfo, ...] = ()

    @classmethod
    def load(
        cls, model: Model, specs: Sequence[tuple[str, float]], *, apply: bool = True
    ) -> Adapters:
        """Load (path, scale) pairs; `apply=False` starts every global scale at 0
        (`--lora-init-without-apply`). Raises AdapterLoadError, freeing what was loaded."""
        out = cls()
        try:
            for path, scale in specs:
                out.add(model, path, scale if apply else 0.0)
        except BaseException:
            out.close()
            raise
        return out

    def add(self, model: Model, path: str, scale: float) -> None:
        """Load one more adapter at global scale `scale`."""
        try:
            sha256 = file_sha256(path)
        except OSError as err:
            raise AdapterLoadError(f"failed to load lora adapter '{path}': {err}") from err
        ptr = llama_cpp.llama_adapter_lora_init(model.ptr, path.encode())
        if not ptr:
            raise AdapterLoadError(
                f"failed to load lora adapter '{path}' (not a LoRA GGUF for this model)"
            )
        self._ptrs.append(ptr)  # freed by close(), also when refused below
        if llama_cpp.llama_adapter_get_alora_n_invocation_tokens(ptr) > 0:
            # An activated LoRA applies from its invocation tokens on; kvswap applies a set to
            # whole sequences, so it would compute the wrong KV.
            raise AdapterLoadError(
                f"lora adapter '{path}' is an activated LoRA (alora): not supported by kvswap"
            )
        info = AdapterInfo(
            id=len(self.infos),
            path=path,
            sha256=sha256,
            scale=scale,
            task_name=_meta(ptr, "adapter.lora.task_name"),
            prompt_prefix=_meta(ptr, "adapter.lora.prompt_prefix"),
        )
        self.infos = (*self.infos, info)

    def __len__(self) -> int:
        return len(self._ptrs)

    def apply(self, ctx: Context, lora: Sequence[tuple[int, float]]) -> None:
        """Make `lora` ((adapter id, scale) pairs; others off) the context's active set."""
        n = len(lora)
        array = llama_cpp.llama_adapter_lora_p_ctypes * n
        ptrs = array(*(self._ptrs[i] for i, _ in lora))  # type: ignore[misc]
        scales = (ctypes.c_float * n)(*(scale for _, scale in lora))
        llama_cpp.llama_set_adapters_lora(ctx.ptr, ptrs, n, scales)

    def close(self) -> None:
        """Free every adapter (call after the contexts that used them, before the model)."""
        for ptr in self._ptrs:
            llama_cpp.llama_adapter_lora_free(ptr)
        self._ptrs = []
