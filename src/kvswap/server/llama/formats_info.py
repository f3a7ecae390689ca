"""Response bodies that describe the server: GET /slots, /props and /v1/models.

Owns the plain views the engine and the server fill (`SlotView`, `PropsView`, `ModelView`)
and their JSON, in llama-server's shapes: `server_slot::to_json` and the SLOT_GET task
(`server-context.cpp`), `get_res_props`, `get_res_model_info` and `get_res_models`. kvswap's
additions to /props (`slot_page_version`, `context_geometry`) are kvswap's own (docs/DESIGN.md, "What you can watch").

Pure: no I/O, no engine calls, no clocks (`created` comes in as an argument).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvswap.core.sampling import SamplingParams
from kvswap.core.types import GenerationRequest
from kvswap.server.formats import (
    KvGeometry,
    TaskExtras,
    generation_settings_json,
    kv_geometry_json,
)

SLOT_PAGE_VERSION = 1


# ------------------------------------------------------------------------------------ /slots


@dataclass(frozen=True)
class SlotTaskView:
    """The task a slot runs, or ran last (llama-server shows `task` else `task_prev`)."""

    id_task: int
    request: GenerationRequest  # reported as `params`
    n_prompt_tokens: int  # tokens held in the slot (llama-server: prompt.tokens.size())
    n_prompt_tokens_processed: int  # evaluated for this task
    n_prompt_tokens_cache: int  # reused from the slot's cache
    has_next_token: bool
    has_new_line: bool
    n_remain: int  # -1: no limit
    n_decoded: int
    prompt: str = ""  # detokenized; shown only with debug
    generated: str = ""  # shown only with debug


@dataclass(frozen=True)
class SlotView:
    """One slot as the engine sees it between two steps."""

    id: int
    n_ctx: int  # the slot's window, n_ctx_slot
    speculative: bool  # has a draft model
    is_processing: bool
    task: SlotTaskView | None = None  # None: never ran a task
    mind: str | None = None  # the mind it holds, named only to that mind's own tenant


def slot_json(
    slot: SlotView, *, debug: bool = False, extras: TaskExtras | None = None
) -> dict[str, Any]:
    """`server_slot::to_json(only_metrics = !debug)`."""
    out: dict[str, Any] = {
        "id": slot.id,
        "n_ctx": slot.n_ctx,
        "speculative": slot.speculative,
        "is_processing": slot.is_processing,
    }
    if slot.mind is not None:
        out["mind"] = slot.mind  # kvswap's: the caller's own mind the slot holds
    task = slot.task
    if task is None:
        return out
    out["id_task"] = task.id_task
    out["n_prompt_tokens"] = task.n_prompt_tokens
    out["n_prompt_tokens_processed"] = task.n_prompt_tokens_processed
    out["n_prompt_tokens_cache"] = task.n_prompt_tokens_cache
    out["params"] = generation_settings_json(task.request, extras=extras, only_metrics=not debug)
    out["next_token"] = [
        {
            "has_next_token": task.has_next_token,
            "has_new_line": task.has_new_line,
            "n_remain": task.n_remain,
            "n_decoded": task.n_decoded,
        }
    ]
    if debug:
        out["prompt"] = task.prompt
        out["generated"] = task.generated
    return out


def slots_json(
    slots: Sequence[SlotView], *, debug: bool = False, speculative_types: str = "none"
) -> list[dict[str, Any]]:
    """GET /slots: one entry per slot, in id order (`speculative.types`: the server's)."""
    extras = TaskExtras(speculative_types=speculative_types)
    return [slot_json(slot, debug=debug, extras=extras) for slot in slots]


# ------------------------------------------------------------------------------------ /props


@dataclass(frozen=True)
class ContextGeometry:
    """/props `context_geometry`: the live geometry, bumped by each reconfigure."""

    target: KvGeometry
    draft: KvGeometry | None
    generation: int  # how many geometries the server has run (reconfigures + 1)


def context_geometry_json(g: ContextGeometry) -> dict[str, Any]:
    return {
        **kv_geometry_json(g.target),
        "draft": None if g.draft is None else kv_geometry_json(g.draft),
        "generation": g.generation,
    }


@dataclass(frozen=True)
class PropsView:
    """What GET /props reports; filled by the server from its config and the loaded model."""

    default_sampling: SamplingParams  # the server's defaults, as a request without fields gets
    model_alias: str  # the alias, else the model file name
    model_path: str
    model_ftype: str  # llama_ftype_name, e.g. "Q8_0"
    chat_template: str
    bos_token: str
    eos_token: str
    build_info: str
    geometry: ContextGeometry
    chat_template_tool_use: str = ""  # reported only with --jinja, when the model has one
    chat_template_caps: Mapping[str, bool] = field(default_factory=dict)
    use_jinja: bool = True
    endpoint_slots: bool = True
    endpoint_props: bool = False
    endpoint_metrics: bool = False
    is_sleeping: bool = False
    ui: bool = False  # --webui/--no-webui
    media_marker: str = "<__media__>"
    speculative_types: str = "none"  # --spec-type


def props_json(view: PropsView) -> dict[str, Any]:
    """`get_res_props`, plus `slot_page_version` and `context_geometry` (kvswap's own).

    `default_generation_settings.params` is `task_params::to_json(true)` of a default task
    holding the server's sampling: n_predict -1, no stream, as llama-server.
    """
    defaults = GenerationRequest(prompt_tokens=(), sampling=view.default_sampling)
    # A default task's chat parser params, and the server's speculative type.
    extras = TaskExtras(reasoning_format="none", speculative_types=view.speculative_types)

    props: dict[str, Any] = {
        "default_generation_settings": {
            "params": generation_settings_json(defaults, extras=extras, only_metrics=True),
            "n_ctx": view.geometry.target.n_ctx_slot,
        },
        "total_slots": view.geometry.target.n_parallel,
        "model_alias": view.model_alias,
        "model_ftype": view.model_ftype,
        "model_path": view.model_path,
        "modalities": {"vision": False, "video": False, "audio": False},
        "media_marker": view.media_marker,
        "endpoint_slots": view.endpoint_slots,
        "endpoint_props": view.endpoint_props,
        "endpoint_metrics": view.endpoint_metrics,
        "ui": view.ui,
        "ui_settings": {},
        "chat_template": view.chat_template,
        "chat_template_caps": dict(view.chat_template_caps),
        "bos_token": view.bos_token,
        "eos_token": view.eos_token,
        "build_info": view.build_info,
        "is_sleeping": view.is_sleeping,
        "cors_proxy_enabled": False,
    }
    if view.use_jinja and view.chat_template_tool_use:
        props["chat_template_tool_use"] = view.chat_template_tool_use
    props["slot_page_version"] = SLOT_PAGE_VERSION
    props["context_geometry"] = context_geometry_json(view.geometry)
    return props


# ----------------------------------------------------------------------------------- models


@dataclass(frozen=True)
class ModelView:
    """The loaded model, as /v1/models and /models describe it."""

    name: str  # the alias, else the model file name
    n_vocab: int
    n_ctx_slot: int
    n_ctx_train: int
    n_embd: int
    n_params: int
    size: int  # bytes
    vocab_type: int  # enum llama_vocab_type
    ftype: str
    aliases: tuple[str, ...] = ()
    tags: tuple[str, ...] = ()


def model_info_json(model: ModelView, *, created: int) -> dict[str, Any]:
    """`get_res_model_info`: one entry of `data`."""
    return {
        "id": model.name,
        "aliases": list(model.aliases),
        "tags": list(model.tags),
        "object": "model",
        "created": created,
        "owned_by": "llamacpp",
        "meta": {
            "vocab_type": model.vocab_type,
            "n_vocab": model.n_vocab,
            "n_ctx": model.n_ctx_slot,
            "n_ctx_train": model.n_ctx_train,
            "n_embd": model.n_embd,
            "n_params": model.n_params,
            "size": model.size,
            "ftype": model.ftype,
        },
    }


def models_json(model: ModelView, *, created: int) -> dict[str, Any]:
    """`get_res_models`: the Ollama-style `models` list, then OpenAI's `object`/`data`."""
    return {
        "models": [
            {
                "name": model.name,
                "model": model.name,
                "modified_at": "",
                "size": "",
                "digest": "",
                "type": "model",
                "description": "",
                "tags": [""],
                "capabilities": ["completion"],
                "parameters": "",
                "details": {
                    "parent_model": "",
                    "format": "gguf",
                    "family": "",
                    "families": [""],
                    "parameter_size": "",
                    "quantization_level": "",
                },
            }
        ],
        "object": "list",
        "data": [model_info_json(model, created=created)],
    }
