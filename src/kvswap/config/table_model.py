"""Flag table: the common llama-server flags kvswap implements (model, context, threads, logs).

Owns the entries and setters of these flags; `flags.py` runs them. Environment variable names,
aliases and defaults are the pinned llama-server's (`common/arg.cpp`).
"""

from __future__ import annotations

from kvswap.config.argspec import (
    Builder,
    Flag,
    Group,
    Kind,
    flag,
    set_bool,
    set_int,
    set_str,
)
from kvswap.config.settings import LOAD_MODES, VERBOSITY_ALL, LoraSpec
from kvswap.config.values import (
    read_cache_type,
    read_choice,
    read_float,
    read_gpu_layers,
    read_int,
    read_on_off_auto,
    split_csv,
)

VOID, TOGGLE, VALUE = Kind.VOID, Kind.TOGGLE, Kind.VALUE
COMMON = Group.COMMON


def _set_threads(b: Builder, v: str) -> None:
    b.threads["-t"] = read_int(v)


def _set_threads_batch(b: Builder, v: str) -> None:
    b.threads["-tb"] = read_int(v)


def _set_parallel(b: Builder, v: str) -> None:
    n = read_int(v)
    if n == 0:
        raise ValueError("invalid value for n_parallel")
    b.update("context", n_parallel=-1 if n < 0 else n)


def _set_lora(b: Builder, v: str) -> None:
    added = tuple(LoraSpec(path, 1.0) for path in split_csv(v))
    b.update("model", lora=b.model.lora + added)


def _set_lora_scaled(b: Builder, v: str) -> None:
    added: list[LoraSpec] = []
    for item in split_csv(v):
        parts = item.split(":")
        if len(parts) != 2:
            raise ValueError("lora-scaled format: FNAME:SCALE")
        added.append(LoraSpec(parts[0], read_float(parts[1])))
    b.update("model", lora=b.model.lora + tuple(added))


def _set_verbose(b: Builder, v: str) -> None:
    b.update("log", verbose=True, verbosity=VERBOSITY_ALL)


# fmt: off
FLAGS: tuple[Flag, ...] = (
    flag("-t --threads", VALUE, COMMON, _set_threads, env="LLAMA_ARG_THREADS", hint="N",
         help="CPU threads for generation (default: physical cores; <= 0: all logical CPUs)"),
    flag("-tb --threads-batch", VALUE, COMMON, _set_threads_batch, hint="N",
         help="threads for batch and prompt processing (default: same as --threads)"),
    flag("-c --ctx-size", VALUE, Group.MINDS, set_int("context", "n_ctx", lo=0),
         env="LLAMA_ARG_CTX_SIZE", hint="N",
         help="size of the KV pool in tokens (default: 0 = loaded from model); with -kvu one "
         "mind may grow to all of it (up to the model's training context), without it each of "
         "the -np slots gets an equal share"),
    flag("-n --predict --n-predict", VALUE, COMMON, set_int("sampling", "n_predict", lo=-1),
         env="LLAMA_ARG_N_PREDICT", hint="N",
         help="default number of tokens to predict (default: -1 = infinity)"),
    flag("-b --batch-size", VALUE, COMMON, set_int("context", "n_batch", lo=1),
         env="LLAMA_ARG_BATCH", hint="N", help="logical maximum batch size (default: 2048)"),
    flag("-ub --ubatch-size", VALUE, COMMON, set_int("context", "n_ubatch", lo=1),
         env="LLAMA_ARG_UBATCH", hint="N", help="physical maximum batch size (default: 512)"),
    flag("--keep", VALUE, COMMON, set_int("context", "n_keep", lo=-1), hint="N",
         help="tokens to keep from the initial prompt (default: 0, -1 = all)"),
    flag("--swa-full", VOID, COMMON, set_bool("context", "swa_full"), env="LLAMA_ARG_SWA_FULL",
         help="use full-size SWA cache (default: false)"),
    flag("--context-shift", TOGGLE, COMMON, set_bool("context", "context_shift"),
         neg="--no-context-shift", env="LLAMA_ARG_CONTEXT_SHIFT",
         help="context shift on infinite text generation (default: disabled)"),
    flag("-fa --flash-attn", VALUE, COMMON,
         lambda b, v: b.update("context", flash_attn=read_on_off_auto(v)),
         env="LLAMA_ARG_FLASH_ATTN", hint="[on|off|auto]",
         help="Flash Attention use (default: 'auto')"),
    flag("-e --escape", TOGGLE, COMMON, lambda b, v: setattr(b, "escape", v == "1"),
         neg="--no-escape",
         help="process escape sequences (\\n, \\r, \\t, \\', \\\", \\\\) (default: true)"),
    flag("-ctk --cache-type-k", VALUE, COMMON,
         lambda b, v: b.update("context", cache_type_k=read_cache_type(v)),
         env="LLAMA_ARG_CACHE_TYPE_K", hint="TYPE", help="KV cache data type for K (default: f16)"),
    flag("-ctv --cache-type-v", VALUE, COMMON,
         lambda b, v: b.update("context", cache_type_v=read_cache_type(v)),
         env="LLAMA_ARG_CACHE_TYPE_V", hint="TYPE", help="KV cache data type for V (default: f16)"),
    flag("-lm --load-mode", VALUE, COMMON,
         lambda b, v: b.update("model", load_mode=read_choice(v, LOAD_MODES)),
         env="LLAMA_ARG_LOAD_MODE", hint="MODE",
         help="model loading mode: auto, none, mmap, mlock, mmap+mlock, dio (default: auto)"),
    flag("--warmup", TOGGLE, COMMON, set_bool("model", "warmup"), neg="--no-warmup",
         help="whether to perform warmup with an empty run (default: enabled)"),
    flag("-ngl --gpu-layers --n-gpu-layers", VALUE, COMMON,
         lambda b, v: b.update("model", n_gpu_layers=read_gpu_layers(v)),
         env="LLAMA_ARG_N_GPU_LAYERS", hint="N",
         help="max. layers in VRAM: a number, 'auto' or 'all' (default: auto)"),
    flag("--lora", VALUE, COMMON, _set_lora, hint="FNAME",
         help="path to LoRA adapter (comma-separated values to load several)"),
    flag("--lora-scaled", VALUE, COMMON, _set_lora_scaled, hint="FNAME:SCALE,...",
         help="path to LoRA adapter with user defined scaling"),
    flag("-m --model", VALUE, COMMON, lambda b, v: b.update("model", path=v or None),
         env="LLAMA_ARG_MODEL", hint="FNAME",
         help="model path to load (default: the embedded SmolLM2 model)"),
    flag("-v --verbose --log-verbose", VOID, COMMON, _set_verbose,
         help="set verbosity level to infinity (log all messages)"),
    flag("-lv --verbosity --log-verbosity", VALUE, COMMON, set_int("log", "verbosity"),
         env="LLAMA_ARG_LOG_VERBOSITY", hint="N",
         help="verbosity threshold: 0 generic, 1 error, 2 warning, 3 info, 4 trace, 5 debug "
         "(default: 3)"),
    flag("--log-disable", VOID, COMMON, set_bool("log", "log_disable"), help="disable logging"),
    flag("--log-file", VALUE, COMMON, set_str("log", "log_file"), env="LLAMA_ARG_LOG_FILE",
         hint="FNAME", help="log to file"),
)

# -np is a server flag in llama-server's help; defined here with the other geometry flags.
PARALLEL = flag("-np --parallel", VALUE, Group.MINDS, _set_parallel, env="LLAMA_ARG_N_PARALLEL",
                hint="N", help="number of server slots (default: -1 = auto: 4, sharing one KV "
                "pool): the minds served at once; the others wait in RAM pages or on disk")
# fmt: on
