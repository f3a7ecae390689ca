"""GET/POST /cors-proxy?url=...: llama-server's CORS proxy for the web UI's MCP clients.

Owns the route and the forwarding. With `--ui-mcp-proxy` (or `--agent`) the request goes to
`url` (http or https, no credentials in it) with only the headers the page named explicitly:
`X-Llama-Server-Proxy-Header-NAME: v` is sent as `NAME: v`; everything else the browser sent
(the server's own API key, cookies, proxy credentials) stays here, as llama-server
(`server-cors-proxy.h`), and an explicit header that carries the caller's own `Authorization`
or `x-api-key` value is dropped too. The target's status, headers and body come back as they
arrive, so event streams pass through; hop-by-hop headers, `Set-Cookie` (it would set a cookie
on this server's origin) and `X-Kvswap-*` (kvswap's own signals between replicas, audit B1)
are dropped from its answer.

kvswap's bounds (audit B3, C3), beyond llama-server's:
- the target must be a public address unless `--ui-mcp-proxy-allow` lists it
  (`proxy_target`: every address of the host checked, the request pinned to the checked one);
  redirects are followed (as llama-server) through the same check, and one to another origin
  loses the explicit `Authorization`, `Cookie`, `Proxy-Authorization` and `x-api-key`;
- a request body past `--ui-mcp-proxy-max-bytes` is a typed 413 before anything is sent; an
  answer whose Content-Length is past it is a 502; a body without one is cut there (logged);
- the exchange runs on the event loop (httpx), no thread per request, and the target is read
  only as fast as the client reads (no buffering beyond one chunk).

Without the flag the route answers 403 (llama-server's type there is an untyped
`feature_disabled`; kvswap's is its `permission_error`, with the code). A bad target URL is a
typed 400 (llama-server answers 500); a target that cannot be resolved or reached is a 502.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterable
from urllib.parse import urljoin

import httpx
from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse

from kvswap.core.errors import ErrorKind, KvswapError
from kvswap.server.errors import error_response
from kvswap.server.llama.proxy_target import Target, TargetPolicy, UpstreamError, parse_target
from kvswap.server.state import get_state

log = logging.getLogger("kvswap.http")
router = APIRouter()

PROXY_HEADER_PREFIX = "x-llama-server-proxy-header-"
TIMEOUT_S = 600  # llama-server's read and write timeouts for the proxy
CONNECT_TIMEOUT_S = 30
MAX_BYTES_FLAG = "--ui-mcp-proxy-max-bytes"
_MAX_REDIRECTS = 10
_REDIRECTS = frozenset({301, 302, 303, 307, 308})
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
_NOT_RELAYED = _DROPPED | {"set-cookie"}
_CREDENTIALS = ("authorization", "x-api-key")
# Explicit headers that do not follow a redirect to another origin.
_ORIGIN_BOUND = frozenset({"authorization", "cookie", "proxy-authorization", "x-api-key"})


def explicit_headers(
    headers: Iterable[tuple[str, str]], own_secrets: frozenset[str] = frozenset()
) -> dict[str, str]:
    """The headers the page asked to forward, their prefix removed (names as received:
    lowercase, which HTTP treats alike), except one whose value is among `own_secrets` (the
    caller's own credentials, `own_credentials`)."""
    out: dict[str, str] = {}
    for key, value in headers:
        if key.lower().startswith(PROXY_HEADER_PREFIX):
            name = key[len(PROXY_HEADER_PREFIX) :]
            if name and name.lower() not in _DROPPED and value.strip() not in own_secrets:
                out[name] = value
    return out


def own_credentials(headers: Iterable[tuple[str, str]]) -> frozenset[str]:
    """The caller's `Authorization` and `x-api-key` values, with and without `Bearer `."""
    out: set[str] = set()
    for key, value in headers:
        if key.lower() in _CREDENTIALS and value.strip():
            value = value.strip()
            out |= {value, value.removeprefix("Bearer ").strip()}
    return frozenset(out)


def _relayed(name: str) -> bool:
    lowered = name.lower()
    return lowered not in _NOT_RELAYED and not lowered.startswith("x-kvswap-")


async def _read_body(request: Request, limit: int) -> bytes | None:
    """The request body, or None when it is longer than `limit` (read no further)."""
    chunks, n_bytes = [], 0
    async for chunk in request.stream():
        n_bytes += len(chunk)
        if n_bytes > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


async def _send(
    client: httpx.AsyncClient,
    policy: TargetPolicy,
    target: Target,
    method: str,
    headers: dict[str, str],
    body: bytes,
) -> httpx.Response:
    """One request to `target`, sent to its checked address; its answer, body unread."""
    address = await policy.resolve(target)
    default_port = 443 if target.scheme == "https" else 80
    host = f"[{target.host}]" if ":" in target.host else target.host
    host_header = host if target.port == default_port else f"{host}:{target.port}"
    url = httpx.URL(scheme=target.scheme, host=address, port=target.port)
    request = client.build_request(
        method,
        url.copy_with(raw_path=target.path.encode()),
        headers={**headers, "Host": host_header, "Accept-Encoding": "identity"},
        content=body or None,
        extensions={"sni_hostname": target.host} if target.scheme == "https" else {},
    )
    try:
        return await client.send(request, stream=True)
    except httpx.HTTPError as err:
        raise UpstreamError(f"the proxy target could not be reached: {err}") from err


async def _open(
    client: httpx.AsyncClient,
    policy: TargetPolicy,
    url: str,
    method: str,
    headers: dict[str, str],
    body: bytes,
) -> httpx.Response:
    """The target's answer, redirects followed (each hop checked)."""
    origin = parse_target(url).origin
    for _ in range(_MAX_REDIRECTS + 1):
        target = parse_target(url)
        if target.origin != origin:
            headers = {k: v for k, v in headers.items() if k.lower() not in _ORIGIN_BOUND}
        response = await _send(client, policy, target, method, headers, body)
        location = response.headers.get("location")
        if response.status_code not in _REDIRECTS or not location:
            return response
        await response.aclose()
        url = urljoin(url, location)
        if response.status_code == 303:
            method, body = "GET", b""
    raise KvswapError(ErrorKind.INVALID_REQUEST, "the target URL redirects too often")


async def _relay(
    client: httpx.AsyncClient, response: httpx.Response, limit: int
) -> AsyncIterator[bytes]:
    """The target's body as it arrives, cut at `limit` bytes; closes both at the end."""
    n_bytes = 0
    try:
        async for chunk in response.aiter_raw():
            if n_bytes + len(chunk) > limit:
                yield chunk[: limit - n_bytes]
                log.warning(
                    "/cors-proxy: the target's answer passed %s (%d bytes): cut there",
                    MAX_BYTES_FLAG, limit,
                )  # fmt: skip
                return
            n_bytes += len(chunk)
            yield chunk
    except httpx.HTTPError:
        pass  # the target hung up mid-body: the client sees the body end there
    finally:
        await response.aclose()
        await client.aclose()


async def _proxy(request: Request, method: str) -> Response:
    settings = get_state(request).config.http
    if not settings.ui_mcp_proxy:
        raise KvswapError(ErrorKind.PERMISSION, "this feature is disabled")
    url = request.query_params.get("url", "")
    parse_target(url)  # a bad URL is refused before anything is read or sent
    limit = settings.ui_mcp_proxy_max_bytes
    received = list(request.headers.items())
    headers = explicit_headers(received, own_credentials(received))
    payload = await _read_body(request, limit) if method == "POST" else b""
    if payload is None:
        return error_response(
            ErrorKind.INVALID_REQUEST,
            f"the request body is larger than {MAX_BYTES_FLAG} ({limit} bytes)",
            status=413,
        )
    client = httpx.AsyncClient(
        timeout=httpx.Timeout(TIMEOUT_S, connect=CONNECT_TIMEOUT_S), trust_env=False
    )
    try:
        response = await _open(
            client, TargetPolicy(settings.ui_mcp_proxy_allow), url, method, headers, payload
        )
    except UpstreamError as err:
        await client.aclose()
        return error_response(ErrorKind.SERVER, str(err), status=502)
    except BaseException:
        await client.aclose()
        raise
    length = response.headers.get("content-length", "")
    if length.isdigit() and int(length) > limit:
        await response.aclose()
        await client.aclose()
        return error_response(
            ErrorKind.SERVER,
            f"the target's answer ({length} bytes) is larger than {MAX_BYTES_FLAG} ({limit} bytes)",
            status=502,
        )
    kept = [(k, v) for k, v in response.headers.multi_items() if _relayed(k)]
    media_type = next((v for k, v in kept if k.lower() == "content-type"), None)
    rest = {k: v for k, v in kept if k.lower() != "content-type"}
    return StreamingResponse(
        _relay(client, response, limit),
        status_code=response.status_code,
        headers=rest,
        media_type=media_type,
    )


@router.get("/cors-proxy")
async def cors_proxy_get(request: Request) -> Response:
    return await _proxy(request, "GET")


@router.post("/cors-proxy")
async def cors_proxy_post(request: Request) -> Response:
    return await _proxy(request, "POST")
