"""GBNF for JSON integers within bounds (`minimum`/`maximum` of an integer schema).

`int_range(lo, hi)` matches exactly the decimal integers in [lo, hi] as JSON writes them (no
leading zeros, no "-0"); either bound may be None (unbounded, up to 16 digits, as llama.cpp's
integer rule). Built from same-length digit ranges: [lo, hi] of one length L is "lo's first digit,
then anything >= the rest of lo" | "a middle first digit, then any L-1 digits" | "hi's first
digit, then anything <= the rest of hi". Pure.
"""

from __future__ import annotations

MAX_DIGITS = 16  # llama.cpp's integral-part: at most 16 digits


def _digits(lo: int, hi: int) -> str:
    return f"[{lo}-{hi}]" if lo != hi else f'"{lo}"'


def _same_length(lo: str, hi: str) -> str:
    """Digit strings of one length between lo and hi (inclusive; leading zeros allowed)."""
    assert len(lo) == len(hi) and lo <= hi
    if not lo:
        return ""
    if len(lo) == 1:
        return _digits(int(lo), int(hi))
    if lo[0] == hi[0]:
        return f'"{lo[0]}" ({_same_length(lo[1:], hi[1:])})'
    n_rest = len(lo) - 1
    alts = [f'"{lo[0]}" ({_same_length(lo[1:], "9" * n_rest)})']
    if int(hi[0]) - int(lo[0]) > 1:
        alts.append(f"{_digits(int(lo[0]) + 1, int(hi[0]) - 1)} [0-9]{{{n_rest}}}")
    alts.append(f'"{hi[0]}" ({_same_length("0" * n_rest, hi[1:])})')
    return " | ".join(alts)


def _non_negative(lo: int, hi: int | None) -> list[str]:
    """Alternatives for the integers in [lo, hi] (lo >= 0; hi None: up to MAX_DIGITS digits)."""
    alts: list[str] = []
    top = hi if hi is not None else 10**MAX_DIGITS - 1
    for n_digits in range(len(str(lo)), len(str(top)) + 1):
        first = 0 if n_digits == 1 else 10 ** (n_digits - 1)
        a = max(lo, first)
        b = min(top, 10**n_digits - 1)
        if a > b:
            continue
        if hi is None and a == first and b == 10**n_digits - 1 and n_digits > 1:
            # Every number of this length and longer: one rule for the rest.
            alts.append(f"[1-9] [0-9]{{{n_digits - 1},{MAX_DIGITS - 1}}}")
            break
        alts.append(f"({_same_length(str(a), str(b))})")
    return alts


def int_range(lo: int | None, hi: int | None) -> str:
    """A GBNF expression for the JSON integers in [lo, hi]; raises ValueError when empty."""
    if lo is not None and hi is not None and lo > hi:
        raise ValueError(f"minimum {lo} is greater than maximum {hi}")
    alts: list[str] = []
    if lo is None or lo < 0:
        # Negatives: "-" then a magnitude in [max(1, -hi), -lo].
        mag_lo = 1 if hi is None or hi >= 0 else -hi
        mag_hi = None if lo is None else -lo
        neg = _non_negative(mag_lo, mag_hi)
        if neg:
            alts.append(f'"-" ({" | ".join(neg)})')
    if hi is None or hi >= 0:
        alts.extend(_non_negative(max(0, lo or 0) if lo is not None else 0, hi))
    if not alts:
        raise ValueError("the integer range is empty")
    return " | ".join(alts)
