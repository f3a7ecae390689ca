"""The ASGI guard in front of every route: API prefix, API keys and tenants, body size, loading
state, sleep.

A plain ASGI middleware (no per-request task or body buffering of its own):
- `--api-prefix`: paths under the prefix are served with it stripped; others are 404.
- `--api-key`/`--api-key-file`: every route but /health and /v1/health needs a key, in
  `Authorization: Bearer KEY` or `X-Api-Key: KEY`, compared in constant time against every key.
  The request's tenant namespace (`core.keys.namespace_of` of the key it authenticated with, the
  public one on a key-less server) is set here, once, in the ASGI scope; `asgi.tenant_namespace`
  reads it. No route derives a tenant from headers itself.
- The web page's paths (`page_paths`: `/`, its files, `/sw.js`) need no key, are served while
  the model loads and never wake a sleeping server, as llama-server serves its UI; the page
  then asks for the key its API calls need.
- `--max-body-bytes`: a larger body (by Content-Length, or counted as it streams in) is a 413.
- While the model loads, every route (/health included) but the page's answers 503, as
  llama-server.
- `--sleep-idle-seconds` (`sleep.Sleeper`): every request but /health and the page's counts as
  activity and wakes a sleeping server first (a request without a valid key never does); /health
  answers 200 while asleep without waking it, and the read-only GETs (/props, /models,
  /v1/models, /metrics, and /slots) neither count nor wake: asleep, they get the answers the
  sleeper kept, as llama-server.

"""

from __future__ import annotations

import hmac
import json
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from kvswap.core.errors import ErrorKind
from kvswap.core.keys import PUBLIC_NAMESPACE, namespace_of
from kvswap.server.asgi import ASGIApp, Message, Receive, Scope, Send, with_namespace
from kvswap.server.errors import BodyTooLarge, error_bytes
from kvswap.server.internal import call_app
from kvswap.server.sleep import WakeFailed

if TYPE_CHECKING:
    from kvswap.server.sleep import Sleeper


PUBLIC_PATHS = frozenset({"/health", "/v1/health"})
# GETs that read what the server is and did: no activity, and answered while asleep (sleep.py).
READ_ONLY_PATHS = frozenset({"/props", "/models", "/v1/models", "/metrics", "/slots"})


def _body(kind: ErrorKind, message: str, status: int | None = None) -> tuple[int, bytes]:
    return status or kind.code, error_bytes(kind, message, status)


async def _respond(send: Send, status: int, body: bytes) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json; charset=utf-8"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


def key_matches(given: str, keys: Sequence[str]) -> bool:
    """Constant-time comparison against every key (no early exit on the first match)."""
    given_b = given.encode()
    ok = False
    for key in keys:
        ok |= hmac.compare_digest(given_b, key.encode())
    return ok


def _request_key(scope: Scope) -> str:
    headers = {k.lower(): v for k, v in scope.get("headers", [])}
    raw = headers.get(b"authorization") or headers.get(b"x-api-key") or b""
    value = raw.decode("latin-1")
    return value[len("Bearer ") :] if value.startswith("Bearer ") else value


class Guard:
    """Wraps the app; see the module docstring."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        api_keys: Sequence[str],
        api_prefix: str,
        max_body_bytes: int,
        is_ready: Callable[[], bool],
        sleeper: Sleeper | None = None,
        page_paths: frozenset[str] = frozenset(),
    ) -> None:
        self.sleeper = sleeper
        self.page_paths = page_paths
        if sleeper is not None:
            sleeper.fetch = self._fetch

        self.app = app
        self.api_keys = tuple(api_keys)
        self.api_prefix = api_prefix.rstrip("/")
        self.max_body_bytes = max_body_bytes
        self.is_ready = is_ready

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path: str = scope["path"]
        if self.api_prefix:
            if path != self.api_prefix and not path.startswith(self.api_prefix + "/"):
                await _respond(send, *_body(ErrorKind.NOT_FOUND, "File Not Found"))
                return
            path = path[len(self.api_prefix) :] or "/"
            scope = {
                **scope,
                "path": path,
                "root_path": scope.get("root_path", "") + self.api_prefix,
            }
        sleeper = self.sleeper
        if sleeper is not None and path in PUBLIC_PATHS and sleeper.sleeping:
            await _respond(send, 200, json.dumps({"status": "ok"}).encode())  # asleep, not down
            return
        if sleeper is not None and path in READ_ONLY_PATHS and scope.get("method") == "GET":
            # llama-server: these neither wake the server nor count as activity
            if not sleeper.sleeping:
                await self._serve(scope, receive, send, path)
                return
            answer = sleeper.asleep_answer(path)
            if answer is not None:
                if not self._key_ok(scope, path):
                    await _respond(send, *_body(ErrorKind.AUTHENTICATION, "Invalid API Key"))
                    return
                status, headers, body = answer
                await send({"type": "http.response.start", "status": status, "headers": headers})
                await send({"type": "http.response.body", "body": body})
                return
        if sleeper is not None and path not in PUBLIC_PATHS and path not in self.page_paths:
            if not self._key_ok(scope, path):  # refused before it counts: it never wakes it
                await _respond(send, *_body(ErrorKind.AUTHENTICATION, "Invalid API Key"))
                return
            try:
                await sleeper.enter()  # activity; wakes a sleeping server first
                await self._serve(scope, receive, send, path)
            except WakeFailed as err:
                await _respond(send, *_body(ErrorKind.SERVER, str(err)))
            finally:
                sleeper.leave()
            return
        await self._serve(scope, receive, send, path)

    async def _serve(self, scope: Scope, receive: Receive, send: Send, path: str) -> None:
        page = path in self.page_paths
        if not self.is_ready() and not page:
            await _respond(send, *_body(ErrorKind.UNAVAILABLE, "Loading model"))
            return

        if not self._key_ok(scope, path):
            await _respond(send, *_body(ErrorKind.AUTHENTICATION, "Invalid API Key"))
            return
        key = _request_key(scope)
        valid = bool(self.api_keys) and key_matches(key, self.api_keys)
        namespace = namespace_of(key if valid else "")
        scope = with_namespace(scope, namespace)
        headers = {k.lower(): v for k, v in scope.get("headers", [])}
        length = headers.get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_body_bytes:
            await _respond(send, *_too_large(self.max_body_bytes))
            return
        await self.app(scope, self._counting(receive), send)

    async def _fetch(self, path: str) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        """A GET through the app itself (no key, no activity): what the sleeper keeps."""
        return await call_app(self.app, "GET", path, like=with_namespace({}, PUBLIC_NAMESPACE))

    def _key_ok(self, scope: Scope, path: str) -> bool:
        return (
            not self.api_keys
            or path in self.page_paths
            or path in PUBLIC_PATHS
            or scope.get("method") == "OPTIONS"
            or key_matches(_request_key(scope), self.api_keys)
        )

    def _counting(self, receive: Receive) -> Receive:
        seen = 0
        limit = self.max_body_bytes

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            if message.get("type") == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise BodyTooLarge()
            return message

        return counted


def _too_large(limit: int) -> tuple[int, bytes]:
    return _body(
        ErrorKind.INVALID_REQUEST,
        f"request body is larger than the limit ({limit} bytes)",
        status=413,
    )
