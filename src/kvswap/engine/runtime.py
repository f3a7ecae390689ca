"""Everything one context geometry builds: the context, the batch, slot memory, the state mover,
the slot verbs, the page geometry, each slot's window and the step budget.

`Runtime.install(geo)` builds them on the loaded model (weights stay mapped); `close()` frees
them. A reconfigure closes the runtime and installs it again for the new geometry, so managers
that hold the runtime (seating, the anonymous cache, the reconfigurer, the step) always reach the
live context through it and never keep a stale one. Engine thread only.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from kvswap.backend.batch import Batch
from kvswap.backend.context import Context, ContextParams
from kvswap.backend.lora import Adapters
from kvswap.backend.model import Model
from kvswap.config.advice import Trained
from kvswap.config.extension import rope_fingerprint
from kvswap.core.page import PageGeometry
from kvswap.core.types import LoraSet
from kvswap.engine.kv.checkpoints import CheckpointBudget
from kvswap.engine.kv.memory import SlotMemory
from kvswap.engine.kv.pagestore import PageStore
from kvswap.engine.kv.slotstate import StateMover
from kvswap.engine.kv.verbs import PageCounters, SlotVerbs
from kvswap.engine.plan.geometry import Geometry
from kvswap.engine.slot import Slot
from kvswap.engine.spec.speculate import SpecConfig, Speculator


@dataclass(frozen=True)
class EngineConfig:
    """The engine's slice of the server configuration."""

    geometry: Geometry
    n_threads: int = 1
    # A new mind may start from another mind's prefix in RAM (`seats.mindprefix`); off in a
    # cluster, where a turn retried on another replica must write the same answer.
    seed_from_minds: bool = True
    n_threads_batch: int = 1
    flash_attn: str = "auto"
    swa_full: bool = False
    rope: tuple[tuple[str, float], ...] = ()  # RoPE/YaRN context params (`--rope-*`)
    # The training context a slot is capped at; 0 = the model's (an extension raises it).
    n_ctx_trained: int = 0
    slot_prompt_similarity: float = 0.1
    step_tokens: int = 0  # per-step token budget; 0 = n_ubatch
    ctx_checkpoints: int = 32  # per slot (--ctx-checkpoints)
    checkpoint_min_step: int = 8192  # tokens between spaced checkpoints; 0 = only near the end
    ctx_checkpoints_bytes: int = 0  # one byte budget over all slots; 0 = off
    spec: SpecConfig | None = None  # speculative decoding; None = off
    cache_ram_bytes: int = 0  # anonymous prompt cache (--cache-ram); 0 = off, -1 = no limit
    cache_idle_slots: bool = True  # --cache-idle-slots: a start saves (and clears) idle slots
    page_ram_bytes: int = 0  # the page store's ceiling (--page-ram-bytes); 0 = no store
    # A test seam: a reconfigure's context build fails, so its rollback path runs.
    fault_on_install: bool = False
    # Debug: every byte owner checks its integrity whenever the engine goes idle.
    check_integrity: bool = False
    # One empty decode when the engine is built (--warmup), as llama-server.
    warmup: bool = False
    # The retention floors' clock (unix seconds; a test seam moves it: files.faults).
    clock: Callable[[], float] = time.time


class Runtime:
    """See the module docstring. Attributes are valid between `install` and `close`."""

    @property
    def trained(self) -> Trained:
        """The model's training context, as a refusal's advice names it."""
        info = self.model.info
        return Trained(self.n_ctx_trained, info.architecture, info.n_ctx_train)

    def __init__(
        self,
        *,
        model: Model,
        config: EngineConfig,
        adapters: Adapters,
        spec: Speculator | None,
        store: PageStore | None,
        budget: CheckpointBudget,
        counters: PageCounters,
    ) -> None:
        self.model = model
        self.config = config
        self.adapters = adapters
        self.spec = spec
        self.store = store
        self.budget = budget
        self.counters = counters
        info = model.info
        self.n_ctx_trained = config.n_ctx_trained or info.n_ctx_train
        self.swa_window = 0 if config.swa_full else info.n_swa
        self.needs_checkpoints = info.is_recurrent or info.is_hybrid or self.swa_window > 0
        self.install(config.geometry)

    def install(self, geo: Geometry) -> None:
        """Build the context and everything bound to it for `geo`.

        Raises ContextInitError when libllama cannot build it; nothing is installed then."""
        config, info = self.config, self.model.info
        params = ContextParams(
            n_ctx=geo.n_ctx,
            n_seq_max=geo.n_parallel,
            n_batch=geo.n_batch,
            n_ubatch=geo.n_ubatch,
            kv_unified=geo.kv_unified,
            cache_type_k=geo.cache_type_k,
            cache_type_v=geo.cache_type_v,
            n_threads=config.n_threads,
            n_threads_batch=config.n_threads_batch,
            flash_attn=config.flash_attn,
            swa_full=config.swa_full,
            rope=config.rope,
        )
        ctx = Context(self.model, params)
        if self.spec is not None:
            try:
                self.spec.install(params, geo.n_batch)
            except BaseException:
                ctx.close()
                raise
        self.geometry = geo
        self.ctx = ctx
        self.lora_applied: LoraSet | None = None  # a new context starts without adapters
        self.n_ctx_slot = min(ctx.n_ctx_seq, self.n_ctx_trained)
        if geo.kv_unified_per_slot > 0:
            self.n_ctx_slot = min(self.n_ctx_slot, geo.kv_unified_per_slot)
        self.step_budget = max(1, min(config.step_tokens or geo.n_ubatch, geo.n_batch))
        n_spec = 1 + self.spec.per_slot_cap if self.spec is not None else 1
        self.batch = Batch(max(self.step_budget, geo.n_parallel * n_spec))
        self.page_geometry = PageGeometry(
            model_fingerprint=rope_fingerprint(info.fingerprint, config.rope),
            cache_type_k=geo.cache_type_k,
            cache_type_v=geo.cache_type_v,
            n_stream=1 if geo.kv_unified else geo.n_parallel,
            n_ctx_slot=self.n_ctx_slot,
        )
        self.memory = SlotMemory(
            ctx,
            needs_checkpoints=self.needs_checkpoints,
            swa_window=self.swa_window,
            budget=self.budget,
            n_ubatch=geo.n_ubatch,
            min_step=config.checkpoint_min_step,
        )
        self.mover = StateMover(
            ctx,
            self.memory,
            self.page_geometry,
            self.model.vocab.n_tokens,
            self.n_ctx_slot,
            self.adapters.infos,
            draft=self.spec.draft if self.spec is not None else None,
        )
        self.verbs = SlotVerbs(ctx, self.mover, self.store)

    @property
    def n_shared_cells(self) -> int | None:
        """The KV cells every slot draws on (a unified pool), or None when each slot has a
        stream of its own, as large as its window, or a recurrent model holds one cell per
        slot whatever its tokens."""
        if not self.geometry.kv_unified or self.model.info.is_recurrent:
            return None
        return self.ctx.n_ctx

    def warm_up(self) -> None:
        """Decode BOS and EOS on sequence 0, then clear the memory (llama-server's `--warmup`):
        the weights are faulted in and the compute buffers allocated now, not on the first
        request. Before the engine thread starts, or on it."""
        vocab = self.model.vocab
        tokens = [t for t in (vocab.bos, vocab.eos) if vocab.valid(t)] or [0]
        self.batch.clear()
        self.batch.add_span(np.asarray(tokens, dtype=np.int32), 0, 0, True)
        self.ctx.decode(self.batch)
        self.batch.clear()
        self.ctx.clear()

    def apply_lora(self, lora: LoraSet) -> None:
        """Make `lora` the context's active adapter set (a no-op when it already is)."""
        if lora != self.lora_applied:
            self.adapters.apply(self.ctx, lora)
            self.lora_applied = lora

    def check_integrity(self, slots: Sequence[Slot]) -> None:
        """Assert each slot's tokens are what the context holds for its sequence, and its
        checkpoints agree with it (engine thread, between steps)."""
        for slot in slots:
            pos_max = self.ctx.seq_pos_max(slot.seq_id)
            n = len(slot.tokens)
            assert pos_max == n - 1, f"slot {slot.id} holds {n} tokens, its KV ends at {pos_max}"
        self.memory.check_integrity({s.id: len(s.tokens) for s in slots})

    def close(self) -> None:
        """Free the context and what is bound to it (the weights stay)."""
        self.batch.close()
        if self.spec is not None:
            self.spec.uninstall()
        self.ctx.close()
