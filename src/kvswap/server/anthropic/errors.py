"""Errors in Anthropic's shape on Anthropic's routes: `{"type": "error", "error": {"type",
"message"}}`, which Anthropic's client libraries read (their exception's message and type).

Every other route answers kvswap's one envelope, `{"error": {"code", "message", "type"}}`
(`server.errors`). Rather than teach each writer of that envelope (the typed errors' handlers,
the guard's 401/413/503, the forwarder's 503) a second shape, `AnthropicErrors` is an ASGI layer
outside the guard that rewrites an error answer of `/v1/messages` and
`/v1/messages/count_tokens` (after `--api-prefix`) into Anthropic's shape: the HTTP status kept,
the type Anthropic names for it (`invalid_request_error`, `authentication_error`, ...), the
message kept (a prompt longer than the context first says Anthropic's "prompt is too long: N
tokens > M maximum", the words Claude Code compacts its conversation on), and kvswap's own fields (`n_prompt_tokens`, `n_ctx`, `retry_after_s`) kept beside
them. An error inside a stream is an Anthropic `error` event (`anthropic.formats`). Success
answers pass untouched. Called by the app (`server.app`) only.
"""

from __future__ import annotations

import json
from typing import Any

from kvswap.server.asgi import ASGIApp, Message, Receive, Scope, Send

ROUTES = frozenset({"/v1/messages", "/v1/messages/count_tokens"})
EXCEED_CONTEXT = "exceed_context_size_error"  # kvswap's (llama-server's) type for a too-long prompt

# Anthropic's error types by HTTP status (https://docs.anthropic.com/en/api/errors); a status
# Anthropic never sends takes the nearest meaning.
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    501: "invalid_request_error",  # a feature kvswap lacks (images, documents)
    503: "overloaded_error",  # loading, a mind another server holds, a full store
    529: "overloaded_error",
}


def anthropic_error(status: int, message: str, **extra: object) -> dict[str, Any]:
    """Anthropic's error body for an answer of `status`."""
    error = {"type": ERROR_TYPES.get(status, "api_error"), "message": message, **extra}
    return {"type": "error", "error": error}


def reshaped(status: int, body: bytes) -> bytes | None:
    """kvswap's error envelope as Anthropic's, or None when `body` is not one."""
    try:
        doc = json.loads(body)
    except ValueError:
        return None
    error = doc.get("error") if isinstance(doc, dict) else None
    if not isinstance(error, dict) or not isinstance(error.get("message"), str):
        return None
    extra = {k: v for k, v in error.items() if k not in ("code", "message", "type")}
    message = error["message"]
    if error.get("type") == EXCEED_CONTEXT:  # the words Claude Code compacts its context on
        message = (
            f"prompt is too long: {extra.get('n_prompt_tokens')} tokens > "
            f"{extra.get('n_ctx')} maximum ({message})"
        )
    return json.dumps(anthropic_error(status, message, **extra)).encode()


class AnthropicErrors:
    """Wraps the guard; see the module docstring."""

    def __init__(self, app: ASGIApp, api_prefix: str = "") -> None:
        self.app = app
        self.api_prefix = api_prefix.rstrip("/")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "") if scope["type"] == "http" else ""
        if self.api_prefix and path.startswith(self.api_prefix + "/"):
            path = path[len(self.api_prefix) :]
        if path not in ROUTES:
            await self.app(scope, receive, send)
            return
        start: Message | None = None
        chunks: list[bytes] = []

        async def sending(message: Message) -> None:
            nonlocal start
            if message["type"] == "http.response.start" and int(message["status"]) >= 400:
                start = message  # held until the whole (small) error body is here
                return
            if start is None:
                await send(message)
                return
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                await _send_error(send, start, b"".join(chunks))

        await self.app(scope, receive, sending)


async def _send_error(send: Send, start: Message, body: bytes) -> None:
    status = int(start["status"])
    new = reshaped(status, body)
    if new is not None:
        headers = [(k, v) for k, v in start.get("headers", []) if k.lower() != b"content-length"]
        start = {**start, "headers": [*headers, (b"content-length", str(len(new)).encode())]}
        body = new
    await send(start)
    await send({"type": "http.response.body", "body": body})
