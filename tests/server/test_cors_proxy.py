"""/cors-proxy forwards only the headers a page names, and answers 403 unless enabled.

A real target server on loopback (allowed with `--ui-mcp-proxy-allow`) records what reaches
it; a real `kvswap serve` with an API key stands between. The key, cookies and proxy credentials the browser sent never reach the
target; `X-Llama-Server-Proxy-Header-NAME` arrives as `NAME`; a POST body and the target's
status, headers and body pass through.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest

from tests.server.harness import ServerProcess

pytestmark = [pytest.mark.model, pytest.mark.timeout(120)]
KEY = "sk-proxy-test"


class _Capture(BaseHTTPRequestHandler):
    seen: ClassVar[list[dict[str, Any]]] = []

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        self.seen.append(
            {"method": self.command, "path": self.path, "headers": dict(self.headers), "body": body}
        )
        self.send_response(201)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("X-Target", "yes")
        self.end_headers()
        self.wfile.write(b"data: one\n\ndata: two\n\n")

    do_GET = _answer
    do_POST = _answer

    def log_message(self, *_: object) -> None:
        pass


@pytest.fixture()
def target() -> Iterator[ThreadingHTTPServer]:
    _Capture.seen = []
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Capture)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def _server(tmp_path: Path, *flags: str) -> ServerProcess:
    from kvswap.tiny.cache import tiny_model_path

    args = [
        "-m",
        str(tiny_model_path("llama")),
        "-c",
        "256",
        "-np",
        "1",
        "-t",
        "1",
        "--api-key",
        KEY,
    ]
    return ServerProcess([*args, *flags], tmp_path / "server.log")


def test_only_explicit_headers_reach_the_target(
    tmp_path: Path, target: ThreadingHTTPServer
) -> None:
    server = _server(tmp_path, "--ui-mcp-proxy", "--ui-mcp-proxy-allow", "127.0.0.1")
    try:
        url = f"http://127.0.0.1:{target.server_port}/mcp?session=1"
        res = server.client.post(
            "/cors-proxy",
            params={"url": url},
            content=b'{"jsonrpc": "2.0"}',
            headers={
                "Authorization": f"Bearer {KEY}",
                "Cookie": "session=secret",
                "Proxy-Authorization": "Basic secret",
                "X-Llama-Server-Proxy-Header-Authorization": "Bearer for-the-target",
                "X-Llama-Server-Proxy-Header-Content-Type": "application/json",
            },
        )
        assert res.status_code == 201, res.text
        assert res.text == "data: one\n\ndata: two\n\n"
        assert res.headers["content-type"].startswith("text/event-stream")
        assert res.headers["x-target"] == "yes"
        (seen,) = _Capture.seen
        sent = {k.lower(): v for k, v in seen["headers"].items()}
        assert seen["method"] == "POST" and seen["path"] == "/mcp?session=1"
        assert seen["body"] == b'{"jsonrpc": "2.0"}'
        assert sent["authorization"] == "Bearer for-the-target"
        assert sent["content-type"] == "application/json"
        assert "cookie" not in sent and "proxy-authorization" not in sent
        assert not any(k.startswith("x-llama-server") for k in sent)
        # still behind the API key, and a bad target is a typed 400
        assert server.client.get("/cors-proxy", params={"url": url}).status_code == 401
        bad = server.client.get(
            "/cors-proxy",
            params={"url": "file:///etc/passwd"},
            headers={"Authorization": f"Bearer {KEY}"},
        )
        assert bad.status_code == 400 and bad.json()["error"]["type"] == "invalid_request_error"
    finally:
        server.stop()


def test_the_proxy_is_off_unless_asked_for(tmp_path: Path, target: ThreadingHTTPServer) -> None:
    server = _server(tmp_path)
    try:
        res = server.client.get(
            "/cors-proxy",
            params={"url": f"http://127.0.0.1:{target.server_port}/"},
            headers={"Authorization": f"Bearer {KEY}"},
        )
        assert res.status_code == 403
        assert res.json()["error"] == {
            "code": 403,
            "message": "this feature is disabled",
            "type": "permission_error",
        }
        assert _Capture.seen == []
    finally:
        server.stop()
