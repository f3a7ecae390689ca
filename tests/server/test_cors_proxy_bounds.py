"""/cors-proxy's bounds, through a real `kvswap serve` (with an API key) and real HTTP targets
on loopback:

- without `--ui-mcp-proxy-allow`, loopback, link-local (cloud metadata), private and mapped
  addresses are refused with a 403 naming the address and the flag, and nothing is sent;
- with `--ui-mcp-proxy-allow 127.0.0.1`, 127.0.0.1 is reached but a redirect to 127.0.0.2 (a
  live server there) is refused; a redirect to another origin loses the explicit
  Authorization, one on the same origin keeps it;
- an explicit header carrying the caller's own key is never sent;
- a request body past `--ui-mcp-proxy-max-bytes` is a 413 naming the flag (nothing sent), an
  answer whose Content-Length is past it a 502 naming it, a longer answer without one is cut
  at the bound;
- Set-Cookie and X-Kvswap-* from the target are not relayed;
- sixteen proxied requests held open at once cost no thread each.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import parse_qs, urlsplit

import httpx
import psutil
import pytest

from tests.server.harness import ServerProcess

pytestmark = [pytest.mark.model, pytest.mark.timeout(180)]
KEY = "sk-bounds-test"
AUTH = {"Authorization": f"Bearer {KEY}"}
LIMIT = 64 << 10


class _Target(BaseHTTPRequestHandler):
    seen: ClassVar[list[dict[str, Any]]] = []
    release: ClassVar[threading.Event] = threading.Event()
    n_held: ClassVar[int] = 0
    lock: ClassVar[threading.Lock] = threading.Lock()

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        parts = urlsplit(self.path)
        host, port = self.connection.getsockname()[:2]
        self.seen.append(
            {"host": host, "port": port, "path": parts.path, "body": body,
             "headers": {k.lower(): v for k, v in self.headers.items()}}
        )  # fmt: skip
        query = parse_qs(parts.query)
        if parts.path == "/redirect":
            self.send_response(302)
            self.send_header("Location", query["to"][0])
            self.end_headers()
        elif parts.path == "/big":
            self._send(b"x" * (LIMIT + 1))
        elif parts.path == "/stream":  # no Content-Length: the body ends when the connection does
            self.send_response(200)
            self.end_headers()
            for _ in range(4):
                self.wfile.write(b"y" * LIMIT)
        elif parts.path == "/signals":
            self.send_response(200)
            self.send_header("X-Kvswap-Forward", '["ns","x","r9","http://evil.example","t"]')
            self.send_header("Set-Cookie", "sid=evil")
            self.send_header("X-Target", "yes")
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")
        elif parts.path == "/slow":
            with self.lock:
                type(self).n_held += 1
            self.release.wait(60)
            self._send(b"late")
        else:
            self._send(b"hello")

    def _send(self, body: bytes) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = _answer
    do_POST = _answer

    def log_message(self, *_: object) -> None:
        pass


def _serve(host: str) -> ThreadingHTTPServer:
    srv = ThreadingHTTPServer((host, 0), _Target)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


@pytest.fixture()
def targets() -> Iterator[tuple[ThreadingHTTPServer, ThreadingHTTPServer, ThreadingHTTPServer]]:
    _Target.seen = []
    _Target.release = threading.Event()
    _Target.n_held = 0
    servers = (_serve("127.0.0.1"), _serve("127.0.0.1"), _serve("127.0.0.2"))
    yield servers
    _Target.release.set()
    for srv in servers:
        srv.shutdown()
        srv.server_close()


def _kvswap(tmp_path: Path, *flags: str) -> ServerProcess:
    from kvswap.tiny.cache import tiny_model_path

    args = ["-m", str(tiny_model_path("llama")), "-c", "256", "-np", "1", "-t", "1"]
    return ServerProcess(
        [*args, "--api-key", KEY, "--ui-mcp-proxy", *flags], tmp_path / "server.log"
    )


@pytest.fixture()
def allowed(tmp_path: Path) -> Iterator[ServerProcess]:
    server = _kvswap(
        tmp_path, "--ui-mcp-proxy-allow", "127.0.0.1", "--ui-mcp-proxy-max-bytes", str(LIMIT)
    )
    yield server
    server.stop()


def _get(server: ServerProcess, url: str, **kw: Any) -> httpx.Response:
    headers = {**AUTH, **kw.pop("headers", {})}
    return server.client.get("/cors-proxy", params={"url": url}, headers=headers, **kw)


def test_non_public_targets_are_refused_by_default(tmp_path: Path, targets: Any) -> None:
    local, _, _ = targets
    port = local.server_port
    server = _kvswap(tmp_path)
    try:
        refused = {
            f"http://127.0.0.1:{port}/": "127.0.0.1 is a loopback address",
            f"http://localhost:{port}/": "127.0.0.1 is a loopback address",
            f"http://[::ffff:127.0.0.1]:{port}/": "127.0.0.1 is a loopback address",
            f"http://[::1]:{port}/": "::1 is a loopback address",
            "http://169.254.169.254/latest/meta-data/": "169.254.169.254 is a link-local",
            "http://10.1.2.3/": "10.1.2.3 is a private address",
            "http://0.0.0.0/": "0.0.0.0 is a",
        }
        for url, why in refused.items():
            res = _get(server, url)
            assert res.status_code == 403, (url, res.text)
            message = res.json()["error"]["message"]
            assert why in message and "--ui-mcp-proxy-allow" in message, (url, message)
        assert _Target.seen == []  # nothing was sent anywhere
    finally:
        server.stop()


def test_allowed_networks_redirects_and_credentials(allowed: ServerProcess, targets: Any) -> None:
    a, b, other = targets
    url_a = f"http://127.0.0.1:{a.server_port}"
    url_b = f"http://127.0.0.1:{b.server_port}"
    res = _get(allowed, f"{url_a}/plain")
    assert (res.status_code, res.text) == (200, "hello")
    to_other = f"http://127.0.0.2:{other.server_port}/x"
    res = _get(allowed, f"{url_a}/redirect?to={to_other}")
    assert res.status_code == 403 and "127.0.0.2 is a loopback" in res.json()["error"]["message"]
    assert not [s for s in _Target.seen if s["host"] == "127.0.0.2"]  # never reached
    explicit = {
        "X-Llama-Server-Proxy-Header-Authorization": "Bearer for-the-target",
        "X-Llama-Server-Proxy-Header-X-Trace": "t1",
    }
    _Target.seen = []
    assert _get(allowed, f"{url_a}/redirect?to=/same", headers=explicit).text == "hello"
    assert _get(allowed, f"{url_a}/redirect?to={url_b}/other", headers=explicit).text == "hello"
    same, other_origin = (s for s in _Target.seen if s["path"] in ("/same", "/other"))
    assert same["headers"]["authorization"] == "Bearer for-the-target"
    assert "authorization" not in other_origin["headers"]
    assert other_origin["headers"]["x-trace"] == "t1"  # other explicit headers follow
    _Target.seen = []
    copied = {
        "X-Llama-Server-Proxy-Header-Authorization": f"Bearer {KEY}",
        "X-Llama-Server-Proxy-Header-X-Api-Key": KEY,
    }
    assert _get(allowed, f"{url_a}/plain", headers=copied).status_code == 200
    (seen,) = _Target.seen
    assert KEY not in " ".join(seen["headers"].values())


def test_bodies_are_bounded(allowed: ServerProcess, targets: Any) -> None:
    a, _, _ = targets
    url = f"http://127.0.0.1:{a.server_port}"
    res = allowed.client.post(
        "/cors-proxy", params={"url": f"{url}/post"}, headers=AUTH, content=b"z" * (LIMIT + 1)
    )
    assert res.status_code == 413
    assert f"--ui-mcp-proxy-max-bytes ({LIMIT} bytes)" in res.json()["error"]["message"]
    assert _Target.seen == []
    res = allowed.client.post(
        "/cors-proxy", params={"url": f"{url}/post"}, headers=AUTH, content=b"z" * LIMIT
    )
    assert res.status_code == 200 and _Target.seen[-1]["body"] == b"z" * LIMIT
    res = _get(allowed, f"{url}/big")
    assert res.status_code == 502
    assert "--ui-mcp-proxy-max-bytes" in res.json()["error"]["message"]
    res = _get(allowed, f"{url}/stream")
    assert res.status_code == 200 and res.content == b"y" * LIMIT


def test_kvswap_signals_and_cookies_are_not_relayed(allowed: ServerProcess, targets: Any) -> None:
    a, _, _ = targets
    res = _get(allowed, f"http://127.0.0.1:{a.server_port}/signals")
    assert res.status_code == 200 and res.text == "ok"
    assert res.headers["x-target"] == "yes"
    assert "x-kvswap-forward" not in res.headers and "set-cookie" not in res.headers


def test_held_requests_cost_no_thread_each(allowed: ServerProcess, targets: Any) -> None:
    a, _, _ = targets
    url = f"http://127.0.0.1:{a.server_port}/slow"
    process = psutil.Process(allowed.proc.pid)
    n_held = 16

    def hold_all() -> tuple[int, list[httpx.Response]]:
        _Target.release.clear()
        _Target.n_held = 0
        with ThreadPoolExecutor(n_held) as pool:
            futures = [pool.submit(_get, allowed, url) for _ in range(n_held)]
            while _Target.n_held < n_held and not any(f.done() for f in futures):
                _Target.release.wait(0.01)
            n_threads = process.num_threads()
            _Target.release.set()
            return n_threads, [f.result() for f in futures]

    hold_all()  # warm-up: any pool the server keeps has grown
    n_idle = process.num_threads()
    n_threads, answers = hold_all()
    assert all(r.status_code == 200 and r.text == "late" for r in answers)
    assert n_threads <= n_idle + 1, (n_idle, n_threads)  # not one thread per request
