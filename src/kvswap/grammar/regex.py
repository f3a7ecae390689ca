"""A JSON-schema `pattern` as a GBNF expression for the characters of a JSON string.

The pattern is parsed with Python's own regex parser and rewritten as GBNF: literals,
character classes, `.`, `\\d \\w \\s` (and their negations), groups, alternation and the greedy
or lazy quantifiers. The generated string always matches the whole pattern, so it also matches
JSON schema's unanchored search. Characters JSON must escape (`"`, `\\`, control characters)
appear in their escaped form; negated classes and `.` leave them out. Lookarounds and
backreferences raise ValueError. Pure.
"""

from __future__ import annotations

import re
import re._constants as _c  # Python's own regex parser (3.11+; sre_parse is its old alias)
import re._parser as _p
from typing import Any

from kvswap.grammar.gbnf import char_class, literal

# Characters inside a JSON string that must be written escaped, and how.
_JSON_ESCAPES = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"}
# Never produced by negated classes or `.`: they would need an escape.
_UNSAFE = '"\\' + "".join(chr(i) for i in range(0x20)) + "\x7f"

_CATEGORIES = {
    _c.CATEGORY_DIGIT: "0123456789",
    _c.CATEGORY_WORD: "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_",
    _c.CATEGORY_SPACE: " \t\n\r",
}
_NEGATED = {
    _c.CATEGORY_NOT_DIGIT: _c.CATEGORY_DIGIT,
    _c.CATEGORY_NOT_WORD: _c.CATEGORY_WORD,
    _c.CATEGORY_NOT_SPACE: _c.CATEGORY_SPACE,
}


def _json_char(ch: str) -> str:
    """One character as it appears inside a JSON string, as a GBNF literal."""
    if ch in _JSON_ESCAPES:
        return literal(_JSON_ESCAPES[ch])
    if ord(ch) < 0x20 or ch == "\x7f":
        return literal(f"\\u{ord(ch):04x}")
    return literal(ch)


def _chars_expr(chars: str) -> str:
    """Any one of `chars` (a positive set) as JSON-string text."""
    plain = "".join(ch for ch in chars if ch not in _UNSAFE)
    alts = [char_class(plain)] if plain else []
    alts += [_json_char(ch) for ch in chars if ch in _UNSAFE]
    if not alts:
        raise ValueError("empty character class")
    return alts[0] if len(alts) == 1 else "(" + " | ".join(alts) + ")"


def _range_chars(lo: int, hi: int) -> str:
    if hi - lo > 0x3000:
        raise ValueError("character range too large")
    return "".join(chr(i) for i in range(lo, hi + 1))


def _in(items: list[tuple[Any, Any]]) -> str:
    negate = False
    chars = ""
    for op, arg in items:
        if op is _c.NEGATE:
            negate = True
        elif op is _c.LITERAL:
            chars += chr(arg)
        elif op is _c.RANGE:
            chars += _range_chars(*arg)
        elif op is _c.CATEGORY and arg in _CATEGORIES:
            chars += _CATEGORIES[arg]
        elif op is _c.CATEGORY and arg in _NEGATED:
            if negate or len(items) > 1:
                raise ValueError("negated categories inside a class are not supported")
            return char_class(_CATEGORIES[_NEGATED[arg]] + _UNSAFE, negate=True)
        else:
            raise ValueError(f"unsupported class item {op}")
    if negate:
        return char_class(chars + _UNSAFE, negate=True)
    return _chars_expr(chars)


def _repeat(item: str, lo: int, hi: int) -> str:
    if hi == _c.MAXREPEAT:
        return f"({item}){{{lo},}}" if lo > 1 else f"({item}){'*' if lo == 0 else '+'}"
    if lo == 0 and hi == 1:
        return f"({item})?"
    return f"({item}){{{lo},{hi}}}" if lo != hi else f"({item}){{{lo}}}"


def _seq(tokens: Any) -> str:
    parts: list[str] = []
    for op, arg in tokens:
        if op is _c.LITERAL:
            parts.append(_json_char(chr(arg)))
        elif op is _c.NOT_LITERAL:
            parts.append(char_class(chr(arg) + _UNSAFE, negate=True))
        elif op is _c.ANY:
            parts.append(char_class(_UNSAFE, negate=True))
        elif op is _c.IN:
            parts.append(_in(arg))
        elif op in (_c.MAX_REPEAT, _c.MIN_REPEAT, _c.POSSESSIVE_REPEAT):
            lo, hi, sub = arg
            parts.append(_repeat(_seq(sub), lo, hi))
        elif op is _c.SUBPATTERN:
            parts.append("(" + _seq(arg[-1]) + ")")
        elif op is _c.BRANCH:
            parts.append("(" + " | ".join(_seq(alt) or '""' for alt in arg[1]) + ")")
        elif op is _c.AT:
            continue  # anchors: the whole string matches anyway
        else:
            raise ValueError(f"unsupported regular expression construct {op}")
    return " ".join(parts)


def pattern_expr(pattern: str) -> str:
    """GBNF for the JSON-string characters (no quotes) of a string matching `pattern`."""
    try:
        parsed = _p.parse(pattern)
    except re.error as err:
        raise ValueError(f"invalid pattern {pattern!r}: {err}") from err
    return _seq(parsed) or '""'
