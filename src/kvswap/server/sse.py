"""Server-sent events as llama-server writes them.

`data: <json>\n\n` per event; OpenAI-style routes end with `data: [DONE]\n\n`, llama-server's
native /completion does not; an error after the stream began is `data: {"error": {...}}\n\n`.
JSON is written compactly with non-ASCII characters as they are, as llama-server does, except
U+0085, U+2028 and U+2029: they are escaped, because line readers built on `str.splitlines`
(httpx's `iter_lines`, for one) end a line there and cut the event's JSON in two.
"""

from __future__ import annotations

import json
from typing import Any

DONE = b"data: [DONE]\n\n"
PING = b":\n\n"


def dumps(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


_LINE_BREAKS = str.maketrans({"\x85": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"})


def _data(obj: Any) -> bytes:
    return dumps(obj).translate(_LINE_BREAKS).encode("utf-8")


def sse(obj: Any) -> bytes:
    return b"data: " + _data(obj) + b"\n\n"


def sse_event(event: str, obj: Any) -> bytes:
    return b"event: " + event.encode() + b"\ndata: " + _data(obj) + b"\n\n"
