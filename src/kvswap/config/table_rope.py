"""Flag table: RoPE and YaRN (llama-server's context extension) and `--override-kv`.

Owns `--rope-scaling {none,linear,yarn}`, `--rope-scale N` (a frequency scale of 1/N),
`--rope-freq-base`, `--rope-freq-scale`, `--yarn-orig-ctx`, `--yarn-ext-factor`,
`--yarn-attn-factor`, `--yarn-beta-slow` and `--yarn-beta-fast`, read as llama-server's
`common/arg.cpp` reads them: each sets one field of libllama's context parameters
(`ContextSettings.rope`, applied to every context of the target model), a flag not given
leaving the model's own value. And `--override-kv KEY=TYPE:VALUE,...` (types int, float, bool,
str, as `string_parse_kv_override`): the model's metadata as libllama loads it
(`ModelSettings.kv_overrides`), so `--override-kv llama.context_length=int:32768` with
`--rope-scaling yarn --rope-scale 4` lets a slot hold four times the training context.
"""

from __future__ import annotations

from kvswap.config.argspec import Builder, Flag, Group, Kind, Setter, flag
from kvswap.config.values import read_float, read_int

VALUE, COMMON = Kind.VALUE, Group.COMMON

# libllama's `enum llama_rope_scaling_type`
SCALING_TYPES = {"none": 0, "linear": 1, "yarn": 2}
KV_TYPES = ("int:", "float:", "bool:", "str:")


def _rope(b: Builder, field: str, value: float) -> None:
    kept = tuple((k, v) for k, v in b.context.rope if k != field)
    b.update("context", rope=(*kept, (field, value)))


def _set_scaling(b: Builder, v: str) -> None:
    if v not in SCALING_TYPES:
        raise ValueError(f"{v!r}: one of none, linear, yarn")
    _rope(b, "rope_scaling_type", SCALING_TYPES[v])


def _set_scale(b: Builder, v: str) -> None:
    scale = read_float(v)
    if scale <= 0:
        raise ValueError(f"{v}: a RoPE scale is positive")
    _rope(b, "rope_freq_scale", 1.0 / scale)


def _float_field(field: str) -> Setter:
    return lambda b, v: _rope(b, field, read_float(v))


def _set_orig_ctx(b: Builder, v: str) -> None:
    _rope(b, "yarn_orig_ctx", read_int(v, 0))


def _set_override_kv(b: Builder, v: str) -> None:
    items = tuple(item for item in v.split(",") if item)
    for item in items:
        check_override(item)
    b.update("model", kv_overrides=(*b.model.kv_overrides, *items))


def check_override(item: str) -> tuple[str, str, str]:
    """`KEY=TYPE:VALUE` as (key, type, value); ValueError naming what is wrong."""
    key, sep, rest = item.partition("=")
    if not sep or not key or len(key.encode()) >= 128:
        raise ValueError(f"malformed KV override {item!r} (KEY=TYPE:VALUE)")
    kind = next((t for t in KV_TYPES if rest.startswith(t)), None)
    if kind is None:
        raise ValueError(f"invalid type for KV override {item!r} (int, float, bool or str)")
    value = rest[len(kind) :]
    if kind == "int:":
        read_int(value, -(1 << 63), (1 << 63) - 1)
    elif kind == "float:":
        read_float(value)
    elif kind == "bool:" and value not in ("true", "false"):
        raise ValueError(f"invalid boolean value for KV override {item!r}")
    elif kind == "str:" and len(value.encode()) > 127:
        raise ValueError(f"KV override {item!r}: a value of at most 127 bytes")
    return key, kind[:-1], value


# fmt: off
FLAGS: tuple[Flag, ...] = (
    flag("--rope-scaling", VALUE, COMMON, _set_scaling, env="LLAMA_ARG_ROPE_SCALING_TYPE",
         hint="{none,linear,yarn}",
         help="RoPE frequency scaling method (default: the model's; usually linear)"),
    flag("--rope-scale", VALUE, COMMON, _set_scale, env="LLAMA_ARG_ROPE_SCALE", hint="N",
         help="RoPE context scaling factor: expands the context by a factor of N"),
    flag("--rope-freq-base", VALUE, COMMON, _float_field("rope_freq_base"),
         env="LLAMA_ARG_ROPE_FREQ_BASE", hint="N",
         help="RoPE base frequency, used by NTK-aware scaling (default: the model's)"),
    flag("--rope-freq-scale", VALUE, COMMON, _float_field("rope_freq_scale"),
         env="LLAMA_ARG_ROPE_FREQ_SCALE", hint="N",
         help="RoPE frequency scaling factor: expands the context by a factor of 1/N"),
    flag("--yarn-orig-ctx", VALUE, COMMON, _set_orig_ctx, env="LLAMA_ARG_YARN_ORIG_CTX",
         hint="N", help="YaRN: original context size of the model (default: 0 = the model's "
         "training context)"),
    flag("--yarn-ext-factor", VALUE, COMMON, _float_field("yarn_ext_factor"),
         env="LLAMA_ARG_YARN_EXT_FACTOR", hint="N",
         help="YaRN: extrapolation mix factor (default: -1.00, the model's; 0.0 = full "
         "interpolation)"),
    flag("--yarn-attn-factor", VALUE, COMMON, _float_field("yarn_attn_factor"),
         env="LLAMA_ARG_YARN_ATTN_FACTOR", hint="N",
         help="YaRN: scale sqrt(t) or attention magnitude (default: the model's)"),
    flag("--yarn-beta-slow", VALUE, COMMON, _float_field("yarn_beta_slow"),
         env="LLAMA_ARG_YARN_BETA_SLOW", hint="N",
         help="YaRN: high correction dim or alpha (default: the model's)"),
    flag("--yarn-beta-fast", VALUE, COMMON, _float_field("yarn_beta_fast"),
         env="LLAMA_ARG_YARN_BETA_FAST", hint="N",
         help="YaRN: low correction dim or beta (default: the model's)"),
    flag("--override-kv", VALUE, COMMON, _set_override_kv, hint="KEY=TYPE:VALUE,...",
         help="advanced option to override model metadata by key; may be given several times "
         "(types: int, float, bool, str), e.g. --override-kv llama.context_length=int:32768"),
)
# fmt: on
