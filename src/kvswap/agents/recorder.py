"""A recording HTTP proxy: what a real client sends to a server, and what it gets back.

`Recorder(upstream)` listens on a loopback port, forwards each request to `upstream` as it
came (method, path, headers, body) and streams the answer back chunk by chunk, so a streaming
client sees its events as the server writes them. Each exchange is kept as an `Exchange`: the
request's JSON body and headers, the status, and the answer's bytes (an SSE stream stays
whole). `agents.drive` (for `kvswap bench coding` and the tests that run Claude Code and
Codex) uses it to see what the clients send and to steer the random-weight model (`rewrite`); recordings stay in memory, never in the
repository (the prompts are the clients' text).
"""

from __future__ import annotations

import http.client
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from kvswap.cluster.procs import free_port

_HOP_HEADERS = frozenset(
    {
        "connection",
        "keep-alive",
        "transfer-encoding",
        "te",
        "trailer",
        "upgrade",
        "host",
        "content-length",
    }
)


@dataclass
class Exchange:
    """One request through the proxy and the answer the server gave."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    status: int = 0
    answer_headers: dict[str, str] = field(default_factory=dict)
    answer: bytes = b""
    error: str = ""

    def json(self) -> dict[str, Any]:
        """The request's body as JSON ({} when it has none)."""
        return json.loads(self.body) if self.body else {}

    def events(self) -> list[dict[str, Any]]:
        """The answer's SSE `data:` payloads that parse as JSON objects, in order; a plain JSON
        answer is one event."""
        text = self.answer.decode("utf-8", "replace")
        if not text.lstrip().startswith(("event:", "data:", ":")):
            try:
                whole = json.loads(text)
            except ValueError:
                return []
            return [whole] if isinstance(whole, dict) else []
        found = []
        for line in text.splitlines():
            if line.startswith("data:"):
                try:
                    event = json.loads(line[5:].strip())
                except ValueError:
                    continue
                if isinstance(event, dict):
                    found.append(event)
        return found


# A test's hand on what the client sends: (how many requests came before, the JSON body) ->
# the body to forward instead (a forced tool choice, an output cap), or None to forward it as it came.
Rewrite = Callable[[int, dict[str, Any]], "dict[str, Any] | None"]


@dataclass
class Recorder:
    """The proxy; `url` is where clients point, `exchanges` what went through, in order (each
    with the body as forwarded). `rewrite` may change a JSON body on its way."""

    upstream: str
    rewrite: Rewrite | None = None
    exchanges: list[Exchange] = field(default_factory=list)

    def __post_init__(self) -> None:
        parts = urlsplit(self.upstream)
        self.target = (parts.hostname or "127.0.0.1", parts.port or 80)
        self._lock = threading.Lock()
        self._seen = 0
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), _handler(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> Recorder:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def record(self, exchange: Exchange) -> None:
        """Keep `exchange`, its body rewritten first when a rewrite is set."""
        with self._lock:
            if self.rewrite is not None and exchange.body:
                changed = self.rewrite(self._seen, exchange.json())
                if changed is not None:
                    exchange.body = json.dumps(changed).encode()
            self._seen += 1
            self.exchanges.append(exchange)

    def taken(self) -> list[Exchange]:
        """The exchanges so far, and a fresh list for the next ones."""
        with self._lock:
            taken, self.exchanges = self.exchanges, []
        return taken


def _handler(recorder: Recorder) -> type[BaseHTTPRequestHandler]:
    class Forward(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            return

        def _forward(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            body = self.rfile.read(length) if length else b""
            headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_HEADERS}
            exchange = Exchange(self.command, self.path, headers, body)
            recorder.record(exchange)
            conn = http.client.HTTPConnection(*recorder.target, timeout=3600)
            try:
                conn.request(self.command, self.path, body=exchange.body, headers=exchange.headers)
                answer = conn.getresponse()
                exchange.status = answer.status
                exchange.answer_headers = dict(answer.getheaders())
                self.send_response(answer.status)
                for key, value in answer.getheaders():
                    if key.lower() not in _HOP_HEADERS:
                        self.send_header(key, value)
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                while chunk := answer.read1(65536):
                    exchange.answer += chunk
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                    self.wfile.flush()
                self.wfile.write(b"0\r\n\r\n")
            except OSError as err:  # the client hung up, or the server did
                exchange.error = f"{type(err).__name__}: {err}"
                self.close_connection = True
            finally:
                conn.close()

        do_GET = do_POST = do_DELETE = do_PUT = _forward

    return Forward
