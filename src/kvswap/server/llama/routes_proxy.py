"""GET/POST /cors-proxy?url=...: llama-server's CORS proxy for the web UI's MCP clients.

Owns the route and the forwarding. With `--ui-mcp-proxy` (or `--agent`) the request goes to
`url` (http or https, no credentials in it) with only the headers the page named explicitly:
`X-Llama-Server-Proxy-Header-NAME: v` is sent as `NAME: v`; everything else the browser sent
(the server's own API key, cookies, proxy credentials) stays here, as llama-server
(`server-cors-proxy.h`). The target's status, headers (hop-by-hop ones dropped) and body come
back as they arrive, so event streams pass through. Redirects are followed, as llama-server.
Without the flag the route answers 403 (llama-server's type there is an untyped
`feature_disabled`; kvswap's is its `permission_error`, with the code).

The upstream connection runs on a worker thread (the standard library's `http.client`); the
event loop only relays chunks. A bad target URL is a typed 400 (llama-server answers 500).
"""

from __future__ import annotations

import asyncio
import http.client
import threading
from collections.abc import AsyncIterator
from urllib.parse import urljoin, urlsplit

from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse

from kvswap.core.errors import ErrorKind, KvswapError
from kvswap.server.state import get_state

router = APIRouter()

PROXY_HEADER_PREFIX = "x-llama-server-proxy-header-"
TIMEOUT_S = 600  # llama-server's read and write timeouts for the proxy
_MAX_REDIRECTS = 10
_CHUNK_BYTES = 64 << 10
# Not forwarded either way: hop-by-hop headers, and what the relay re-frames itself.
_DROPPED = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "content-length",
        "accept-encoding",
        "host",
    }
)


def explicit_headers(headers: list[tuple[str, str]]) -> dict[str, str]:
    """The headers the page asked to forward, their prefix removed (names as received:
    lowercase, which HTTP treats alike)."""
    out: dict[str, str] = {}
    for key, value in headers:
        if key.lower().startswith(PROXY_HEADER_PREFIX):
            name = key[len(PROXY_HEADER_PREFIX) :]
            if name and name.lower() not in _DROPPED:
                out[name] = value
    return out


def _target(url: str) -> tuple[str, str, int | None, str]:
    """(scheme, host, port, path with query) of a proxy target, or a typed 400."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise KvswapError(
            ErrorKind.INVALID_REQUEST, f"unsupported URL scheme in target URL: {parts.scheme!r}"
        )
    if not parts.hostname:
        raise KvswapError(ErrorKind.INVALID_REQUEST, "invalid target URL: missing host")
    if parts.password is not None or parts.username is not None:
        raise KvswapError(
            ErrorKind.INVALID_REQUEST, "authentication in target URL is not supported"
        )
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return parts.scheme, parts.hostname, parts.port, path


class _Upstream:
    """One proxied exchange on a worker thread: its response head, then body chunks."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.head: asyncio.Future[tuple[int, list[tuple[str, str]]]] = loop.create_future()
        self.chunks: asyncio.Queue[bytes | None] = asyncio.Queue()
        self.stopped = threading.Event()

    def run(self, method: str, url: str, headers: dict[str, str], body: bytes) -> None:
        try:
            resp, conn = self._open(method, url, headers, body)
        except (OSError, http.client.HTTPException, KvswapError) as err:
            self.loop.call_soon_threadsafe(self._fail, err)
            return
        try:
            kept = [(k, v) for k, v in resp.getheaders() if k.lower() not in _DROPPED]
            self.loop.call_soon_threadsafe(self.head.set_result, (resp.status, kept))
            while not self.stopped.is_set():
                chunk = resp.read1(_CHUNK_BYTES)
                if not chunk:
                    break
                self.loop.call_soon_threadsafe(self.chunks.put_nowait, chunk)
        except (OSError, http.client.HTTPException):
            pass  # the target hung up mid-body: the client sees the body end there
        finally:
            conn.close()
            self.loop.call_soon_threadsafe(self.chunks.put_nowait, None)

    def _open(
        self, method: str, url: str, headers: dict[str, str], body: bytes
    ) -> tuple[http.client.HTTPResponse, http.client.HTTPConnection]:
        for _ in range(_MAX_REDIRECTS + 1):
            scheme, host, port, path = _target(url)
            cls = http.client.HTTPSConnection if scheme == "https" else http.client.HTTPConnection
            conn = cls(host, port, timeout=TIMEOUT_S)
            conn.request(method, path, body=body or None, headers=headers)
            resp = conn.getresponse()
            location = resp.getheader("Location")
            if resp.status in (301, 302, 303, 307, 308) and location:
                conn.close()
                url = urljoin(url, location)
                if resp.status == 303:
                    method, body = "GET", b""
                continue
            return resp, conn
        raise KvswapError(ErrorKind.INVALID_REQUEST, "the target URL redirects too often")

    def _fail(self, err: BaseException) -> None:
        if not self.head.done():
            self.head.set_exception(err)


async def _proxy(request: Request, method: str) -> Response:
    state = get_state(request)
    if not state.config.http.ui_mcp_proxy:
        raise KvswapError(ErrorKind.PERMISSION, "this feature is disabled")
    url = request.query_params.get("url", "")
    _target(url)  # a bad URL is refused before anything is sent
    headers = explicit_headers(list(request.headers.items()))
    payload = await request.body() if method == "POST" else b""
    upstream = _Upstream(asyncio.get_running_loop())
    thread = threading.Thread(
        target=upstream.run,
        args=(method, url, headers, payload),
        name="kvswap-cors-proxy",
        daemon=True,
    )
    thread.start()
    try:
        status, head = await upstream.head  # a KvswapError (a bad redirect) passes through
    except (OSError, http.client.HTTPException) as err:
        raise KvswapError(
            ErrorKind.SERVER, f"the proxy target could not be reached: {err}"
        ) from err

    async def relay() -> AsyncIterator[bytes]:
        try:
            while (chunk := await upstream.chunks.get()) is not None:
                yield chunk
        finally:
            upstream.stopped.set()

    media_type = next((v for k, v in head if k.lower() == "content-type"), None)
    rest = {k: v for k, v in head if k.lower() != "content-type"}
    return StreamingResponse(relay(), status_code=status, headers=rest, media_type=media_type)


@router.get("/cors-proxy")
async def cors_proxy_get(request: Request) -> Response:
    return await _proxy(request, "GET")


@router.post("/cors-proxy")
async def cors_proxy_post(request: Request) -> Response:
    return await _proxy(request, "POST")
