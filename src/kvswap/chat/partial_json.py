"""JSON that may be cut short: parse what is there, and say where each value's text lies.

`parse_value(text, pos)` reads one JSON value starting at `pos` (after whitespace) and returns a
`Node`: its kind, the span of its text, whether it is complete, and its contents (the decoded
prefix of a string, the members of an object, the items of an array, the raw text of a scalar).
A value cut off by the end of `text` is returned incomplete; text that can never become JSON
raises `JsonSyntaxError`. A string's decoded prefix never includes a half escape sequence, so
it only grows as more text arrives. Pure.
"""

from __future__ import annotations

from dataclasses import dataclass, field

_WS = " \t\n\r"
_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}
_SCALAR_CHARS = set("0123456789+-.eE") | set("truefalsn")
_LITERALS = ("true", "false", "null")


class JsonSyntaxError(ValueError):
    """The text cannot be (the start of) a JSON value."""


@dataclass
class Node:
    kind: str  # "object", "array", "string" or "scalar"
    start: int
    end: int  # exclusive; the end of `text` while incomplete
    complete: bool
    text: str = ""  # a string's decoded prefix, a scalar's raw text
    members: list[tuple[Node, Node | None]] = field(default_factory=list)  # object: key, value
    items: list[Node] = field(default_factory=list)  # array

    def get(self, key: str) -> Node | None:
        """An object member's value node, when its key is complete."""
        for k, v in self.members:
            if k.complete and k.text == key:
                return v
        return None


def skip_ws(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] in _WS:
        pos += 1
    return pos


def parse_value(text: str, pos: int) -> Node | None:
    """The value at `pos` (whitespace skipped); None when only whitespace remains."""
    pos = skip_ws(text, pos)
    if pos >= len(text):
        return None
    ch = text[pos]
    if ch == "{":
        return _object(text, pos)
    if ch == "[":
        return _array(text, pos)
    if ch == '"':
        return _string(text, pos)
    if ch in _SCALAR_CHARS:
        return _scalar(text, pos)
    raise JsonSyntaxError(f"unexpected {ch!r} at {pos}")


def _string(text: str, pos: int) -> Node:
    out: list[str] = []
    i = pos + 1
    n = len(text)
    while i < n:
        ch = text[i]
        if ch == '"':
            return Node("string", pos, i + 1, True, "".join(out))
        if ch == "\\":
            if i + 1 >= n:
                break
            esc = text[i + 1]
            if esc == "u":
                code, used = _unicode_escape(text, i)
                if used == 0:
                    break  # cut off inside the escape
                out.append(code)
                i += used
                continue
            if esc not in _ESCAPES:
                raise JsonSyntaxError(f"bad escape \\{esc} at {i}")
            out.append(_ESCAPES[esc])
            i += 2
            continue
        if ord(ch) < 0x20:
            raise JsonSyntaxError(f"control character in a string at {i}")
        out.append(ch)
        i += 1
    return Node("string", pos, n, False, "".join(out))


def _hex4(text: str, i: int) -> int | None:
    digits = text[i : i + 4]
    if len(digits) < 4:
        return None
    try:
        return int(digits, 16)
    except ValueError:
        raise JsonSyntaxError(f"bad \\u escape at {i}") from None


def _unicode_escape(text: str, i: int) -> tuple[str, int]:
    """(character, characters used) for the `\\uXXXX` at `i`; (.., 0) when cut off."""
    code = _hex4(text, i + 2)
    if code is None:
        return "", 0
    if 0xD800 <= code < 0xDC00:  # a high surrogate: its pair must follow
        if len(text) < i + 12:
            return "", 0
        low = _hex4(text, i + 8) if text[i + 6 : i + 8] == "\\u" else None
        if low is not None and 0xDC00 <= low < 0xE000:
            return chr(0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00)), 12
        return "\ufffd", 6
    if 0xDC00 <= code < 0xE000:
        return "\ufffd", 6
    return chr(code), 6


def _scalar(text: str, pos: int) -> Node:
    i = pos
    while i < len(text) and text[i] in _SCALAR_CHARS:
        i += 1
    raw = text[pos:i]
    if raw[0].isalpha():
        if not any(lit.startswith(raw) for lit in _LITERALS):
            raise JsonSyntaxError(f"bad literal {raw!r} at {pos}")
        return Node("scalar", pos, i, raw in _LITERALS and i < len(text), raw)
    # A number is complete once something that is not part of it follows.
    return Node("scalar", pos, i, i < len(text), raw)


def _object(text: str, pos: int) -> Node:
    node = Node("object", pos, len(text), False)
    i = skip_ws(text, pos + 1)
    if i < len(text) and text[i] == "}":
        node.end, node.complete = i + 1, True
        return node
    while i < len(text):
        if text[i] != '"':
            raise JsonSyntaxError(f"expected a key at {i}")
        key = _string(text, i)
        if not key.complete:
            node.members.append((key, None))
            return node
        i = skip_ws(text, key.end)
        if i >= len(text):
            node.members.append((key, None))
            return node
        if text[i] != ":":
            raise JsonSyntaxError(f"expected ':' at {i}")
        value = parse_value(text, i + 1)
        node.members.append((key, value))
        if value is None or not value.complete:
            return node
        i = skip_ws(text, value.end)
        if i >= len(text):
            return node
        if text[i] == "}":
            node.end, node.complete = i + 1, True
            return node
        if text[i] != ",":
            raise JsonSyntaxError(f"expected ',' or '}}' at {i}")
        i = skip_ws(text, i + 1)
    return node


def _array(text: str, pos: int) -> Node:
    node = Node("array", pos, len(text), False)
    i = skip_ws(text, pos + 1)
    if i < len(text) and text[i] == "]":
        node.end, node.complete = i + 1, True
        return node
    while i < len(text):
        value = parse_value(text, i)
        if value is None:
            return node
        node.items.append(value)
        if not value.complete:
            return node
        i = skip_ws(text, value.end)
        if i >= len(text):
            return node
        if text[i] == "]":
            node.end, node.complete = i + 1, True
            return node
        if text[i] != ",":
            raise JsonSyntaxError(f"expected ',' or ']' at {i}")
        i = skip_ws(text, i + 1)
    return node
