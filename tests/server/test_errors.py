"""Bad input gets a typed 4xx and harms no one; other requests keep being served."""

from __future__ import annotations

import threading

import httpx
import pytest

from tests.server.harness import ServerProcess, chat_prompt

pytestmark = pytest.mark.model


def _assert_typed(resp: httpx.Response, status: int, type_: str) -> None:
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert err["code"] == status and err["type"] == type_ and err["message"]


BAD_REQUESTS = [
    # (method, path, raw body, status, type)
    (
        "POST",
        "/completion",
        b'{"prompt": "hi", "n_predict": 1',
        400,
        "invalid_request_error",
    ),  # malformed JSON
    (
        "POST",
        "/completion",
        b'{"prompt": "\xff\xfe hi"}',
        400,
        "invalid_request_error",
    ),  # invalid UTF-8
    (
        "POST",
        "/completion",
        b'{"prompt": "hi", "n_predict": "five"}',
        400,
        "invalid_request_error",
    ),  # wrong type
    ("POST", "/completion", b'{"prompt": "hi", "temperature": [1]}', 400, "invalid_request_error"),
    (
        "POST",
        "/completion",
        b'{"prompt": "hi", "n_predict": -5}',
        400,
        "invalid_request_error",
    ),  # negative n_predict
    ("POST", "/completion", b'{"prompt": 5}', 400, "invalid_request_error"),
    ("POST", "/completion", b"[1, 2, 3]", 400, "invalid_request_error"),
    (
        "POST",
        "/completion",
        b'{"prompt": "hi", "id_slot": 99}',
        400,
        "invalid_request_error",
    ),  # slot out of range
    ("POST", "/v1/chat/completions", b'{"messages": "hello"}', 400, "invalid_request_error"),
    (
        "POST",
        "/v1/chat/completions",
        b'{"messages": [{"content": "no role"}]}',
        400,
        "invalid_request_error",
    ),
    (
        "POST",
        "/slots/99?action=erase",
        b"",
        400,
        "invalid_request_error",
    ),  # llama-server erased slot 99 % n
    ("POST", "/slots/-1?action=erase", b"", 400, "invalid_request_error"),
    ("POST", "/slots/abc?action=erase", b"", 400, "invalid_request_error"),  # non-integer slot id
    ("POST", "/slots/0?action=explode", b"", 400, "invalid_request_error"),
    (
        "POST",
        "/slots/0?action=save",
        b'{"filename": "../escape.bin"}',
        400,
        "invalid_request_error",
    ),
    ("POST", "/slots/0?action=save", b'{"filename": "/etc/passwd"}', 400, "invalid_request_error"),
    (
        "POST",
        "/slots/0?action=restore",
        b'{"filename": "sub/dir.bin"}',
        400,
        "invalid_request_error",
    ),
    (
        "POST",
        "/slots/0?action=restore",
        b'{"filename": "nul\\u0000byte"}',
        400,
        "invalid_request_error",
    ),
    ("POST", "/slots/0?action=restore", b'{"filename": ".."}', 400, "invalid_request_error"),
    ("POST", "/slots/0?action=restore", b'{"filename": "never-saved.bin"}', 404, "not_found_error"),
    ("POST", "/detokenize", b'{"tokens": [999999999]}', 400, "invalid_request_error"),
    ("POST", "/embedding", b'{"content": "hi"}', 501, "not_supported_error"),
    ("GET", "/no/such/route", b"", 404, "not_found_error"),
]


@pytest.mark.parametrize(("method", "path", "raw", "status", "type_"), BAD_REQUESTS)
def test_bad_input_gets_a_typed_error(
    small_server: ServerProcess, method: str, path: str, raw: bytes, status: int, type_: str
) -> None:
    resp = small_server.client.request(
        method, path, content=raw, headers={"Content-Type": "application/json"}
    )
    _assert_typed(resp, status, type_)


def test_a_prompt_past_the_slot_window_is_exceed_context_size(small_server: ServerProcess) -> None:
    resp = small_server.post("/completion", {"prompt": "hello " * 1100, "n_predict": 1})
    _assert_typed(resp, 400, "exceed_context_size_error")
    err = resp.json()["error"]
    assert err["n_ctx"] == 1024 and err["n_prompt_tokens"] > 1024


def test_other_requests_are_served_while_bad_input_arrives(small_server: ServerProcess) -> None:
    body = {
        "prompt": chat_prompt(("user", "Count to five.")),
        "n_predict": 48,
        "temperature": 0,
        "stream": True,
    }
    outcome: dict[str, object] = {}

    def stream() -> None:
        chunks = list(small_server.stream("/completion", body))
        outcome["chunks"] = chunks

    t = threading.Thread(target=stream)
    t.start()
    for method, path, raw, status, type_ in BAD_REQUESTS * 2:
        resp = small_server.client.request(
            method, path, content=raw, headers={"Content-Type": "application/json"}
        )
        _assert_typed(resp, status, type_)
    t.join(120)
    chunks = outcome["chunks"]
    assert isinstance(chunks, list) and chunks[-1]["stop"] is True
    assert small_server.client.get("/health").json() == {"status": "ok"}
