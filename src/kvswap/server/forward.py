"""Forwarding a turn to the replica that owns its mind: the cluster's request path over HTTP.

`Forwarder` is an ASGI middleware inside the guard (keys and body limits are checked first):
1. It runs the app, the owners this request could not reach in its scope (`asgi.failed_owners`,
   read by `turnfacts.turn_facts`), and records the body as the app reads it.
2. A mind's session raises `minds.placement.OwnedElsewhere` when another live replica holds
   the mind's lease, before the turn's body is prepared (rendered, tokenized, grammar-checked:
   the owner does that). Its exception handler answers with an internal marker header, which
   the forwarder takes out (the client never sees it) and sends the recorded request to the
   owner's advertised URL instead: same method, path, query, headers and body, plus
   `X-Kvswap-Hop` (a forwarded turn is never forwarded again). The owner's answer streams back
   as it comes, its status and headers kept.
3. Until the owner's answer begins, the forwarder watches the owner's lease: an owner that
   cannot be reached, or whose lease expires or changes hands before it answers (it died, or
   froze), is abandoned, and the request runs here once more with that owner in
   `failed_owners`: the session waits its lease out and takes the mind over (or forwards to a
   newer owner: three owners at most, then a 503). Once the answer has begun, a failure
   cuts the client's response short, as the owner's death would have (the client retries).
4. After a forwarded turn the owner is asked, in the background, to hand the mind off (it
   publishes it and releases its lease once idle); the mind's next turn here waits for that
   and then takes the mind over with no re-prefill.
Every answer names its replica in `X-Kvswap-Replica` (a forwarded one, the owner).

Owns the HTTP client to the other replicas (`http`: one can be given, as the tests do). Runs on
the event loop; Redis is read through `minds.shared.SharedMinds`' worker threads.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from enum import Enum
from typing import Final

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import Response

from kvswap.core.errors import ErrorKind
from kvswap.core.keys import PageKey, PageKind
from kvswap.minds.placement import OwnedElsewhere, Owner
from kvswap.minds.shared import SharedMinds
from kvswap.server.asgi import (
    ASGIApp,
    Message,
    Receive,
    Scope,
    Send,
    until_disconnect,
    with_failed_owners,
)
from kvswap.server.errors import error_bytes
from kvswap.server.turnfacts import HOP_HEADER, scope_headers

log = logging.getLogger("kvswap.cluster")

REPLICA_HEADER: Final = "x-kvswap-replica"
_MARKER: Final = b"x-kvswap-forward"  # internal: the app asks the forwarder to forward
# Headers that belong to one connection, never passed on (RFC 9110 §7.6.1), and those the
# HTTP client or server sets itself.
_HOP_BY_HOP: Final = frozenset(
    {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
     "transfer-encoding", "upgrade", "host", "content-length", HOP_HEADER}
)  # fmt: skip
_NOT_RETURNED: Final = frozenset({*_HOP_BY_HOP - {"content-length"}, "date", "server"})
_AUTH_HEADERS: Final = ("authorization", "x-api-key")
_MAX_OWNERS: Final = 3  # owners a turn is forwarded to, one after the other, before a 503


def install(app: FastAPI) -> None:
    """The marker answer of `OwnedElsewhere` (taken out by the forwarder, never sent)."""

    @app.exception_handler(OwnedElsewhere)
    async def _forward(_: Request, exc: OwnedElsewhere) -> Response:
        return Response(status_code=307, headers={_MARKER.decode(): encode_owner(exc.owner)})


def encode_owner(owner: Owner) -> str:
    """As the marker header's value (JSON, ASCII: a name's other characters escaped)."""
    key = owner.key
    return json.dumps([key.namespace, key.name, owner.replica_id, owner.url, owner.token])


def decode_owner(text: bytes) -> Owner:
    namespace, name, replica_id, url, token = json.loads(text)
    key = PageKey(PageKind.MIND, str(namespace), str(name))
    return Owner(key, str(replica_id), str(url), str(token))


class _Outcome(Enum):
    ANSWERED = "answered"  # the owner's whole answer went to the client
    REFUSED = "refused"  # ... and it was an error (a 4xx or 5xx, passed on as it was)
    CUT = "cut"  # the answer began and broke off, or the client left
    NOT_REACHED = "not_reached"  # the owner gave nothing: run the turn here


class _Answer:
    """The app's `send`: names the replica, and takes a forward marker out."""

    def __init__(self, send: Send, replica_id: bytes) -> None:
        self._send = send
        self._replica_id = replica_id
        self.owner: Owner | None = None

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            headers = list(message.get("headers", []))
            marker = next((v for k, v in headers if k.lower() == _MARKER), None)
            if marker is not None:
                self.owner = decode_owner(marker)
                return
            if not any(k.lower() == REPLICA_HEADER.encode() for k, _ in headers):
                headers.append((REPLICA_HEADER.encode(), self._replica_id))
            message = {**message, "headers": headers}
        elif self.owner is not None:
            return  # the marker's body
        await self._send(message)


class Forwarder:
    """See the module docstring."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        replica_id: str,
        gate: Callable[[], SharedMinds | None],
        http: httpx.AsyncClient | None = None,
    ) -> None:
        self.app = app
        self.replica_id = replica_id
        self.gate = gate
        self._http = http

    @property
    def http(self) -> httpx.AsyncClient:
        """The client to the other replicas (made on the event loop, on first use)."""
        if self._http is None:
            timeout = httpx.Timeout(connect=2.0, read=None, write=30.0, pool=5.0)
            self._http = httpx.AsyncClient(timeout=timeout)
        return self._http

    async def aclose(self) -> None:
        if self._http is not None:
            await self._http.aclose()
            self._http = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []  # the body as the app read it
        reads = _recording(receive, chunks)
        failed: set[str] = set()  # owners this turn was forwarded to that gave no answer
        for _ in range(_MAX_OWNERS):
            answer = _Answer(send, self.replica_id.encode())
            await self.app(with_failed_owners(scope, frozenset(failed)), reads, answer)
            owner, gate = answer.owner, self.gate()
            if owner is None:
                return
            if gate is None:  # the server went to sleep or away meanwhile
                break
            body = b"".join(chunks)
            outcome = await self._forward(scope, body, owner, receive, send, gate)
            gate.forwarded(owner, ok=outcome is not _Outcome.NOT_REACHED)
            if outcome is _Outcome.ANSWERED:
                self._ask_handoff(scope, owner, gate)
            if outcome is not _Outcome.NOT_REACHED:
                return
            log.warning(
                "mind %s: its owner %s (%s) did not answer; taking the turn here",
                owner.key.name,
                owner.replica_id,
                owner.url,
            )
            failed.add(owner.token)
            chunks = []
            reads = _replaying(body, receive, chunks)
        await _unavailable(send, self.replica_id)

    async def _forward(
        self,
        scope: Scope,
        body: bytes,
        owner: Owner,
        receive: Receive,
        send: Send,
        gate: SharedMinds,
    ) -> _Outcome:
        path = scope.get("root_path", "") + scope["path"]
        query = scope.get("query_string", b"").decode("latin-1")
        url = owner.url + path + (f"?{query}" if query else "")
        headers = [
            (k, v) for k, v in scope["headers"] if k.decode("latin-1").lower() not in _HOP_BY_HOP
        ]
        headers.append((HOP_HEADER.encode(), self.replica_id.encode()))
        request = self.http.build_request(scope["method"], url, headers=headers, content=body)
        sending = asyncio.ensure_future(self.http.send(request, stream=True))
        watching = asyncio.ensure_future(gate.watch_owner(owner))
        leaving = asyncio.ensure_future(until_disconnect(receive))
        try:
            await asyncio.wait({sending, watching, leaving}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            watching.cancel()
        if not sending.done():
            # Read before the cancellation: a cancelled watch is done too once it has run.
            gone = leaving.done()
            sending.cancel()
            leaving.cancel()
            await asyncio.gather(sending, return_exceptions=True)
            return _Outcome.CUT if gone else _Outcome.NOT_REACHED
        try:
            upstream = sending.result()
        except httpx.HTTPError as err:
            leaving.cancel()
            log.debug("forward to %s failed before an answer: %s", owner.url, err)
            return _Outcome.NOT_REACHED
        try:
            return await _relay(upstream, send, leaving)
        finally:
            leaving.cancel()
            await upstream.aclose()

    def _ask_handoff(self, scope: Scope, owner: Owner, gate: SharedMinds) -> None:
        """Ask the owner to hand the mind off once idle (the next turn here waits for it)."""
        headers = {k: v for k, v in scope_headers(scope).items() if k in _AUTH_HEADERS}
        headers[HOP_HEADER] = self.replica_id
        url = owner.url + scope.get("root_path", "") + "/cluster/handoff"
        name = owner.key.name

        async def ask() -> None:
            try:
                r = await self.http.post(url, json={"mind": name}, headers=headers)
                log.debug("hand-off of %s asked of %s: %s", name, owner.replica_id, r.text)
            except httpx.HTTPError as err:
                log.info("hand-off of mind %s could not be asked of %s: %s", name, owner.url, err)

        gate.expect_handoff(owner.key, asyncio.ensure_future(ask()))


async def _relay(upstream: httpx.Response, send: Send, leaving: asyncio.Future[None]) -> _Outcome:
    """Stream the owner's answer to the client, status and headers kept."""
    headers = [
        (k.encode("latin-1"), v.encode("latin-1"))
        for k, v in upstream.headers.multi_items()
        if k.lower() not in _NOT_RETURNED
    ]
    await send({"type": "http.response.start", "status": upstream.status_code, "headers": headers})
    try:
        async for chunk in upstream.aiter_raw():
            if leaving.done():
                return _Outcome.CUT
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
    except httpx.HTTPError as err:
        log.warning("the owner's answer broke off: %s", err)
        return _Outcome.CUT  # the response stays incomplete: the client sees the break
    await send({"type": "http.response.body", "body": b"", "more_body": False})
    return _Outcome.ANSWERED if upstream.status_code < 400 else _Outcome.REFUSED


async def _unavailable(send: Send, replica_id: str) -> None:
    """A typed 503: the mind's owners kept changing and none answered."""
    message = "the mind's owner could not be reached; retry the turn"
    body = error_bytes(ErrorKind.UNAVAILABLE, message, retry_after_s=1)
    headers = [(b"content-type", b"application/json"), (b"retry-after", b"1"),
               (REPLICA_HEADER.encode(), replica_id.encode())]  # fmt: skip
    await send({"type": "http.response.start", "status": 503, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _recording(receive: Receive, chunks: list[bytes]) -> Receive:
    async def recorded() -> Message:
        message = await receive()
        if message["type"] == "http.request":
            chunks.append(bytes(message.get("body", b"")))
        return message

    return recorded


def _replaying(body: bytes, receive: Receive, chunks: list[bytes]) -> Receive:
    """The recorded body once, then the client's connection (its disconnect)."""
    sent = False

    async def replayed() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            chunks.append(body)
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed
