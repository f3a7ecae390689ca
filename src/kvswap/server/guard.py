"""The ASGI guard in front of every route: API prefix, API keys and tenants, body size, loading
state, sleep.

A plain ASGI middleware (no per-request task or body buffering of its own), in this order:
- `--api-prefix`: paths under the prefix are served with it stripped; others are 404.
- While the model loads, every route (/health included) answers 503, as llama-server.
- `--api-key`/`--api-key-file`: every route but /health and /v1/health needs a key, in
  `Authorization: Bearer KEY` or `X-Api-Key: KEY`, compared in constant time against every key.
  The request's tenant namespace (`core.keys.namespace_of` of the key it authenticated with, the
  public one on a key-less server) is set here, once, in the ASGI scope; `tenant_namespace`
  reads it. No route derives a tenant from headers itself.
- `--max-body-bytes`: a larger body (by Content-Length, or counted as it streams in) is a 413.
- `--sleep-idle-seconds` (`sleep.Sleeper`): a request that passed all of the above counts as
  activity and wakes a sleeping server first, so a request without a valid key never wakes it.
  The read-only routes llama-server serves while asleep (/health, /props, /models, /v1/models,
  /metrics) and /slots answer from what the server showed when it fell asleep, without waking
  it and without counting as activity.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from typing import Any

from kvswap.core.errors import ErrorKind
from kvswap.core.keys import namespace_of
from kvswap.server.sleep import Sleeper, WakeFailed

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

PUBLIC_PATHS = frozenset({"/health", "/v1/health"})
# GET routes answered while asleep without waking (llama-server's `bypass_sleep`, and /slots).
SLEEP_EXEMPT = frozenset({*PUBLIC_PATHS, "/props", "/models", "/v1/models", "/metrics", "/slots"})
_NAMESPACE = "kvswap.namespace"  # the scope["state"] entry the guard sets


def _body(kind: ErrorKind, message: str, status: int | None = None) -> tuple[int, bytes]:
    payload = {"error": {"code": status or kind.code, "message": message, "type": kind.value}}
    return status or kind.code, json.dumps(payload).encode()


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


class BodyTooLarge(Exception):
    """The request body went past --max-body-bytes while streaming in."""


def tenant_namespace(scope: Scope) -> str:
    """The tenant namespace the guard gave this request (set for every request it let in)."""
    namespace = scope.get("state", {}).get(_NAMESPACE)
    assert isinstance(namespace, str) and namespace, "a request that did not pass the guard"
    return namespace


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
    ) -> None:
        self.sleeper = sleeper

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
        if not self.is_ready():
            await _respond(send, *_body(ErrorKind.UNAVAILABLE, "Loading model"))
            return
        key = _request_key(scope)
        valid = bool(self.api_keys) and key_matches(key, self.api_keys)
        if (
            self.api_keys
            and not valid
            and path not in PUBLIC_PATHS
            and scope.get("method") != "OPTIONS"
        ):
            await _respond(send, *_body(ErrorKind.AUTHENTICATION, "Invalid API Key"))
            return
        namespace = namespace_of(key if valid else "")
        scope = {**scope, "state": {**scope.get("state", {}), _NAMESPACE: namespace}}
        headers = {k.lower(): v for k, v in scope.get("headers", [])}
        length = headers.get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_body_bytes:
            await _respond(send, *_too_large(self.max_body_bytes))
            return
        sleeper, method = self.sleeper, scope.get("method")
        if sleeper is None or method == "OPTIONS" or (path in SLEEP_EXEMPT and method == "GET"):
            await self.app(scope, self._counting(receive), send)
            return
        try:
            await sleeper.enter()  # activity; wakes a sleeping server first
            await self.app(scope, self._counting(receive), send)
        except WakeFailed as err:
            await _respond(send, *_body(ErrorKind.SERVER, str(err)))
        finally:
            sleeper.leave()

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
