"""Server-sent events as llama-server writes them.

`data: <json>\n\n` per event; OpenAI-style routes end with `data: [DONE]\n\n`, llama-server's
native /completion does not; an error after the stream began is `data: {"error": {...}}\n\n`.
JSON is written compactly with non-ASCII characters as they are, as llama-server does.
"""

from __future__ import annotations

import json
from typing import Any

DONE = b"data: [DONE]\n\n"
PING = b":\n\n"


def dumps(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def sse(obj: Any) -> bytes:
    return b"data: " + dumps(obj).encode("utf-8") + b"\n\n"


def sse_event(event: str, obj: Any) -> bytes:
    return b"event: " + event.encode() + b"\ndata: " + dumps(obj).encode("utf-8") + b"\n\n"
