"""The engine a server runs, built from its flags with no HTTP and no event loop: its
configuration (`engine_config`), and the LoRA adapters, the draft model and the engine itself
(contexts made and warmed up, thread started) on a loaded model (`build_engine`).

`kvswap serve` hands `build_engine` to the model's prefetch thread (`server.prefetch`), so the
contexts are made and warmed up while the HTTP stack imports, not after it; a wake from
`--sleep-idle-seconds` builds the same way on the loader's thread. The built engine is the
loader's from then on (`Built`), reached through its client as everywhere on the HTTP side.
Imports the engine's client and libllama's bindings, nothing of the HTTP side.
"""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass

from kvswap.backend.lora import Adapters
from kvswap.backend.model import Model, ModelParams
from kvswap.config.extension import Extension, auto_extension
from kvswap.config.settings import ServerConfig
from kvswap.engine.client import EngineClient, StartedEngine
from kvswap.engine.plan.geometry import Geometry, resolve_geometry
from kvswap.engine.runtime import EngineConfig
from kvswap.engine.spec.speculate import SpecConfig, check_compatible
from kvswap.files.faults import clock_from_env

log = logging.getLogger("kvswap.server")


@dataclass(frozen=True)
class Built:
    """A started engine and the models beside the target it runs on (the loader closes them:
    the engine first, then the adapters, then the models)."""

    engine: StartedEngine
    adapters: Adapters
    draft_model: Model | None


def build_engine(config: ServerConfig, model: Model, geometry: Geometry | None = None) -> Built:
    """Load `model`'s LoRA adapters and the draft model (`--model-draft`), build the engine on
    them (`geometry`: a waking server's, else the flags') and start its thread."""
    adapters = Adapters.load(
        model,
        [(spec.path, spec.scale) for spec in config.model.lora],
        apply=not config.model.lora_init_without_apply,
    )
    draft: Model | None = None
    try:
        spec = config.spec
        if spec.spec_type == "draft-simple" and spec.model_draft is not None:
            params = ModelParams(
                n_gpu_layers=spec.n_gpu_layers_draft,
                use_mmap=config.model.use_mmap,
                use_mlock=config.model.use_mlock,
            )
            draft = Model.load(spec.model_draft, params)
            check_compatible(model, draft)
            log.info("draft model loaded: %s (%s)", spec.model_draft, draft.info.desc)
        scaling = model.meta(f"{model.info.architecture}.rope.scaling.type")
        engine_conf = engine_config(config, model.info.n_ctx_train, geometry, scaling)
        engine = EngineClient.build(model, engine_conf, adapters=adapters, draft_model=draft)
    except BaseException:
        adapters.close()
        if draft is not None:
            draft.close()
        raise
    return Built(engine, adapters, draft)


def engine_config(
    config: ServerConfig,
    n_ctx_train: int,
    geometry: Geometry | None = None,
    model_scaling: str | None = None,
) -> EngineConfig:
    """The engine's configuration: the start-up flags, with `geometry` (a waking server's live
    one) in place of the geometry they resolve to. The context extension kvswap turns on is
    the flags' (`_extension`), whatever the live geometry: a wake keeps the RoPE its
    minds were made under. `model_scaling`: the model's `rope.scaling.type`, when its metadata has one."""
    ctx = config.context
    flags_geometry = resolve_geometry(
        n_ctx=ctx.n_ctx,
        n_parallel=ctx.n_parallel,
        kv_unified=ctx.kv_unified_resolved,
        kv_unified_per_slot=ctx.kv_unified_per_slot,
        n_batch=ctx.n_batch,
        n_ubatch=ctx.n_ubatch,
        cache_type_k=ctx.cache_type_k,
        cache_type_v=ctx.cache_type_v,
        n_ctx_train=n_ctx_train,
    )
    geometry = geometry or flags_geometry
    extension = _extension(config, flags_geometry, n_ctx_train, model_scaling)
    return EngineConfig(
        geometry=geometry,
        n_threads=ctx.n_threads,
        n_threads_batch=ctx.n_threads_batch,
        flash_attn=ctx.flash_attn,
        swa_full=ctx.swa_full,
        rope=ctx.rope if extension is None else extension.rope,
        n_ctx_trained=0 if extension is None else extension.n_ctx_train,
        slot_prompt_similarity=config.paging.slot_prompt_similarity,
        ctx_checkpoints=ctx.ctx_checkpoints,
        checkpoint_min_step=ctx.checkpoint_min_step,
        ctx_checkpoints_bytes=ctx.ctx_checkpoints_bytes,
        cache_ram_bytes=config.paging.cache_ram_mib * (1 << 20)
        if config.paging.cache_ram_mib > 0
        else config.paging.cache_ram_mib,
        cache_idle_slots=config.paging.cache_idle_slots,
        spec=spec_config(config),
        page_ram_bytes=config.paging.page_ram_bytes,
        seed_from_minds=config.cluster.shared_tier is None,
        fault_on_install=os.environ.get("KVSWAP_FAULT_RECONFIGURE") == "1",
        check_integrity=os.environ.get("KVSWAP_CHECK_INTEGRITY") == "1",
        warmup=config.model.warmup,
        clock=clock_from_env(os.environ),  # the retention tests' seam
    )


def _extension(
    config: ServerConfig, flags: Geometry, n_ctx_train: int, model_scaling: str | None
) -> Extension | None:
    """The YaRN extension the flags' slots need (logged when there is one)."""
    extension = auto_extension(
        rope=config.context.rope,
        n_ctx_slot=flags.n_ctx_slot(sys.maxsize),
        n_ctx_train=n_ctx_train,
        model_scaling=model_scaling,
    )
    if extension is not None:
        log.info("%s", extension.describe(flags.n_ctx_slot(extension.n_ctx_train)))
    return extension


def spec_config(config: ServerConfig) -> SpecConfig | None:
    """The engine's speculative slice; None when `--spec-type` is none."""
    s = config.spec
    if s.spec_type == "none":
        return None
    return SpecConfig(
        spec_type=s.spec_type,
        n_max=s.n_max,
        n_min=s.n_min,
        p_min=s.p_min,
        ngram_size_n=s.ngram_size_n,
        ngram_size_m=s.ngram_size_m,
        cache_type_k_draft=s.cache_type_k_draft,
        cache_type_v_draft=s.cache_type_v_draft,
        n_threads_draft=s.n_threads_draft,
        n_threads_batch_draft=s.n_threads_batch_draft,
    )
