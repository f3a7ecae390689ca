"""SSE events survive line readers that split on every Unicode line break (str.splitlines)."""

from __future__ import annotations

import json

from kvswap.server.sse import sse, sse_event


def test_unicode_line_breaks_in_content_stay_inside_one_line() -> None:
    content = "a\u2028b\x85c\u2029d\né\x1c"
    for raw in (sse({"content": content}), sse_event("delta", {"content": content})):
        lines = raw.decode("utf-8").splitlines()
        data = [line for line in lines if line.startswith("data: ")]
        assert len(data) == 1
        assert json.loads(data[0][len("data: ") :]) == {"content": content}


def test_other_non_ascii_is_written_as_is() -> None:
    assert sse({"content": "é😀"}) == 'data: {"content":"é😀"}\n\n'.encode()
