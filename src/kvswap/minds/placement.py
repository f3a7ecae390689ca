"""Whose turn it is, in a cluster: serve it here, forward it to the mind's owner, wait a dead
owner's lease out and take the mind over, or refuse it.

`decide` is the rule, pure, over what one look at the mind's lease found (`Placement.holder`:
None when the lease is ours), the holder seen at the previous look, the turn's facts (`hop`,
`failed_owners`) and whether the holder is this replica (`SharedTier.is_me`):
- the lease is ours (renewed, or free and taken now): SERVE (a mind just taken is resumed);
- another replica holds it and may be alive, and the turn came through the forwarder (`facts`
  not None): FORWARD, at most once per turn;
- the holder cannot be what serves the turn: the forward to it failed (`failed_owners`), the
  turn was forwarded here already (`hop`: never forwarded again), or it is a past life of this
  replica (a restart inherits no lease): WAIT until it expires or is released, then take over;
  a turn with no forwarder in front (`facts` None) waits too;
- a forwarded turn whose holder renewed its lease between two looks is alive elsewhere:
  REFUSE (a 503 at once, never a second forward);
- past `bound_s` of waiting: GIVE_UP (a 503 with Retry-After).

`place` is the wait-out loop around it, against a `LeaseSide` (the shared tier's asyncio
face, `shared.SharedMinds`): it looks at the lease about every `POLL_S` until the rule says
otherwise. Raises `OwnedElsewhere` (the server forwards the turn) and `MindUnavailable`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Final, Protocol

from kvswap.core.errors import MindUnavailable
from kvswap.core.keys import PageKey
from kvswap.tiers.shared.replica import Holder, Placement

POLL_S: Final = 0.05  # how often a lease being waited out is looked at


@dataclass(frozen=True)
class TurnFacts:
    """What a turn's request says about it beyond its body (the HTTP layer reads them)."""

    turn_id: str  # the client's request id, else a digest of the request: a retry applies once
    hop: str = ""  # the replica that forwarded this turn here ("": none)
    failed_owners: frozenset[str] = frozenset()  # lease tokens a forward of this turn missed


@dataclass(frozen=True)
class Owner:
    """The replica a turn is forwarded to: its lease as read when the turn arrived."""

    key: PageKey  # the mind
    replica_id: str
    url: str
    token: str  # its lease token: a change means it lost the lease

    @classmethod
    def of(cls, key: PageKey, holder: Holder) -> Owner:
        return cls(key, holder.replica_id, holder.url, holder.token)


class OwnedElsewhere(Exception):
    """The mind's live owner is another replica: the turn goes there (raised before the turn's
    body is prepared)."""

    def __init__(self, owner: Owner) -> None:
        super().__init__(f"mind owned by {owner.replica_id} ({owner.url})")
        self.owner = owner


class Verdict(StrEnum):
    SERVE = "serve"
    FORWARD = "forward"
    WAIT = "wait"
    REFUSE = "refuse"
    GIVE_UP = "give_up"


def decide(
    holder: Holder | None,
    last: Holder | None,
    facts: TurnFacts | None,
    *,
    mine: bool,
    waited_s: float,
    bound_s: float,
) -> Verdict:
    """The rule of the module docstring. `holder`: who holds the lease now (None: ours);
    `last`: the holder the previous look found; `mine`: `holder` is this replica."""
    if holder is None:
        return Verdict.SERVE
    hop = facts is not None and bool(facts.hop)
    failed = facts is not None and holder.token in facts.failed_owners
    if facts is not None and not (mine or failed or hop):
        return Verdict.FORWARD
    renewed = (
        last is not None and last.token == holder.token and holder.ttl_left_ms > last.ttl_left_ms
    )
    if hop and renewed:
        return Verdict.REFUSE
    if waited_s > bound_s:
        return Verdict.GIVE_UP
    return Verdict.WAIT


def wait_bound_s(lease_s: float) -> float:
    """How long a turn waits out a lease at most: a period, and some for Redis's own expiry."""
    return lease_s * 1.2 + 0.5


class LeaseSide(Protocol):
    """What the wait-out loop asks of the shared tier."""

    @property
    def lease_s(self) -> float: ...

    async def take(self, key: PageKey) -> Placement: ...

    def is_me(self, holder: Holder) -> bool: ...

    def count(self, **deltas: float) -> None: ...


async def place(
    side: LeaseSide,
    key: PageKey,
    facts: TurnFacts | None,
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> tuple[Placement, float]:
    """The mind's lease for this turn, once it is ours, and the seconds spent waiting a lease
    out (0.0 when none was). Raises OwnedElsewhere or MindUnavailable (counted)."""
    t0 = clock()
    bound_s = wait_bound_s(side.lease_s)
    last: Holder | None = None
    while True:
        got = await side.take(key)
        holder = got.holder
        waited_s = clock() - t0
        mine = holder is not None and side.is_me(holder)
        verdict = decide(holder, last, facts, mine=mine, waited_s=waited_s, bound_s=bound_s)
        if verdict is Verdict.SERVE:
            return got, waited_s if last is not None else 0.0
        assert holder is not None
        if verdict is Verdict.FORWARD:
            raise OwnedElsewhere(Owner.of(key, holder))
        if verdict is Verdict.REFUSE:
            side.count(n_unavailable=1)
            raise MindUnavailable(
                f"the mind is owned by {holder.replica_id}, alive; this turn was forwarded here "
                f"by {facts.hop if facts else '?'}, and a forwarded turn is not forwarded again",
                retry_after_s=1.0,
            )
        if verdict is Verdict.GIVE_UP:
            side.count(n_unavailable=1)
            raise MindUnavailable(
                f"the mind's owner {holder.replica_id} ({holder.url}) cannot be reached "
                f"and still holds its lease after {bound_s:.1f} s",
                retry_after_s=max(1.0, holder.ttl_left_ms / 1000),
            )
        last = holder
        await sleep(min(POLL_S, max(0.005, holder.ttl_left_ms / 1000)))
