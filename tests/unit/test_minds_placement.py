"""Whose turn it is in a cluster, on the CPU: the placement rule over every branch, and its lease
wait-out loop against a fake lease side and a clock the test moves (no Redis, no sleep).

Each case names the defect it would catch: a turn forwarded twice (a ping-pong between two
replicas that each believe the other owns the mind), a turn sent to a dead owner again, a
replica forwarding to its own past life, a live owner's turn served by a second replica, a
wait that never ends.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import pytest

from kvswap.core.errors import MindUnavailable
from kvswap.core.keys import PageKey, mind_key, namespace_of
from kvswap.minds.placement import (
    POLL_S,
    OwnedElsewhere,
    Owner,
    TurnFacts,
    Verdict,
    decide,
    place,
    wait_bound_s,
)
from kvswap.tiers.shared.replica import Holder, Placement

KEY = mind_key(namespace_of("k"), "alice")
B = Holder("b", "http://b:8080", "tok-b", ttl_left_ms=4000)
B_RENEWED = Holder("b", "http://b:8080", "tok-b", ttl_left_ms=4900)
B_OLDER = Holder("b", "http://b:8080", "tok-b", ttl_left_ms=3000)
B_NEW_LIFE = Holder("b", "http://b:8080", "tok-b2", ttl_left_ms=4950)
DIRECT = TurnFacts("t1")  # came through the forwarder, not forwarded
HOPPED = TurnFacts("t1", hop="c")  # forwarded here by replica c
B_FAILED = TurnFacts("t1", failed_owners=frozenset({"tok-b"}))  # a forward to b gave nothing

# (case, holder now, holder at the previous look, facts, holder is this replica, waited s,
#  verdict): every branch of the rule.
CASES = [
    ("ours", None, None, DIRECT, False, 0.0, Verdict.SERVE),
    ("ours after a wait", None, B, HOPPED, False, 3.0, Verdict.SERVE),
    ("a live owner elsewhere", B, None, DIRECT, False, 0.0, Verdict.FORWARD),
    ("forwarded once only: a hop waits", B, None, HOPPED, False, 0.0, Verdict.WAIT),
    ("the hop's owner renewed: alive", B_RENEWED, B, HOPPED, False, 0.1, Verdict.REFUSE),
    ("the hop's owner did not renew", B_OLDER, B, HOPPED, False, 1.0, Verdict.WAIT),
    ("a new life of the owner is not a renewal", B_NEW_LIFE, B, HOPPED, False, 1.0, Verdict.WAIT),
    ("a failed owner is waited out", B, None, B_FAILED, False, 0.0, Verdict.WAIT),
    ("a failed owner renewing is not refused", B_RENEWED, B, B_FAILED, False, 1.0, Verdict.WAIT),
    ("a failed owner's new life is forwarded to", B_NEW_LIFE, B, B_FAILED, False, 1.0,
     Verdict.FORWARD),
    ("this replica's past life is waited out", B, None, DIRECT, True, 0.0, Verdict.WAIT),
    ("no forwarder in front: never forwarded", B, None, None, False, 0.0, Verdict.WAIT),
    ("no forwarder, owner renewing: still waits", B_RENEWED, B, None, False, 1.0, Verdict.WAIT),
    ("past the bound", B_OLDER, B, HOPPED, False, 9.0, Verdict.GIVE_UP),
    ("a forward beats the bound", B, None, DIRECT, False, 9.0, Verdict.FORWARD),
    ("a refusal beats the bound", B_RENEWED, B, HOPPED, False, 9.0, Verdict.REFUSE),
]  # fmt: skip


@pytest.mark.parametrize(
    ("holder", "last", "facts", "mine", "waited_s", "verdict"),
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_the_placement_rule(
    holder: Holder | None,
    last: Holder | None,
    facts: TurnFacts | None,
    mine: bool,
    waited_s: float,
    verdict: Verdict,
) -> None:
    """The rule's table: a hop is never forwarded again (no ping-pong), a failed owner or a
    past life of this replica is waited out rather than forwarded to, a live owner refuses a
    forwarded turn at once, and the wait ends at its bound."""
    got = decide(holder, last, facts, mine=mine, waited_s=waited_s, bound_s=wait_bound_s(5.0))
    assert got is verdict


@dataclass
class FakeSide:
    """A lease side whose `take` answers from a script, one look at a time; its sleeps move
    the test's clock instead of waiting."""

    looks: list[Holder | None]
    lease_s: float = 5.0
    me_url: str = "http://a:8080"
    now: float = 100.0
    slept: list[float] = field(default_factory=list)
    counts: list[dict[str, float]] = field(default_factory=list)

    async def take(self, key: PageKey) -> Placement:
        holder = self.looks.pop(0) if len(self.looks) > 1 else self.looks[0]
        return Placement(key, holder=holder)

    def is_me(self, holder: Holder) -> bool:
        return holder.url == self.me_url

    def count(self, **deltas: float) -> None:
        self.counts.append(deltas)

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def _place(side: FakeSide, facts: TurnFacts | None) -> tuple[Placement, float]:
    return asyncio.run(place(side, KEY, facts, clock=side.clock, sleep=side.sleep))


def test_a_mind_that_is_ours_is_served_with_no_wait() -> None:
    """Decision: a lease found ours costs one look and no sleep, and counts no lease wait."""
    side = FakeSide([None])
    got, waited_s = _place(side, DIRECT)
    assert got.ours and got.key == KEY
    assert (waited_s, side.slept, side.counts) == (0.0, [], [])


def test_a_live_owner_gets_the_turn_before_anything_is_waited() -> None:
    """Defect caught: a turn for a live owner waited here (or was served here twice)."""
    side = FakeSide([B])
    with pytest.raises(OwnedElsewhere) as err:
        _place(side, DIRECT)
    assert err.value.owner == Owner(KEY, "b", "http://b:8080", "tok-b")
    assert side.slept == []


def test_a_dead_owners_lease_is_waited_out_then_the_mind_taken() -> None:
    """A forward to b failed: its lease is looked at until it expires (polling at most every
    POLL_S, never longer than the lease has left), then the mind is ours; the wait is what
    the turn's takeover reports."""
    ticking = Holder("b", "http://b:8080", "tok-b", ttl_left_ms=20)  # 20 ms left
    side = FakeSide([B_OLDER, B_OLDER, ticking, None])
    got, waited_s = _place(side, B_FAILED)
    assert got.ours
    assert side.slept == [POLL_S, POLL_S, 0.02]
    assert waited_s == pytest.approx(sum(side.slept))
    assert side.counts == []


def test_a_forwarded_turn_whose_owner_renews_is_refused_at_once() -> None:
    """Defect caught: a forwarded turn forwarded back (a ping-pong), or waited on for a whole
    lease while its owner is alive: the second look sees the lease renewed, a 503 follows."""
    side = FakeSide([B, B_RENEWED])
    with pytest.raises(MindUnavailable) as err:
        _place(side, HOPPED)
    assert "forwarded here by c" in str(err.value) and err.value.retry_after_s == 1.0
    assert len(side.slept) == 1
    assert side.counts == [{"n_unavailable": 1}]


def test_a_lease_that_never_ends_gives_up_past_the_bound() -> None:
    """Defect caught: a turn waiting forever on an owner whose lease Redis keeps (its clock
    frozen): past about a lease period, a 503 naming the owner, Retry-After its lease's rest."""
    stuck = Holder("b", "http://b:8080", "tok-b", ttl_left_ms=3500)
    side = FakeSide([stuck], lease_s=1.0)
    with pytest.raises(MindUnavailable) as err:
        _place(side, None)
    assert "b (http://b:8080)" in str(err.value)
    assert err.value.retry_after_s == 3.5
    assert side.now - 100.0 > wait_bound_s(1.0)
    assert side.now - 100.0 <= wait_bound_s(1.0) + POLL_S + 1e-9  # not one poll later
    assert side.counts == [{"n_unavailable": 1}]


def test_a_restart_never_forwards_to_its_own_past_life() -> None:
    """Defect caught: a replica restarted at the same address forwarding a turn to itself
    (the lease of its previous life): that lease is waited out instead."""
    past = Holder("a", "http://a:8080", "tok-old", ttl_left_ms=10)
    side = FakeSide([past, None])
    got, waited_s = _place(side, DIRECT)
    assert got.ours and waited_s == pytest.approx(0.01)
