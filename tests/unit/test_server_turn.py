"""A generation route's first step on the CPU (`server.streaming.turn`): which mind the request
names, the mind held before anything is prepared, and a client that leaves while its turn
waits for the mind; with a stand-in for the minds' session (no engine, no socket).

Each test names the defect it would catch.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
from starlette.requests import Request

from kvswap.core.errors import ErrorKind, KvswapError
from kvswap.core.keys import PageKey, mind_key, namespace_of
from kvswap.engine.client import ClientGone
from kvswap.minds.placement import OwnedElsewhere, Owner, TurnFacts
from kvswap.server.asgi import ForwardSlot, with_failed_owners, with_namespace
from kvswap.server.streaming import named_mind, turn

NS = namespace_of("key")


def request(
    body: bytes,
    headers: dict[str, str] | None = None,
    *,
    leaves: bool = False,
    forwarded: bool = False,
) -> Request:
    """A request as the guard (and, when `forwarded`, the forwarder) passed it on."""
    scope: dict[str, Any] = {
        "type": "http", "method": "POST", "path": "/v1/chat/completions", "query_string": b"",
        "headers": [(k.lower().encode(), v.encode("latin-1")) for k, v in (headers or {}).items()],
    }  # fmt: skip
    scope = with_namespace(scope, NS)
    if forwarded:
        scope = with_failed_owners(scope, frozenset({"tok-b"}), ForwardSlot())
    sent = False
    never = asyncio.Event()

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        if not leaves:
            await never.wait()
        return {"type": "http.disconnect"}

    return Request(scope, receive)


@dataclass
class Minds:
    """The session: `turn` records what it was asked and waits for `free` (when given)."""

    free: asyncio.Event | None = None
    owner: Owner | None = None  # raise OwnedElsewhere for it
    asked: list[tuple[PageKey, TurnFacts | None]] = field(default_factory=list)
    entered: list[PageKey] = field(default_factory=list)

    @asynccontextmanager
    async def turn(self, key: PageKey, facts: TurnFacts | None) -> AsyncIterator[Any]:
        self.asked.append((key, facts))
        if self.free is not None:
            await self.free.wait()
        if self.owner is not None:
            raise OwnedElsewhere(self.owner)
        self.entered.append(key)
        yield SimpleNamespace(key=key)


def test_the_mind_is_named_by_the_header_or_the_body_in_the_callers_namespace() -> None:
    """Defect caught: the early key differing from the one the body's full parse gives (the
    turn held under one mind, run under another), or another tenant's mind reachable."""

    async def main() -> None:
        body = json.dumps({"mind": "alice", "messages": []}).encode()
        assert await named_mind(request(body), body) == mind_key(NS, "alice")
        assert await named_mind(request(b"{}", {"X-Mind-Id": "bob"}), b"{}") == mind_key(NS, "bob")
        assert await named_mind(request(b'{"n": 1}'), b'{"n": 1}') is None
        with pytest.raises(KvswapError) as err:
            await named_mind(request(body, {"X-Mind-Id": "bob"}), body)
        assert err.value.kind is ErrorKind.INVALID_REQUEST

    asyncio.run(main())


@pytest.mark.parametrize(
    "raw", [b'{"mind": 3}', b"not json", b'["mind"]', b'{"mind": "x", "mind":'], ids=str
)
def test_a_body_whose_mind_cannot_be_read_holds_nothing(raw: bytes) -> None:
    """Decision: a body the parse refuses holds no mind (no lock, no claim, no placement in a
    cluster); its preparation answers the same typed 400 it always did."""
    minds = Minds()

    async def main() -> None:
        state = SimpleNamespace(minds=minds, client=None)
        async with turn(state, request(raw, {"X-Mind-Id": "alice"}), raw) as runner:  # type: ignore[arg-type]
            assert runner.mind is None

    asyncio.run(main())
    assert minds.asked == []


def test_a_turn_for_another_replica_is_sent_there_before_the_body_is_prepared() -> None:
    """Defect caught: a turn bound for another replica rendered, tokenized and grammar-checked
    here first (the owner does it again): the forward is raised as the mind is held, before
    the route's body runs; the turn's facts come from the forwarder's scope entry."""
    owner = Owner(mind_key(NS, "alice"), "b", "http://b:8080", "tok-b2")
    minds = Minds(owner=owner)
    prepared: list[str] = []
    body = b'{"mind": "alice"}'

    async def main() -> None:
        state = SimpleNamespace(minds=minds, client=None)
        http = request(body, {"X-Request-Id": "req-1"}, forwarded=True)
        async with turn(state, http, body):  # type: ignore[arg-type]
            prepared.append("prepared")

    with pytest.raises(OwnedElsewhere):
        asyncio.run(main())
    assert prepared == []
    assert minds.asked == [
        (mind_key(NS, "alice"), TurnFacts("req-1", failed_owners=frozenset({"tok-b"})))
    ]


def test_a_client_gone_while_its_turn_waits_for_the_mind_is_cancelled_there() -> None:
    """Defect caught: a request whose client left while another turn of its mind ran still
    taking the mind afterwards (a turn nobody reads, holding up the turns behind it)."""
    minds = Minds(free=asyncio.Event())  # the mind stays busy
    body = b'{"mind": "alice"}'

    async def main() -> None:
        state = SimpleNamespace(minds=minds, client=None)
        async with turn(state, request(body, leaves=True), body):  # type: ignore[arg-type]
            pytest.fail("a gone client's turn ran")

    with pytest.raises(ClientGone):
        asyncio.run(main())
    assert minds.entered == []
