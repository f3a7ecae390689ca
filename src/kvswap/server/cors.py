"""CORS exactly as the pinned llama-server answers it (`server-http.cpp`'s pre-routing handler).

Owns `CorsPolicy` (the `--cors-*` flags) and `CorsMiddleware`, the outermost ASGI layer, so its
headers reach every answer: the 503 while loading, a 401, a 404, a stream.

- `Access-Control-Allow-Origin`, on every response:
  - `--cors-origins *` (the default) with credentials allowed (the default): the request's
    `Origin` echoed back, as llama-server; a request with no `Origin` (no browser sent it)
    gets no header, where llama-server sends an empty one (docs/COMPAT.md);
  - `--cors-origins localhost`: the `Origin` echoed only when its host is `localhost`,
    `127.0.0.1` or `::1` (any port, http or https); another origin gets no header (logged);
  - any other value: that value, verbatim.
- Header names are sent in llama-server's case (clients that copy headers into a plain dict,
  as llama.cpp's own test suite does, look them up that way).
- `OPTIONS` (a preflight) is answered here, 200 with an empty `text/html` body, before the
  loading state and the API key are looked at (browsers send no key on a preflight), with
  `Access-Control-Allow-Credentials`, `-Methods` (`--cors-methods`) and `-Headers`
  (`--cors-headers`).

The Origin parsing follows llama.cpp's `common_http_parse_url`: a scheme other than http/https,
no `://`, an unclosed IPv6 bracket or a port that is not a number make it "not localhost".
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass

from kvswap.config.settings import HttpSettings
from kvswap.server.asgi import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger("kvswap.server")

LOCALHOST_ORIGINS = "localhost"  # the special --cors-origins value
_LOCAL_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})
_INT32_MAX = (1 << 31) - 1
_LEADING_INT = re.compile(r"\s*[+-]?\d+")  # what std::stoi reads before stopping


@dataclass(frozen=True)
class CorsPolicy:
    """The `--cors-*` flags, with llama-server's defaults."""

    origins: str = "*"  # --cors-origins (LLAMA_ARG_CORS_ORIGINS)
    methods: str = "GET, POST, DELETE, OPTIONS"  # --cors-methods
    headers: str = "*"  # --cors-headers
    credentials: bool = True  # --cors-credentials/--no-cors-credentials

    def allow_origin(self, origin: str | None) -> str | None:
        """The Access-Control-Allow-Origin value for a request's Origin; None: no header."""
        if self.credentials and self.origins == "*":
            return origin or None
        if self.origins == LOCALHOST_ORIGINS:
            if origin and origin_is_localhost(origin):
                return origin
            if origin:
                log.warning("(CORS) skip non-localhost origin: %s", origin)
            return None
        return self.origins


def cors_policy(http: HttpSettings) -> CorsPolicy:
    return CorsPolicy(
        http.cors_origins, http.cors_methods, http.cors_headers, http.cors_credentials
    )


def origin_host(origin: str) -> str | None:
    """The host of an Origin value as llama.cpp parses URLs; None where its parser throws."""
    scheme, sep, rest = origin.partition("://")
    if not sep or scheme not in ("http", "https"):
        return None
    rest = rest.split("@", 1)[1] if "@" in rest else rest
    authority = rest.split("/", 1)[0]
    if authority.startswith("["):
        close = authority.find("]")
        if close < 0:
            return None
        host, after = authority[1:close], authority[close + 1 :]
        port = after[1:] if after.startswith(":") else ""
    else:
        host, _, port = authority.partition(":")
    if port:
        digits = _LEADING_INT.match(port)
        if digits is None or abs(int(digits.group())) > _INT32_MAX:
            return None
    return host


def origin_is_localhost(origin: str) -> bool:
    return origin_host(origin) in _LOCAL_HOSTS


class CorsMiddleware:
    """Wraps the whole app; see the module docstring."""

    def __init__(self, app: ASGIApp, policy: CorsPolicy) -> None:
        self.app = app
        self.policy = policy

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        origin = _header(scope, b"origin")
        allow = self.policy.allow_origin(origin)
        extra = [] if allow is None else [(b"Access-Control-Allow-Origin", allow.encode())]
        if scope.get("method") == "OPTIONS":
            await self._preflight(send, extra)
            return

        async def send_with_cors(message: Message) -> None:
            if message["type"] == "http.response.start" and extra:
                message = {**message, "headers": [*message.get("headers", []), *extra]}
            await send(message)

        await self.app(scope, receive, send_with_cors)

    async def _preflight(self, send: Send, extra: list[tuple[bytes, bytes]]) -> None:
        p = self.policy
        headers = [
            *extra,
            (b"Access-Control-Allow-Credentials", b"true" if p.credentials else b"false"),
            (b"Access-Control-Allow-Methods", p.methods.encode()),
            (b"Access-Control-Allow-Headers", p.headers.encode()),
            (b"Content-Type", b"text/html"),
            (b"Content-Length", b"0"),
        ]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b""})


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key.lower() == name:
            return str(value.decode("latin-1"))
    return None
