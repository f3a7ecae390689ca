"""The forwarder on the CPU: a real FastAPI app whose turn raises `OwnedElsewhere` as a mind's
session does, the owners behind `httpx.MockTransport`, and a stand-in for the shared tier's
lease questions. No socket, no Redis, no model; every wait is an event the test sets.

Each test names the defect it would catch: an owner's answer lost or altered, the internal
marker leaking to the client, a dead owner's turn never served, a turn forwarded in a circle,
a cut answer replayed (the turn run twice), a forward loop that never ends.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from kvswap.core.keys import mind_key, namespace_of
from kvswap.minds.placement import OwnedElsewhere, Owner, Verdict, decide, wait_bound_s
from kvswap.server import forward
from kvswap.server.forward import Forwarder
from kvswap.server.peerauth import peer_key, sign, verify
from kvswap.server.turnfacts import turn_facts
from kvswap.tiers.shared.replica import Holder

KEY = mind_key(namespace_of("k"), "alice")
PEERS = frozenset(f"http://{name}:8080" for name in ("a", "b", "c", "d"))  # the cluster
BODY = b'{"mind": "alice", "messages": [{"role": "user", "content": "hi"}]}'


def owner(name: str) -> Owner:
    return Owner(KEY, name, f"http://{name}:8080", f"tok-{name}")


@dataclass
class Gate:
    """The shared tier's side of a forward (`minds.shared.SharedMinds`' surface)."""

    lease_changes: asyncio.Event = field(default_factory=asyncio.Event)
    outcomes: list[tuple[str, bool]] = field(default_factory=list)
    handoffs: list[asyncio.Future[None]] = field(default_factory=list)

    async def watch_owner(self, who: Owner) -> None:
        await self.lease_changes.wait()

    def forwarded(self, who: Owner, *, ok: bool) -> None:
        self.outcomes.append((who.replica_id, ok))

    def expect_handoff(self, key: object, asked: asyncio.Future[None]) -> None:
        self.handoffs.append(asked)


@dataclass
class App:
    """A replica's app: each pass of the turn raises `OwnedElsewhere` for the next owner in
    `owners`, then answers itself; `seen` records what each pass read."""

    owners: list[Owner]
    seen: list[dict[str, Any]] = field(default_factory=list)
    rule: Callable[[Request, bytes], None] | None = None  # decides instead of `owners`

    def build(self) -> FastAPI:
        app = FastAPI()
        forward.install(app)

        @app.post("/v1/chat/completions")
        async def the_turn(request: Request) -> JSONResponse:
            raw = await request.body()
            facts = turn_facts(request.scope, raw)
            assert facts is not None
            self.seen.append({"body": raw, "failed": facts.failed_owners, "hop": facts.hop})
            if self.rule is not None:
                self.rule(request, raw)
            elif len(self.seen) <= len(self.owners):
                raise OwnedElsewhere(self.owners[len(self.seen) - 1])
            return JSONResponse({"served": "here"})

        return app


@dataclass
class Owners:
    """The other replicas, through httpx.MockTransport: `answer(request)` by host."""

    answers: dict[str, Callable[[httpx.Request], Any]]
    requests: list[httpx.Request] = field(default_factory=list)
    bodies: list[bytes] = field(default_factory=list)

    async def handle(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        self.bodies.append(await request.aread())
        got = self.answers[request.url.host](request)
        if asyncio.iscoroutine(got):
            got = await got
        assert isinstance(got, httpx.Response)
        return got


class Chunks(httpx.AsyncByteStream):
    """An owner's streamed answer; `cut` breaks it off after the chunks."""

    def __init__(self, chunks: list[bytes], cut: bool = False) -> None:
        self.chunks = chunks
        self.cut = cut

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for chunk in self.chunks:
            yield chunk
        if self.cut:
            raise httpx.ReadError("the owner died mid-answer")


@dataclass
class Client:
    """What the client of replica a received."""

    messages: list[dict[str, Any]]

    @property
    def status(self) -> int:
        return int(self.messages[0]["status"])

    @property
    def headers(self) -> dict[str, str]:
        return {k.decode(): v.decode() for k, v in self.messages[0]["headers"]}

    @property
    def body(self) -> bytes:
        return b"".join(m.get("body", b"") for m in self.messages[1:])

    @property
    def complete(self) -> bool:
        return not self.messages[-1].get("more_body", False)


async def _call(
    app: App,
    owners: Owners,
    gate: Gate,
    headers: list[tuple[bytes, bytes]] | None = None,
    *,
    client_leaves: bool = False,
) -> Client:
    """One request to replica a through its forwarder (the client stays connected, unless
    it `client_leaves` once its body is sent)."""
    http = httpx.AsyncClient(transport=httpx.MockTransport(owners.handle))
    gates: Callable[[], Gate] = lambda: gate  # noqa: E731
    forwarder = Forwarder(app.build(), replica_id="a", peers=PEERS, gate=gates, http=http)  # type: ignore[arg-type]
    return await _call_forwarder(forwarder, headers=headers, client_leaves=client_leaves)


async def _call_forwarder(
    forwarder: Forwarder,
    path: str = "/v1/chat/completions",
    headers: list[tuple[bytes, bytes]] | None = None,
    *,
    client_leaves: bool = False,
) -> Client:
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
        "scheme": "http", "server": ("a", 8080), "client": ("127.0.0.1", 5000),
        "root_path": "", "path": path, "raw_path": path.encode(),
        "query_string": b"stream=1",
        "headers": [(b"content-type", b"application/json"), (b"authorization", b"Bearer k"),
                    (b"proxy-authorization", b"Basic eA=="), *(headers or [])],
        "state": {"kvswap.namespace": KEY.namespace},
    }  # fmt: skip
    sent_body = False
    never = asyncio.Event()
    out: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        nonlocal sent_body
        if not sent_body:
            sent_body = True
            return {"type": "http.request", "body": BODY, "more_body": False}
        if not client_leaves:
            await never.wait()
        return {"type": "http.disconnect"}

    async def send(message: Any) -> None:
        out.append(dict(message))

    await forwarder(scope, receive, send)
    for asked in forwarder.gate().handoffs:  # type: ignore[union-attr]
        await asked
    await forwarder.aclose()
    return Client(out)


def _stream(*chunks: bytes, cut: bool = False) -> Callable[[httpx.Request], httpx.Response]:
    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/cluster/handoff":
            return httpx.Response(200, json={"handed_off": True})
        headers = {"content-type": "text/event-stream", "x-kvswap-replica": "b"}
        return httpx.Response(200, headers=headers, stream=Chunks(list(chunks), cut=cut))

    return answer


def _unreachable(request: httpx.Request) -> httpx.Response:
    raise httpx.ConnectError("connection refused", request=request)


def test_the_owners_answer_streams_back_as_it_was() -> None:
    """Defect caught: the owner's answer altered (status, headers, chunks), the marker header
    leaking to the client, the request changed on the way (method, path, query, body, key),
    a hop-by-hop header passed on, or no hand-off asked after the forwarded turn."""
    app, gate = App([owner("b")]), Gate()
    owners = Owners({"b": _stream(b"data: 1\n\n", b"data: 2\n\n")})
    got = asyncio.run(_call(app, owners, gate))
    assert (got.status, got.body, got.complete) == (200, b"data: 1\n\ndata: 2\n\n", True)
    assert got.headers["x-kvswap-replica"] == "b"
    assert not any("forward" in k for k in got.headers)
    turn, handoff = owners.requests
    assert (turn.method, turn.url) == ("POST", "http://b:8080/v1/chat/completions?stream=1")
    assert owners.bodies[0] == BODY
    assert turn.headers["x-kvswap-hop"] == "a" and turn.headers["authorization"] == "Bearer k"
    assert "proxy-authorization" not in turn.headers  # one connection's, never passed on
    assert handoff.url.path == "/cluster/handoff" and json.loads(owners.bodies[1]) == {
        "mind": "alice"
    }
    assert handoff.headers["authorization"] == "Bearer k"
    assert gate.outcomes == [("b", True)]
    assert len(app.seen) == 1  # prepared nowhere here: the owner does it


def test_an_owner_not_reached_leaves_the_turn_to_run_here() -> None:
    """Defect caught: a dead owner's turn answered with an error (or hanging) instead of run
    here, its body lost on the second pass, or the dead owner not named to the session (which
    must then wait its lease out instead of forwarding to it again)."""
    app = App([owner("b")])
    owners = Owners({"b": _unreachable})
    gate = Gate()
    got = asyncio.run(_call(app, owners, gate))
    assert (got.status, json.loads(got.body)) == (200, {"served": "here"})
    assert got.headers["x-kvswap-replica"] == "a"
    assert [s["failed"] for s in app.seen] == [frozenset(), frozenset({"tok-b"})]
    assert app.seen[1]["body"] == BODY
    assert gate.outcomes == [("b", False)]


def test_an_owner_whose_lease_changes_before_it_answers_is_abandoned() -> None:
    """Defect caught: a turn stuck behind a frozen owner (it accepted the connection and never
    answered) after its lease expired or changed hands: the forward is cancelled and the turn
    runs here."""
    cancelled = asyncio.Event()

    async def frozen(request: httpx.Request) -> httpx.Response:
        try:
            await asyncio.Event().wait()
        finally:
            cancelled.set()
        raise AssertionError("unreachable")

    app = App([owner("b")])
    owners = Owners({"b": frozen})

    async def main() -> Client:
        gate = Gate()
        gate.lease_changes.set()  # the watch finds the lease changed at once
        return await _call(app, owners, gate)

    got = asyncio.run(main())
    assert json.loads(got.body) == {"served": "here"}
    assert cancelled.is_set()
    assert app.seen[1]["failed"] == frozenset({"tok-b"})


def test_a_client_gone_before_the_owner_answers_runs_the_turn_nowhere_else() -> None:
    """Defect caught: a turn whose client has left run here anyway (its mind would take a turn
    nobody reads, beside the owner's)."""

    async def frozen(request: httpx.Request) -> httpx.Response:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    app = App([owner("b")])
    got = asyncio.run(_call(app, Owners({"b": frozen}), Gate(), client_leaves=True))
    assert got.messages == []
    assert len(app.seen) == 1


def test_an_answer_cut_mid_stream_is_cut_for_the_client_and_never_replayed() -> None:
    """Defect caught: a turn whose owner died mid-answer run a second time here (the mind would
    take the turn twice), or the client's response closed as if complete."""
    app = App([owner("b")])
    owners = Owners({"b": _stream(b"data: 1\n\n", cut=True)})
    gate = Gate()
    got = asyncio.run(_call(app, owners, gate))
    assert (got.status, got.body) == (200, b"data: 1\n\n")
    assert not got.complete
    assert len(app.seen) == 1
    assert gate.handoffs == []  # no hand-off after a broken answer


def test_three_owners_that_give_nothing_end_in_a_503() -> None:
    """Defect caught: a turn chasing owners forever (each pass finding another one); after
    three, a typed 503 with Retry-After, named by this replica."""
    app = App([owner("b"), owner("c"), owner("d")])
    owners = Owners({h: _unreachable for h in ("b", "c", "d")})
    gate = Gate()
    got = asyncio.run(_call(app, owners, gate))
    assert got.status == 503
    assert got.headers["retry-after"] == "1" and got.headers["x-kvswap-replica"] == "a"
    error = json.loads(got.body)["error"]
    assert (error["code"], error["type"], error["retry_after_s"]) == (503, "unavailable_error", 1)
    assert [s["failed"] for s in app.seen] == [
        frozenset(),
        frozenset({"tok-b"}),
        frozenset({"tok-b", "tok-c"}),
    ]
    assert [o for o, _ in gate.outcomes] == ["b", "c", "d"]


def test_a_forwarded_turn_is_never_forwarded_again() -> None:
    """Defect caught: two replicas that each see the other as the owner bouncing a turn
    between them: with the real placement rule in the app, a turn that arrives with
    X-Kvswap-Hop is served (or waited) here, and the hop header the forwarder sends is its
    own, never the client's."""
    b = Holder("b", "http://b:8080", "tok-b", ttl_left_ms=4000)

    def rule(request: Request, raw: bytes) -> None:
        facts = turn_facts(request.scope, raw)
        verdict = decide(b, None, facts, mine=False, waited_s=0.0, bound_s=wait_bound_s(5.0))
        if verdict is Verdict.FORWARD:
            raise OwnedElsewhere(Owner(KEY, b.replica_id, b.url, b.token))

    owners = Owners({"b": _stream(b"data: from b\n\n")})

    async def main() -> tuple[Client, Client]:
        direct = await _call(App([], rule=rule), owners, Gate())
        hopped = await _call(App([], rule=rule), owners, Gate(), [(b"x-kvswap-hop", b"c")])
        return direct, hopped

    direct, hopped = asyncio.run(main())
    assert direct.body == b"data: from b\n\n"
    assert owners.requests[0].headers.get_list("x-kvswap-hop") == ["a"]
    assert json.loads(hopped.body) == {"served": "here"}
    assert [r.url.path for r in owners.requests] == ["/v1/chat/completions", "/cluster/handoff"]


def test_a_response_that_names_an_owner_is_passed_on_never_forwarded() -> None:
    """Audit B1: the app asked the forwarder to forward through a response header, so any
    response carrying it (one /cors-proxy relays from a third-party server) made the
    forwarder send the client's request, API key included, to a URL that response chose."""
    marker = json.dumps(["ns", "x", "r9", "http://evil.example", "tok"])

    built = App([]).build()

    @built.post("/cors-proxy")
    async def proxy_like(request: Request) -> JSONResponse:
        return JSONResponse({"from": "mcp"}, headers={"x-kvswap-forward": marker})

    owners = Owners({"evil.example": lambda _: httpx.Response(200, text="stolen")})
    http = httpx.AsyncClient(transport=httpx.MockTransport(owners.handle))
    forwarder = Forwarder(built, replica_id="a", peers=PEERS, gate=lambda: Gate(), http=http)  # type: ignore[arg-type,return-value]
    got = asyncio.run(_call_forwarder(forwarder, "/cors-proxy"))
    assert owners.requests == []
    assert got.status == 200 and json.loads(got.body) == {"from": "mcp"}


def test_a_lease_naming_a_url_outside_the_cluster_is_refused() -> None:
    """Audit B1/B5: anything that can write Redis could name itself in a mind's lease and
    collect the turns, keys and prompts forwarded to it; only the cluster's own replicas
    (`--shared-tier-peers`) are ever sent a turn."""
    stranger = Owner(KEY, "r9", "http://evil.example:8080", "tok-r9")
    app, gate = App([stranger]), Gate()
    owners = Owners({"evil.example": lambda _: httpx.Response(200, text="stolen")})
    got = asyncio.run(_call(app, owners, gate))
    assert owners.requests == []
    assert got.status == 503 and int(got.headers["retry-after"]) >= 1
    assert "not a replica of this cluster" in json.loads(got.body)["error"]["message"]


def test_a_full_connection_pool_is_a_503_and_the_owner_is_kept() -> None:
    """Audit A7: past the HTTP client's pool, a PoolTimeout counted as a dead owner: the live
    owner was marked failed and the turn waited out a lease that kept being renewed."""
    app, gate = App([owner("b")]), Gate()

    def pool_full(_: httpx.Request) -> httpx.Response:
        raise httpx.PoolTimeout("no connection free in the pool")

    got = asyncio.run(_call(app, Owners({"b": pool_full}), gate))
    assert got.status == 503 and int(got.headers["retry-after"]) >= 1
    assert len(app.seen) == 1 and gate.outcomes == []  # never run here, the owner not blamed


KEY_OF_CLUSTER = peer_key("redis://:s3cret@redis:6379/0")


def test_a_hop_mark_or_a_hand_off_needs_a_replicas_signature() -> None:
    """Audit B6: `X-Kvswap-Hop` and POST /cluster/handoff were open to clients: a hand-off
    alternated with a turn made the owner publish its whole mind each time (Redis traffic
    paid by every tenant), a forged hop failed one's own turns. Replicas now sign them with a
    key from the tier's password; a client's hop mark is dropped (the turn is forwarded as
    usual), a hand-off it asks is a 403, and the forwarder's own requests carry a signature
    the receiving replica accepts."""
    assert KEY_OF_CLUSTER is not None and peer_key("redis://redis:6379/0") is None
    app, gate = App([owner("b")]), Gate()
    owners = Owners({"b": _stream(b"data: 1\n\n")})
    http = httpx.AsyncClient(transport=httpx.MockTransport(owners.handle))
    gates: Callable[[], Gate] = lambda: gate  # noqa: E731
    forwarder = Forwarder(
        app.build(), replica_id="a", peers=PEERS, gate=gates, http=http,  # type: ignore[arg-type]
        peer_key=KEY_OF_CLUSTER,
    )  # fmt: skip
    forged = [(b"x-kvswap-hop", b"r9")]
    got = asyncio.run(_call_forwarder(forwarder, headers=forged))
    assert got.status == 200 and app.seen[0]["hop"] == ""  # not honoured: forwarded to b
    turn, handoff = owners.requests
    for sent in (turn, handoff):  # b accepts what a signed
        assert verify(KEY_OF_CLUSTER, sent.headers["x-kvswap-peer"], "POST", sent.url.path) == "a"
    refused = asyncio.run(_call_forwarder(forwarder, "/cluster/handoff"))
    assert refused.status == 403
    assert json.loads(refused.body)["error"]["type"] == "permission_error"
    signed = sign(KEY_OF_CLUSTER, "b", "POST", "/cluster/handoff")
    passed = asyncio.run(
        _call_forwarder(forwarder, "/cluster/handoff", [(b"x-kvswap-peer", signed.encode())])
    )
    assert passed.status == 404  # through to the app (this stand-in has no such route)
    assert verify(KEY_OF_CLUSTER, signed, "POST", "/v1/chat/completions") is None
