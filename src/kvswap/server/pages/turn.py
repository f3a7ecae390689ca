"""What the HTTP request of a turn says about it, for the cluster's request path.

The forwarder (`pages.forward`) sets one `TurnContext` per request it passes to the app (a
context variable: the route, its runner and the mind's session run in that request's task and
the tasks it starts, so nothing is threaded through every route):
- `hop`: the replica that forwarded this turn here (`X-Kvswap-Hop`); a forwarded turn is never
  forwarded again;
- `failed_owners`: the lease tokens of owners a forward of this very request could not reach
  (the request is then run here: such an owner's lease is waited out);
- `turn_id`: the client's `X-Request-Id`, else a hash of the request (path and body), so a
  retried turn is applied to the mind's token log once.

A mind's session raises `ForwardTurn(Owner)` when the turn belongs to another replica; the
forwarder sends it there. Pure data; `current()` is None for a request that did not come
through the forwarder.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Final

from kvswap.core.keys import PageKey, PageKind

HOP_HEADER: Final = "x-kvswap-hop"
REQUEST_ID_HEADER: Final = "x-request-id"
_TURN_ID_MAX = 128


@dataclass
class TurnContext:
    path: str
    headers: dict[str, str]  # lower-case names
    body: list[bytes] = field(default_factory=list)  # the body's chunks as the app read them
    failed_owners: frozenset[str] = frozenset()

    @property
    def hop(self) -> str:
        return self.headers.get(HOP_HEADER, "")

    @property
    def turn_id(self) -> str:
        given = self.headers.get(REQUEST_ID_HEADER, "")
        if given:
            return given[:_TURN_ID_MAX]
        digest = hashlib.sha256(self.path.encode())
        for chunk in self.body:
            digest.update(chunk)
        return "sha256:" + digest.hexdigest()[:32]


_CURRENT: ContextVar[TurnContext | None] = ContextVar("kvswap_turn", default=None)


def current() -> TurnContext | None:
    return _CURRENT.get()


@contextmanager
def entered(turn: TurnContext) -> Iterator[TurnContext]:
    """The request's turn while the app handles it (its response included)."""
    token = _CURRENT.set(turn)
    try:
        yield turn
    finally:
        _CURRENT.reset(token)


@dataclass(frozen=True)
class Owner:
    """The replica a turn is forwarded to: its lease as read when the turn arrived."""

    key: PageKey  # the mind
    replica_id: str
    url: str
    token: str  # its lease token: a change means it lost the lease

    def encode(self) -> str:
        """As the marker header's value (JSON, ASCII: a name's other characters escaped)."""
        key = self.key
        return json.dumps([key.namespace, key.name, self.replica_id, self.url, self.token])

    @classmethod
    def decode(cls, text: bytes) -> Owner:
        namespace, name, replica_id, url, token = json.loads(text)
        key = PageKey(PageKind.MIND, str(namespace), str(name))
        return cls(key, str(replica_id), str(url), str(token))


class ForwardTurn(Exception):
    """Raised by a mind's session: the mind's live owner is another replica."""

    def __init__(self, owner: Owner) -> None:
        super().__init__(f"mind owned by {owner.replica_id} ({owner.url})")
        self.owner = owner
