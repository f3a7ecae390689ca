"""Flag table: the sampling flags, which set the defaults of a request's sampling fields.

Owns the entries and setters of llama-server's sampling flags that kvswap implements, and the
sampler names (`--samplers`) and letters (`--sampler-seq`) llama-server accepts.
"""

from __future__ import annotations

import math
import re

from kvswap.config.argspec import Builder, Flag, Group, Kind, flag, set_bool, set_float, set_int
from kvswap.config.values import read_float, read_int
from kvswap.core.sampling import LLAMA_DEFAULT_SEED

VALUE, VOID = Kind.VALUE, Kind.VOID
SAMPLING = Group.SAMPLING

# llama-server's canonical sampler names (common_sampler_type_to_str) and their letters.
SAMPLER_LETTERS: dict[str, str] = {
    "d": "dry",
    "k": "top_k",
    "y": "typ_p",
    "p": "top_p",
    "s": "top_n_sigma",
    "m": "min_p",
    "t": "temperature",
    "x": "xtc",
    "i": "infill",
    "e": "penalties",
    "a": "adaptive_p",
}


def _sampler_names() -> dict[str, str]:
    """Every accepted spelling -> canonical name, as common_sampler_types_from_names."""
    names = {name: name for name in SAMPLER_LETTERS.values()}
    for canonical in list(names):
        if "_" in canonical:
            names[canonical.replace("_", "-")] = canonical  # kebab-case: top-k
            names[canonical.replace("_", "")] = canonical  # no dash: topk
    names.update({"nucleus": "top_p", "temp": "temperature", "typ": "typ_p"})
    return names


def _set_samplers(b: Builder, v: str) -> None:
    names = _sampler_names()
    chain: list[str] = []
    for word in v.split(";"):
        if word == "":
            continue
        if word.lower() not in names:
            raise ValueError(f"unknown sampler {word!r}: expected {', '.join(sorted(names))}")
        chain.append(names[word.lower()])
    b.update("sampling", samplers=tuple(chain))


def _set_sampler_seq(b: Builder, v: str) -> None:
    unknown = sorted(set(v) - set(SAMPLER_LETTERS))
    if unknown:
        raise ValueError(
            f"unknown sampler letter(s) {''.join(unknown)!r}: expected {''.join(SAMPLER_LETTERS)}"
        )
    b.update("sampling", samplers=tuple(SAMPLER_LETTERS[c] for c in v))


def _set_seed(b: Builder, v: str) -> None:
    seed = read_int(v, lo=-1, hi=LLAMA_DEFAULT_SEED)
    b.update("sampling", seed=-1 if seed == LLAMA_DEFAULT_SEED else seed)


def _set_temp(b: Builder, v: str) -> None:
    b.update("sampling", temperature=max(read_float(v), 0.0))


def _set_repeat_penalty(b: Builder, v: str) -> None:
    penalty = read_float(v)
    if penalty <= 0.0 or not math.isfinite(1.0 / penalty):
        raise ValueError("repeat-penalty must be finite and greater than 0")
    b.update("sampling", repeat_penalty=penalty)


def _set_dry_base(b: Builder, v: str) -> None:
    base = read_float(v)
    if base >= 1.0:  # llama-server keeps the default for a base below 1
        b.update("sampling", dry_base=base)


def _add_dry_breaker(b: Builder, v: str) -> None:
    breakers = () if not b.dry_breakers_cleared else b.sampling.dry_sequence_breakers
    b.dry_breakers_cleared = True
    b.update("sampling", dry_sequence_breakers=() if v == "none" else (*breakers, v))


_LOGIT_BIAS_RE = re.compile(r"^\s*([+-]?\d+)\s*([+-])(.+)$")


def _add_logit_bias(b: Builder, v: str) -> None:
    match = _LOGIT_BIAS_RE.match(v)
    try:
        bias = float(match.group(3)) if match else math.nan
    except ValueError:
        bias = math.nan
    if match is None or math.isnan(bias):
        raise ValueError("invalid input format: expected TOKEN_ID(+/-)BIAS, e.g. 15043+1")
    token = int(match.group(1))
    signed = -bias if match.group(2) == "-" else bias
    b.update("sampling", logit_bias=(*b.sampling.logit_bias, (token, signed)))


# fmt: off
FLAGS: tuple[Flag, ...] = (
    flag("--samplers", VALUE, SAMPLING, _set_samplers, hint="SAMPLERS",
         help="samplers used for generation in order, separated by ';' (default: "
         "penalties;dry;top_n_sigma;top_k;typ_p;top_p;min_p;xtc;temperature)"),
    flag("-s --seed", VALUE, SAMPLING, _set_seed, hint="SEED",
         help="RNG seed (default: -1, use random seed for -1)"),
    flag("--sampler-seq --sampling-seq", VALUE, SAMPLING, _set_sampler_seq, hint="SEQUENCE",
         help="simplified sequence for samplers (default: edskypmxt)"),
    flag("--ignore-eos", VOID, SAMPLING, set_bool("sampling", "ignore_eos"),
         help="ignore end of stream token and continue generating"),
    flag("--temp --temperature", VALUE, SAMPLING, _set_temp, env="LLAMA_ARG_TEMPERATURE",
         hint="N", help="temperature (default: 0.80)"),
    flag("--top-k", VALUE, SAMPLING, set_int("sampling", "top_k"), env="LLAMA_ARG_TOP_K",
         hint="N", help="top-k sampling (default: 40, 0 = disabled)"),
    flag("--top-p", VALUE, SAMPLING, set_float("sampling", "top_p"), env="LLAMA_ARG_TOP_P",
         hint="N", help="top-p sampling (default: 0.95, 1.0 = disabled)"),
    flag("--min-p", VALUE, SAMPLING, set_float("sampling", "min_p"), env="LLAMA_ARG_MIN_P",
         hint="N", help="min-p sampling (default: 0.05, 0.0 = disabled)"),
    flag("--top-nsigma --top-n-sigma", VALUE, SAMPLING, set_float("sampling", "top_n_sigma"),
         hint="N", help="top-n-sigma sampling (default: -1.00, -1.0 = disabled)"),
    flag("--xtc-probability", VALUE, SAMPLING, set_float("sampling", "xtc_probability"),
         hint="N", help="xtc probability (default: 0.00, 0.0 = disabled)"),
    flag("--xtc-threshold", VALUE, SAMPLING, set_float("sampling", "xtc_threshold"),
         hint="N", help="xtc threshold (default: 0.10, 1.0 = disabled)"),
    flag("--typical --typical-p", VALUE, SAMPLING, set_float("sampling", "typical_p"),
         hint="N", help="locally typical sampling, parameter p (default: 1.00, 1.0 = disabled)"),
    flag("--repeat-last-n", VALUE, SAMPLING, set_int("sampling", "repeat_last_n", lo=0),
         hint="N", help="last n tokens to consider for penalize (default: 64, 0 = disabled)"),
    flag("--repeat-penalty", VALUE, SAMPLING, _set_repeat_penalty,
         env="LLAMA_ARG_REPEAT_PENALTY", hint="N",
         help="penalize repeat sequence of tokens (default: 1.00, 1.0 = disabled)"),
    flag("--presence-penalty", VALUE, SAMPLING, set_float("sampling", "presence_penalty"),
         env="LLAMA_ARG_PRESENCE_PENALTY", hint="N",
         help="repeat alpha presence penalty (default: 0.00, 0.0 = disabled)"),
    flag("--frequency-penalty", VALUE, SAMPLING, set_float("sampling", "frequency_penalty"),
         env="LLAMA_ARG_FREQUENCY_PENALTY", hint="N",
         help="repeat alpha frequency penalty (default: 0.00, 0.0 = disabled)"),
    flag("--dry-multiplier", VALUE, SAMPLING, set_float("sampling", "dry_multiplier"),
         hint="N", help="DRY sampling multiplier (default: 0.00, 0.0 = disabled)"),
    flag("--dry-base", VALUE, SAMPLING, _set_dry_base, hint="N",
         help="DRY sampling base value (default: 1.75; values below 1 are ignored)"),
    flag("--dry-allowed-length", VALUE, SAMPLING, set_int("sampling", "dry_allowed_length"),
         hint="N", help="allowed length for DRY sampling (default: 2)"),
    flag("--dry-penalty-last-n", VALUE, SAMPLING,
         set_int("sampling", "dry_penalty_last_n", lo=0), hint="N",
         help="DRY penalty for the last n tokens (default: 64, 0 = disable)"),
    flag("--dry-sequence-breaker", VALUE, SAMPLING, _add_dry_breaker, hint="STRING",
         help="add sequence breaker for DRY sampling, clearing out default breakers "
         "('\\n', ':', '\"', '*'); use \"none\" to not use any sequence breakers"),
    flag("--adaptive-target", VALUE, SAMPLING, set_float("sampling", "adaptive_target"),
         hint="N", help="adaptive-p: select tokens near this probability (default: -1.00)"),
    flag("--adaptive-decay", VALUE, SAMPLING, set_float("sampling", "adaptive_decay"),
         hint="N", help="adaptive-p: decay rate for target adaptation (default: 0.90)"),
    flag("--dynatemp-range", VALUE, SAMPLING, set_float("sampling", "dynatemp_range"),
         hint="N", help="dynamic temperature range (default: 0.00, 0.0 = disabled)"),
    flag("--dynatemp-exp", VALUE, SAMPLING, set_float("sampling", "dynatemp_exponent"),
         hint="N", help="dynamic temperature exponent (default: 1.00)"),
    flag("--mirostat", VALUE, SAMPLING, set_int("sampling", "mirostat"), hint="N",
         help="use Mirostat sampling (default: 0, 0 = disabled, 1 = Mirostat, 2 = Mirostat 2.0)"),
    flag("--mirostat-lr", VALUE, SAMPLING, set_float("sampling", "mirostat_eta"), hint="N",
         help="Mirostat learning rate, parameter eta (default: 0.10)"),
    flag("--mirostat-ent", VALUE, SAMPLING, set_float("sampling", "mirostat_tau"), hint="N",
         help="Mirostat target entropy, parameter tau (default: 5.00)"),
    flag("-l --logit-bias", VALUE, SAMPLING, _add_logit_bias, hint="TOKEN_ID(+/-)BIAS",
         help="modifies the likelihood of token appearing in the completion, "
         "e.g. `--logit-bias 15043+1`"),
)
# fmt: on
