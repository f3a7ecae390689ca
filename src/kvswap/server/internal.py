"""One request through the ASGI app from inside the server (no socket).

Owns `call_app`: the Vertex AI predict route dispatches each instance with it, and the sleeper
renders the answers it serves while asleep. The request gets a fresh scope of its own, and
its body is read whole.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from kvswap.server.asgi import ASGIApp, Message, Scope


async def call_app(
    app: ASGIApp,
    method: str,
    path: str,
    body: bytes = b"",
    headers: Sequence[tuple[bytes, bytes]] = (),
    like: Scope | None = None,
) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    """(status, headers, body) of `method path` through `app`; `like` lends its client and
    server addresses, and its state (the tenant namespace)."""
    base = like or {}
    scope = {
        "type": "http",
        "asgi": base.get("asgi", {"version": "3.0"}),
        "http_version": base.get("http_version", "1.1"),
        "method": method,
        "scheme": base.get("scheme", "http"),
        "server": base.get("server"),
        "client": base.get("client"),
        "root_path": "",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "headers": [*headers, (b"content-length", str(len(body)).encode())],
        "state": dict(base.get("state", {})),  # the tenant the guard gave `like`
    }
    sent = False
    status = 500
    out_headers: list[tuple[bytes, bytes]] = []
    chunks: list[bytes] = []

    async def receive() -> Message:
        nonlocal sent
        if sent:
            await asyncio.Event().wait()  # no disconnect while the request runs
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: Message) -> None:
        nonlocal status, out_headers
        if message["type"] == "http.response.start":
            status = int(message["status"])
            out_headers = list(message.get("headers", []))
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))

    await app(scope, receive, send)
    return status, out_headers, b"".join(chunks)
