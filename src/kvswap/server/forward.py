"""Forwarding a turn to the replica that owns its mind: the cluster's request path over HTTP.

`Forwarder` is an ASGI middleware inside the guard (keys and body limits are checked first):
1. It runs the app, the owners this request could not reach in its scope (`asgi.failed_owners`,
   read by `turnfacts.turn_facts`), and records the body as the app reads it.
2. A mind's session raises `minds.placement.OwnedElsewhere` when another live replica holds
   the mind's lease, before the turn's body is prepared (rendered, tokenized, grammar-checked:
   the owner does that). Its exception handler names the owner in the request's
   `asgi.ForwardSlot` (never in a response header: a response may come from anywhere, and
   /cors-proxy relays any server's) and its answer is dropped; the forwarder sends the
   recorded request to the owner's advertised URL instead, but only when that URL is one of
   the cluster's replicas (`--shared-tier-peers`: a lease value written by anything else that
   reaches Redis never draws a client's request, API key included, elsewhere): same method,
   path, query, headers and body, plus `X-Kvswap-Hop` (a forwarded turn is never forwarded
   again). The owner's answer streams back as it comes, its status and headers kept.
3. Until the owner's answer begins, the forwarder watches the owner's lease: an owner that
   cannot be reached, or whose lease expires or changes hands before it answers (it died, or
   froze), is abandoned, and the request runs here once more with that owner in
   `failed_owners`: the session waits its lease out and takes the mind over (or forwards to a
   newer owner: three owners at most, then a 503). Once the answer has begun, a failure
   cuts the client's response short, as the owner's death would have (the client retries).
4. After a forwarded turn (not a read: a GET of a mind's history) the owner is asked, in the
   background, to hand the mind off (it
   publishes it and releases its lease once idle); the mind's next turn here waits for that
   and then takes the mind over with no re-prefill.
Every answer names its replica in `X-Kvswap-Replica` (a forwarded one, the owner). Requests
between replicas are signed (`peerauth`, with a key derived from the tier's password): a hop
mark without a valid signature is dropped, and a hand-off request without one is a typed 403. A request
the forwarder's HTTP client cannot even start (its connection pool full: local back-pressure,
not a dead owner) answers a typed 503 with `Retry-After`, the owner left alone.

Owns the HTTP client to the other replicas (`http`: one can be given, as the tests do). Runs on
the event loop; Redis is read through `minds.shared.SharedMinds`' worker threads.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from enum import Enum
from typing import Final
from urllib.parse import unquote

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import Response

from kvswap.core.errors import ErrorKind, MindUnavailable
from kvswap.minds.placement import OwnedElsewhere, Owner
from kvswap.minds.shared import SharedMinds
from kvswap.server.asgi import (
    ASGIApp,
    ForwardSlot,
    Message,
    Receive,
    Scope,
    Send,
    forward_slot,
    until_disconnect,
    with_failed_owners,
)
from kvswap.server.errors import error_bytes
from kvswap.server.peerauth import PEER_HEADER, sign, verify
from kvswap.server.turnfacts import HOP_HEADER, scope_headers

log = logging.getLogger("kvswap.cluster")

REPLICA_HEADER: Final = "x-kvswap-replica"
# Headers that belong to one connection, never passed on (RFC 9110 §7.6.1), and those the
# HTTP client or server sets itself.
_HOP_BY_HOP: Final = frozenset(
    {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
     "transfer-encoding", "upgrade", "host", "content-length", HOP_HEADER}
)  # fmt: skip
_NOT_RETURNED: Final = frozenset({*_HOP_BY_HOP - {"content-length"}, "date", "server"})
_AUTH_HEADERS: Final = ("authorization", "x-api-key")
_MAX_OWNERS: Final = 3  # owners a turn is forwarded to, one after the other, before a 503
_MAX_CONNECTIONS: Final = 1000  # forwarded turns in flight at once (each a streamed answer)
HANDOFF_PATH: Final = "/cluster/handoff"


def install(app: FastAPI) -> None:
    """`OwnedElsewhere` names the owner in the forwarder's slot; its answer is dropped (a
    typed 503 where no forwarder is in front: such a turn is never forwarded)."""

    @app.exception_handler(OwnedElsewhere)
    async def _forward(request: Request, exc: OwnedElsewhere) -> Response:
        slot = forward_slot(request.scope)
        if slot is None:
            raise MindUnavailable(
                f"the mind is served by {exc.owner.replica_id}; retry the turn", retry_after_s=1
            )
        slot.owner = exc.owner
        return Response(status_code=307)


class _Outcome(Enum):
    ANSWERED = "answered"  # the owner's whole answer went to the client
    REFUSED = "refused"  # ... and it was an error (a 4xx or 5xx, passed on as it was)
    CUT = "cut"  # the answer began and broke off, or the client left
    NOT_REACHED = "not_reached"  # the owner gave nothing: run the turn here
    BUSY = "busy"  # this replica's own client had no connection free: a 503, the owner kept


class _Answer:
    """The app's `send`: names the replica; drops the answer of a turn the app named an owner
    for in `slot`."""

    def __init__(self, send: Send, replica_id: bytes) -> None:
        self._send = send
        self._replica_id = replica_id
        self.slot = ForwardSlot()

    @property
    def owner(self) -> Owner | None:
        owner = self.slot.owner
        return owner if isinstance(owner, Owner) else None

    async def __call__(self, message: Message) -> None:
        if self.owner is not None:
            return  # the app's answer to a turn that goes to its owner
        if message["type"] == "http.response.start":
            headers = list(message.get("headers", []))
            if not any(k.lower() == REPLICA_HEADER.encode() for k, _ in headers):
                headers.append((REPLICA_HEADER.encode(), self._replica_id))
            message = {**message, "headers": headers}
        await self._send(message)


class Forwarder:
    """See the module docstring."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        replica_id: str,
        peers: frozenset[str],
        gate: Callable[[], SharedMinds | None],
        http: httpx.AsyncClient | None = None,
        peer_key: bytes | None = None,
    ) -> None:
        """`peers`: the advertised URLs of the cluster's replicas, the only places a turn or
        a hand-off request is ever sent; `peer_key`: what replica-to-replica requests are
        signed and checked with (`peerauth`; None: nothing is)."""
        self.app = app
        self.replica_id = replica_id
        self.peers = peers
        self.gate = gate
        self.peer_key = peer_key
        self._http = http

    @property
    def http(self) -> httpx.AsyncClient:
        """The client to the other replicas (made on the event loop, on first use)."""
        if self._http is None:
            timeout = httpx.Timeout(connect=2.0, read=None, write=30.0, pool=5.0)
            limits = httpx.Limits(max_connections=_MAX_CONNECTIONS, max_keepalive_connections=64)
            self._http = httpx.AsyncClient(timeout=timeout, limits=limits)
        return self._http

    async def aclose(self) -> None:
        if self._http is not None:
            await self._http.aclose()
            self._http = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if not self._from_a_peer(scope):
            if scope["path"].endswith(HANDOFF_PATH):
                await _refused(send, self.replica_id)
                return
            scope = _without_hop(scope)  # a client's hop mark is not honoured
        chunks: list[bytes] = []  # the body as the app read it
        reads = _recording(receive, chunks)
        failed: set[str] = set()  # owners this turn was forwarded to that gave no answer
        for _ in range(_MAX_OWNERS):
            answer = _Answer(send, self.replica_id.encode())
            await self.app(with_failed_owners(scope, frozenset(failed), answer.slot), reads, answer)
            owner, gate = answer.owner, self.gate()
            if owner is None:
                return
            if gate is None:  # the server went to sleep or away meanwhile
                break
            if owner.url not in self.peers:
                log.error(
                    "mind %s: its lease names %s (%s), not a replica of this cluster "
                    "(--shared-tier-peers): the turn is not sent there",
                    owner.key.name,
                    owner.replica_id,
                    owner.url,
                )
                await _unavailable(
                    send, self.replica_id, "the mind's owner is not a replica of this cluster"
                )
                return
            body = b"".join(chunks)
            outcome = await self._forward(scope, body, owner, receive, send, gate)
            if outcome is _Outcome.BUSY:
                await _unavailable(
                    send, self.replica_id, "this replica is forwarding too many turns"
                )
                return
            if outcome is _Outcome.ANSWERED and scope["method"] != "GET":
                self._ask_handoff(scope, owner, gate)  # a read leaves the mind where it is
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

    def _from_a_peer(self, scope: Scope) -> bool:
        """Signed by a replica of this cluster (`peerauth`), or nothing to check with."""
        if self.peer_key is None:
            return True
        value = scope_headers(scope).get(PEER_HEADER)
        path = unquote(bytes(scope.get("raw_path") or scope["path"].encode()).decode("latin-1"))
        return value is not None and verify(self.peer_key, value, scope["method"], path) is not None

    def _signed(self, method: str, path: str) -> list[tuple[bytes, bytes]]:
        if self.peer_key is None:
            return []
        value = sign(self.peer_key, self.replica_id, method, unquote(path))
        return [(PEER_HEADER.encode(), value.encode())]

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
            (k, v)
            for k, v in scope["headers"]
            if k.decode("latin-1").lower() not in _HOP_BY_HOP | {PEER_HEADER}
        ]
        headers.append((HOP_HEADER.encode(), self.replica_id.encode()))
        headers += self._signed(scope["method"], path)
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
            gate.forwarded(owner, ok=gone)  # a client that left is not the owner's failure
            return _Outcome.CUT if gone else _Outcome.NOT_REACHED
        try:
            upstream = sending.result()
        except httpx.PoolTimeout as err:
            leaving.cancel()
            log.warning("forward to %s waited for a connection of its own pool: %s", owner.url, err)
            return _Outcome.BUSY
        except httpx.HTTPError as err:
            leaving.cancel()
            log.debug("forward to %s failed before an answer: %s", owner.url, err)
            gate.forwarded(owner, ok=False)
            return _Outcome.NOT_REACHED
        # Counted once the owner answers, before its answer is relayed: a client that has read
        # the whole answer finds the forward in /pages and /metrics.
        gate.forwarded(owner, ok=True)
        try:
            return await _relay(upstream, send, leaving)
        finally:
            leaving.cancel()
            await upstream.aclose()

    def _ask_handoff(self, scope: Scope, owner: Owner, gate: SharedMinds) -> None:
        # `owner.url` is one of `peers` (checked before the turn was forwarded)
        """Ask the owner to hand the mind off once idle (the next turn here waits for it)."""
        headers = {k: v for k, v in scope_headers(scope).items() if k in _AUTH_HEADERS}
        headers[HOP_HEADER] = self.replica_id
        path = scope.get("root_path", "") + HANDOFF_PATH
        headers.update((k.decode(), v.decode()) for k, v in self._signed("POST", path))
        url = owner.url + path
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


async def _refused(send: Send, replica_id: str) -> None:
    """A typed 403: a hand-off asked by anyone but a replica of this cluster."""
    body = error_bytes(ErrorKind.PERMISSION, "only a replica of this cluster may ask a hand-off")
    headers = [(b"content-type", b"application/json"),
               (REPLICA_HEADER.encode(), replica_id.encode())]  # fmt: skip
    await send({"type": "http.response.start", "status": 403, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _without_hop(scope: Scope) -> Scope:
    headers = [(k, v) for k, v in scope["headers"] if k.lower() != HOP_HEADER.encode()]
    return {**scope, "headers": headers}


async def _unavailable(
    send: Send, replica_id: str, why: str = "the mind's owner could not be reached"
) -> None:
    """A typed 503 with Retry-After (the owners kept changing and none answered, ...)."""
    body = error_bytes(ErrorKind.UNAVAILABLE, f"{why}; retry the turn", retry_after_s=1)
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
