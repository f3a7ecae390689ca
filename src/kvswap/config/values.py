"""How flag values are read: integers, floats, booleans, choices and CSV lists.

Owns the value syntax shared by every flag table. Each reader raises `ValueError` with a short
reason; the parser (`flags.py`) wraps it into a `ConfigError` naming the flag or environment
variable, as llama-server prints `error while handling argument "X": reason`.

kvswap is stricter than llama-server's `std::stoi`/`std::stof` (which read `12abc` as 12): a
value must be a whole number (or float) and nothing else.
"""

from __future__ import annotations

import math
import re

INT32_MIN = -(1 << 31)
INT32_MAX = (1 << 31) - 1

_INT_RE = re.compile(r"^\s*[+-]?\d+\s*$")

# llama-server's common_arg_utils spellings.
_TRUTHY = frozenset({"on", "enabled", "true", "1"})
_FALSEY = frozenset({"off", "disabled", "false", "0"})
_AUTOY = frozenset({"auto", "-1"})

# ggml type names llama-server accepts for -ctk/-ctv/-ctkd/-ctvd (arg.cpp kv_cache_types).
KV_CACHE_TYPES: tuple[str, ...] = (
    "f32",
    "f16",
    "bf16",
    "q8_0",
    "q4_0",
    "q4_1",
    "iq4_nl",
    "q5_0",
    "q5_1",
)


def read_int(text: str, lo: int = INT32_MIN, hi: int = INT32_MAX) -> int:
    """A 32-bit integer in [lo, hi]."""
    if not _INT_RE.match(text):
        raise ValueError(f"expected an integer, got {text!r}")
    value = int(text)
    if not lo <= value <= hi:
        if hi == INT32_MAX:
            raise ValueError(f"must be >= {lo}, got {value}")
        raise ValueError(f"must be between {lo} and {hi}, got {value}")
    return value


def read_float(text: str) -> float:
    """A finite float (`0.8`, `1e-3`)."""
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise ValueError(f"expected a finite number, got {text!r}")
    return value


def is_truthy(text: str) -> bool:
    return text in _TRUTHY


def is_falsey(text: str) -> bool:
    return text in _FALSEY


def read_bool(text: str) -> bool:
    """An environment variable's boolean, as llama-server's parse_bool_value."""
    if is_truthy(text):
        return True
    if is_falsey(text):
        return False
    raise ValueError("invalid boolean value")


def read_on_off_auto(text: str) -> str:
    """'on' | 'off' | 'auto' from llama-server's spellings (on/enabled/true/1, ..., auto/-1)."""
    if is_truthy(text):
        return "on"
    if is_falsey(text):
        return "off"
    if text in _AUTOY:
        return "auto"
    raise ValueError(f"unknown value: {text!r} (expected on, off or auto)")


def read_choice(text: str, choices: tuple[str, ...]) -> str:
    if text not in choices:
        raise ValueError(f"invalid value {text!r}: expected one of {', '.join(choices)}")
    return text


def read_cache_type(text: str) -> str:
    if text not in KV_CACHE_TYPES:
        raise ValueError(
            f"Unsupported cache type: {text} (allowed values: {', '.join(KV_CACHE_TYPES)})"
        )
    return text


def read_gpu_layers(text: str) -> int:
    """-ngl/-ngld: 'auto' is -1, 'all' is -2, else the number of layers (as llama-server)."""
    if text == "auto":
        return -1
    if text == "all":
        return -2
    return read_int(text)


def split_csv(text: str) -> list[str]:
    """llama-server's parse_csv_row: commas split, double quotes protect, `""` escapes a quote."""
    fields: list[str] = []
    current: list[str] = []
    in_quotes = False
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == '"':
            if not in_quotes:
                if current:
                    current.append('"')  # a quote inside an unquoted field is literal
                else:
                    in_quotes = True
            elif i + 1 < len(text) and text[i + 1] == '"':
                current.append('"')
                i += 1
            else:
                in_quotes = False
        elif ch == "," and not in_quotes:
            fields.append("".join(current))
            current = []
        else:
            current.append(ch)
        i += 1
    fields.append("".join(current))
    return fields


_ESCAPES = {"n": "\n", "r": "\r", "t": "\t", "'": "'", '"': '"', "\\": "\\"}


def process_escapes(text: str) -> str:
    """Backslash escapes as llama-server's string_process_escapes.

    Handles \\n \\r \\t \\' \\" \\\\ and \\xHH; any other backslash stays as written.
    """
    out: list[str] = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == "\\" and i + 1 < len(text):
            nxt = text[i + 1]
            if nxt in _ESCAPES:
                out.append(_ESCAPES[nxt])
                i += 2
                continue
            if nxt == "x" and re.match(r"[0-9a-fA-F]{2}", text[i + 2 : i + 4]):
                out.append(chr(int(text[i + 2 : i + 4], 16)))
                i += 4
                continue
        out.append(ch)
        i += 1
    return "".join(out)
