"""What the HTTP request of a mind's turn says about it (`minds.placement.TurnFacts`).

- `hop`: the replica that forwarded this turn here (`X-Kvswap-Hop`); a forwarded turn is never
  forwarded again;
- `failed_owners`: the lease tokens of the owners a forward of this very request could not
  reach (the forwarder puts them in the scope, `asgi.failed_owners`; their leases are waited
  out);
- `turn_id`: the client's `X-Request-Id`, else a digest of the request (path and body), so a
  retried turn is applied to the mind's token log once.

No facts (None) for a request no forwarder passed (not a replica of a cluster, or an instance
of /predict): such a turn is never forwarded. Pure.
"""

from __future__ import annotations

import hashlib
from typing import Final

from kvswap.minds.placement import TurnFacts
from kvswap.server.asgi import Scope, failed_owners

HOP_HEADER: Final = "x-kvswap-hop"
REQUEST_ID_HEADER: Final = "x-request-id"
_TURN_ID_MAX: Final = 128


def scope_headers(scope: Scope) -> dict[str, str]:
    """A request's headers by lower-case name, as Latin-1 text (the last of a repeated one)."""
    return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}


def turn_facts(scope: Scope, body: bytes) -> TurnFacts | None:
    """The facts of the turn a request (its `scope` and whole `body`) asks for."""
    failed = failed_owners(scope)
    if failed is None:
        return None
    headers = scope_headers(scope)
    given = headers.get(REQUEST_ID_HEADER, "")
    if given:
        turn_id = given[:_TURN_ID_MAX]
    else:
        digest = hashlib.sha256(scope["path"].encode())
        digest.update(body)
        turn_id = "sha256:" + digest.hexdigest()[:32]
    return TurnFacts(turn_id, hop=headers.get(HOP_HEADER, ""), failed_owners=failed)
