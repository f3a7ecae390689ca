"""The ASGI vocabulary of the shell's middlewares, and what they put in a request's scope.

- The type aliases (`Scope`, `Message`, `Receive`, `Send`, `ASGIApp`) of every plain ASGI
  layer (the guard, CORS, the request log, the forwarder, `internal.call_app`).
- The entries a middleware sets in `scope["state"]` for the routes: the tenant namespace the
  guard authenticated (`tenant_namespace`), and in a cluster the lease tokens of the owners a
  forward of this very request could not reach (`failed_owners`; absent: no forwarder in
  front, so the turn is never forwarded) and the forwarder's `ForwardSlot`, where the app
  names the owner a turn must go to (never a response header: a response can come from
  elsewhere, /cors-proxy's from any server on the internet).
- `until_disconnect(receive)`: the wait for a client's `http.disconnect` (the body read).

Pure; imports nothing of the server.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, Final

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

_NAMESPACE: Final = "kvswap.namespace"  # the guard's: the tenant of the request's key
_FAILED_OWNERS: Final = "kvswap.failed_owners"  # the forwarder's: owners a forward missed
_FORWARD: Final = "kvswap.forward"  # the forwarder's: where the app names a turn's owner


class ForwardSlot:
    """Filled by the app (its `OwnedElsewhere` handler) when a turn must go to its mind's
    owner; read by the forwarder that put it in the request's scope. `owner` is the owner as
    the app found it in the lease (`minds.placement.Owner`); typed loosely, this module
    imports nothing of the minds."""

    def __init__(self) -> None:
        self.owner: object | None = None


def with_state(scope: Scope, **entries: object) -> Scope:
    """A copy of `scope` whose `state` holds `entries` too (the original is not changed)."""
    return {**scope, "state": {**scope.get("state", {}), **entries}}


def with_namespace(scope: Scope, namespace: str) -> Scope:
    return with_state(scope, **{_NAMESPACE: namespace})


def tenant_namespace(scope: Scope) -> str:
    """The tenant namespace the guard gave this request (set for every request it let in)."""
    namespace = scope.get("state", {}).get(_NAMESPACE)
    assert isinstance(namespace, str) and namespace, "a request that did not pass the guard"
    return namespace


def with_failed_owners(scope: Scope, tokens: frozenset[str], slot: ForwardSlot) -> Scope:
    return with_state(scope, **{_FAILED_OWNERS: tokens, _FORWARD: slot})


def forward_slot(scope: Scope) -> ForwardSlot | None:
    """The forwarder's slot for this request (None: no forwarder in front)."""
    slot = scope.get("state", {}).get(_FORWARD)
    return slot if isinstance(slot, ForwardSlot) else None


def failed_owners(scope: Scope) -> frozenset[str] | None:
    """The lease tokens of the owners a forward of this request did not reach; None when no
    forwarder is in front of the app (not a replica of a cluster, or a request made inside)."""
    tokens = scope.get("state", {}).get(_FAILED_OWNERS)
    return tokens if isinstance(tokens, frozenset) else None


async def until_disconnect(receive: Receive) -> None:
    """Returns once the client has disconnected (its body must have been read already: the
    next message is then the disconnect)."""
    while (await receive())["type"] != "http.disconnect":
        pass
