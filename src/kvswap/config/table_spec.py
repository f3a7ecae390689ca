"""Flag table: speculative decoding, and the flags llama-server has removed.

Owns the entries and setters of the speculative flags kvswap implements (`draft-simple`,
`ngram-simple`), the speculative type names of the pinned llama-server, and the removed flags
with the replacement each one names. Which types kvswap runs is checked in `flags.py` after
every flag is read, because llama-server accumulates `--spec-type` values.
"""

from __future__ import annotations

from kvswap.config.argspec import Builder, Flag, Group, Kind, flag, set_float, set_int
from kvswap.config.values import read_cache_type, read_gpu_layers, read_int

VALUE, VOID = Kind.VALUE, Kind.VOID
SPEC = Group.SPEC

# Every type the pinned llama-server knows (common/speculative.cpp), and those kvswap runs.
SPEC_TYPES: tuple[str, ...] = (
    "none",
    "draft-simple",
    "draft-eagle3",
    "draft-mtp",
    "draft-dflash",
    "draft-dspark",
    "ngram-simple",
    "ngram-map-k",
    "ngram-map-k4v",
    "ngram-mod",
    "ngram-cache",
)
SUPPORTED_SPEC_TYPES: tuple[str, ...] = ("none", "draft-simple", "ngram-simple")


def _add_spec_types(b: Builder, v: str) -> None:
    names = v.split(",")
    for name in names:
        if name not in SPEC_TYPES:
            raise ValueError(f"unknown speculative type: {name}")
    if "none" in names:  # as llama-server: 'none' anywhere in one list means just 'none'
        names = ["none"]
    b.spec_types.extend((name, b.source) for name in names)


def _spec_default(b: Builder, v: str) -> None:
    b.spec_types.append(("ngram-mod", b.source))


def _set_draft_threads(b: Builder, v: str) -> None:
    b.threads["-td"] = read_int(v)


def _set_draft_threads_batch(b: Builder, v: str) -> None:
    b.threads["-tbd"] = read_int(v)


def _removed(names: str, replacement: str, env: str | None = None) -> Flag:
    help_text = f"the argument has been removed. {replacement}"
    return flag(names, VALUE, Group.REMOVED, env=env, hint="N", help=help_text, removed=replacement)


# fmt: off
FLAGS: tuple[Flag, ...] = (
    flag("--spec-draft-threads -td --threads-draft", VALUE, SPEC, _set_draft_threads,
         hint="N", help="threads of the draft model for generation (default: same as "
         "--threads)"),
    flag("--spec-draft-threads-batch -tbd --threads-batch-draft", VALUE, SPEC,
         _set_draft_threads_batch, hint="N",
         help="threads of the draft model for batches (default: same as --threads-batch)"),
    flag("--spec-draft-type-k -ctkd --cache-type-k-draft", VALUE, SPEC,
         lambda b, v: b.update("spec", cache_type_k_draft=read_cache_type(v)),
         env="LLAMA_ARG_SPEC_DRAFT_CACHE_TYPE_K", hint="TYPE",
         help="KV cache data type for K for the draft model (default: f16)"),
    flag("--spec-draft-type-v -ctvd --cache-type-v-draft", VALUE, SPEC,
         lambda b, v: b.update("spec", cache_type_v_draft=read_cache_type(v)),
         env="LLAMA_ARG_SPEC_DRAFT_CACHE_TYPE_V", hint="TYPE",
         help="KV cache data type for V for the draft model (default: f16)"),
    flag("--spec-draft-n-max", VALUE, SPEC, set_int("spec", "n_max", lo=0),
         env="LLAMA_ARG_SPEC_DRAFT_N_MAX", hint="N",
         help="number of tokens to draft for speculative decoding (default: 3)"),
    flag("--spec-draft-n-min", VALUE, SPEC, set_int("spec", "n_min"),
         env="LLAMA_ARG_SPEC_DRAFT_N_MIN", hint="N",
         help="minimum number of draft tokens to use for speculative decoding (default: 0)"),
    flag("--spec-draft-p-min --draft-p-min", VALUE, SPEC, set_float("spec", "p_min"),
         env="LLAMA_ARG_SPEC_DRAFT_P_MIN", hint="P",
         help="minimum speculative decoding probability (greedy) (default: 0.00)"),
    flag("--spec-draft-ngl -ngld --gpu-layers-draft --n-gpu-layers-draft", VALUE, SPEC,
         lambda b, v: b.update("spec", n_gpu_layers_draft=read_gpu_layers(v)),
         env="LLAMA_ARG_N_GPU_LAYERS_DRAFT", hint="N",
         help="max. draft model layers in VRAM: a number, 'auto' or 'all' (default: auto)"),
    flag("--spec-draft-model -md --model-draft", VALUE, SPEC,
         lambda b, v: b.update("spec", model_draft=v or None), env="LLAMA_ARG_SPEC_DRAFT_MODEL",
         hint="FNAME", help="draft model for speculative decoding (default: unused)"),
    flag("--spec-type", VALUE, SPEC, _add_spec_types, env="LLAMA_ARG_SPEC_TYPE",
         hint="[none|draft-simple|ngram-simple]",
         help="type of speculative decoding (default: none); kvswap runs one of none, "
         "draft-simple, ngram-simple"),
    flag("--spec-ngram-simple-size-n", VALUE, SPEC, set_int("spec", "ngram_size_n", 1, 1024),
         hint="N", help="ngram-simple: length of the lookup n-gram (default: 12)"),
    flag("--spec-ngram-simple-size-m", VALUE, SPEC, set_int("spec", "ngram_size_m", 1, 1024),
         hint="N", help="ngram-simple: length of the drafted m-gram (default: 48)"),
    flag("--spec-ngram-simple-min-hits", VALUE, SPEC,
         set_int("spec", "ngram_min_hits", lo=1), hint="N",
         help="ngram-simple: minimum hits at lookup (default: 1)"),
    flag("--spec-default", VOID, SPEC, _spec_default,
         help="llama-server's default speculative config (ngram-mod: not supported by kvswap)"),
)

REMOVED: tuple[Flag, ...] = (
    _removed("--draft --draft-n --draft-max",
             "use --spec-draft-n-max or --spec-ngram-mod-n-max", env="LLAMA_ARG_DRAFT_MAX"),
    _removed("--draft-min --draft-n-min",
             "use --spec-draft-n-min or --spec-ngram-mod-n-min", env="LLAMA_ARG_DRAFT_MIN"),
    _removed("--spec-ngram-size-n", "use the respective --spec-ngram-*-size-n"),
    _removed("--spec-ngram-size-m", "use the respective --spec-ngram-*-size-m"),
    _removed("--spec-ngram-min-hits", "use the respective --spec-ngram-*-min-hits"),
)
# fmt: on
