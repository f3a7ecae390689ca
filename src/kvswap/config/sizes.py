"""Byte sizes on the command line: `parse_size` and `format_size`.

Owns the size syntax of kvswap's byte flags (`--page-ram-bytes`, `--page-disk-bytes`,
`--ctx-checkpoints-bytes`, `--max-body-bytes`). Pure functions; no I/O.

Syntax (case-insensitive unit, optional spaces before it):
- a plain number of bytes: `1048576`, `20e9`, `1.5e9` (decimal and exponent notation);
- a number and a binary unit, always a power of 1024: `k`/`KiB`, `M`/`MiB`, `G`/`GiB`,
  `T`/`TiB` (`512M`, `8G`, `1.5GiB`).
`KB`/`MB`/`GB`/`TB` are refused as ambiguous (1000 or 1024?): write `G`, `GiB` or `20e9`.
A result that is not a whole number of bytes is rounded down. Negative values, NaN, infinity,
junk and values past 2**63 - 1 raise `ConfigError` naming the flag.
"""

from __future__ import annotations

import re
from fractions import Fraction

from kvswap.config.errors import ConfigError

_MAX_BYTES = (1 << 63) - 1

_UNITS: dict[str, int] = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}

_SIZE_RE = re.compile(
    r"""^\s*
    (?P<num>(?:\d+(?:\.\d*)?|\.\d+)(?:e[+-]?\d+)?)
    \s*
    (?P<unit>[kmgt](?P<ib>ib)?)?
    \s*$""",
    re.IGNORECASE | re.VERBOSE,
)
_AMBIGUOUS_RE = re.compile(r"^\s*[\d.e+-]+\s*[kmgt]b\s*$", re.IGNORECASE)


def parse_size(text: str, flag: str) -> int:
    """Bytes denoted by `text` (see the module docstring); `flag` names the flag in errors."""
    stripped = text.strip()
    if stripped.startswith("-"):
        raise ConfigError(f"{flag}: size must not be negative: {text!r}")
    match = _SIZE_RE.match(stripped)
    if match is None:
        if _AMBIGUOUS_RE.match(stripped):
            raise ConfigError(
                f"{flag}: ambiguous unit in {text!r}: use k/M/G/T or KiB/MiB/GiB/TiB "
                "(powers of 1024) or a plain number such as 20e9"
            )
        raise ConfigError(
            f"{flag}: invalid size {text!r}: expected bytes such as 1048576, 20e9, 512M or 8GiB"
        )
    unit = (match.group("unit") or "")[:1].lower()
    n_bytes = int(Fraction(match.group("num")) * _UNITS[unit])  # int() rounds down here
    if n_bytes > _MAX_BYTES:
        raise ConfigError(f"{flag}: size too large: {text!r}")
    return n_bytes


def format_size(n_bytes: int) -> str:
    """`n_bytes` in the largest binary unit that divides it exactly (`8G`, `1536M`, `100`)."""
    for unit, scale in (("T", 1 << 40), ("G", 1 << 30), ("M", 1 << 20), ("k", 1 << 10)):
        if n_bytes and n_bytes % scale == 0:
            return f"{n_bytes // scale}{unit}"
    return str(n_bytes)
