"""The shared tier's writer on the CPU (`tiers.shared.writer.MindWriter`): a turn's end, the
page behind it, hand-off, drain and a mind's end, against stand-ins for the leases, the store,
the token log and the local copies (no Redis), with the real `TierHealth` and `MindRegistry`.

Each test names the defect it would catch: tokens appended twice or lost, a page published by
a replica that lost the mind, a turn's answer held up by an unreachable Redis, a copy's buffer
never released, a hand-off that drops a mind it could not publish.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

from kvswap.core.keys import PageKey, mind_key, namespace_of
from kvswap.core.vocab import MindTier
from kvswap.engine.seats.registry import MindRegistry
from kvswap.tiers.shared.errors import StaleOwner, TierUnavailable, TokenLogGap
from kvswap.tiers.shared.health import TierHealth
from kvswap.tiers.shared.holdings import Held
from kvswap.tiers.shared.keys import MindKeys
from kvswap.tiers.shared.lease import Incarnation, Lease
from kvswap.tiers.shared.local import PageCopy
from kvswap.tiers.shared.writer import MindWriter, Outcome

KEY = mind_key(namespace_of("k"), "alice")
ME = Incarnation("a", "http://a:8080", "tok-a")
LOST = "this replica lost the mind to another one during the turn"


def tokens(*values: int) -> np.ndarray:
    return np.array(values, dtype=np.int32)


def held(key: PageKey = KEY, **fields: Any) -> Held:
    lease = Lease(MindKeys.of(key), ME, fence=3, ttl_ms=5000)
    return Held(key, lease, fields.pop("tokens", tokens()), **fields)


@dataclass
class Holdings:
    """The leases held here: `renews` says whether a refused lease is taken again."""

    minds: dict[PageKey, Held] = field(default_factory=dict)
    renews: bool = False
    release_fails: bool = False
    released: list[PageKey] = field(default_factory=list)

    def get(self, key: PageKey) -> Held | None:
        return self.minds.get(key)

    def all(self) -> list[Held]:
        return list(self.minds.values())

    def update(self, record: Held, **changes: object) -> None:
        for name, value in changes.items():
            setattr(record, name, value)

    def renew(self, record: Held) -> bool:
        return self.renews

    def drop(self, record: Held, **_: object) -> None:
        self.minds.pop(record.key, None)

    def release(self, record: Held, *, keep: bool = False) -> bool:
        if self.release_fails:
            raise TierUnavailable("lease release: connection refused")
        self.released.append(record.key)
        self.minds.pop(record.key, None)
        return True

    def release_many(self, records: list[Held]) -> int:
        for record in records:
            self.release(record)
        return len(records)


@dataclass
class Receipt:
    gen: int
    n_bytes_written: int = 10
    n_bytes_page: int = 10


@dataclass
class Store:
    """Publications: each one's bytes and flags; `fail` scripts the next writes' errors."""

    fail: list[Exception] = field(default_factory=list)
    published: list[dict[str, Any]] = field(default_factory=list)
    dropped: list[Lease] = field(default_factory=list)

    def publish(
        self, lease: Lease, key: PageKey, view: memoryview, layout: Any, *, whole: bool
    ) -> Receipt:
        if self.fail:
            raise self.fail.pop(0)
        self.published.append({"bytes": bytes(view), "n_tokens": layout.n_tokens, "whole": whole})
        return Receipt(gen=len(self.published) + 6)

    def drop(self, lease: Lease) -> None:
        if self.fail:
            raise self.fail.pop(0)
        self.dropped.append(lease)


@dataclass
class TokenLog:
    fail: list[Exception] = field(default_factory=list)
    appends: list[tuple[str, int, list[int]]] = field(default_factory=list)
    chats: list[bytes] = field(default_factory=list)  # each append's chat record

    def append(
        self, lease: Lease, turn_id: str, n_base: int, new: np.ndarray, chat: bytes = b""
    ) -> None:
        if self.fail:
            raise self.fail.pop(0)
        self.appends.append((turn_id, n_base, [int(t) for t in new]))
        self.chats.append(chat)


@dataclass
class Layout:
    n_tokens: int


@dataclass
class Local:
    """The mind's copies here: `copy` gives the state as a page (None: its slot is busy)."""

    state: bytes | None = b"page"
    n_tokens: int = 0
    released: list[bytes] = field(default_factory=list)
    forgotten: list[PageKey] = field(default_factory=list)

    def copy(self, key: PageKey) -> PageCopy | None:
        if self.state is None:
            return None
        state = self.state
        release: Callable[[], None] = lambda: self.released.append(state)  # noqa: E731
        return PageCopy(memoryview(state), Layout(self.n_tokens), MindTier.SLOT, release)  # type: ignore[arg-type]

    def forget(self, key: PageKey) -> bool:
        self.forgotten.append(key)
        return True

    def has(self, key: PageKey) -> bool:
        return self.state is not None or self.n_tokens > 0


@dataclass
class Parts:
    holdings: Holdings = field(default_factory=Holdings)
    store: Store = field(default_factory=Store)
    log: TokenLog = field(default_factory=TokenLog)
    local: Local = field(default_factory=Local)
    health: TierHealth = field(default_factory=TierHealth)

    registry: MindRegistry = field(default_factory=MindRegistry)

    def writer(self, rpo_tokens: int = 0, release_s: float = 60.0) -> MindWriter:
        return MindWriter(
            holdings=self.holdings,  # type: ignore[arg-type]
            store=self.store,  # type: ignore[arg-type]
            token_log=self.log,  # type: ignore[arg-type]
            local=self.local,  # type: ignore[arg-type]
            registry=self.registry,
            health=self.health,
            rpo_tokens=rpo_tokens,
            rpo_s=5.0,
            quiet_s=2.0,
            release_s=release_s,
            drain_s=60.0,
        )

    def hold(self, **fields: Any) -> Held:
        record = held(**fields)
        self.holdings.minds[record.key] = record
        return record


def test_a_turns_end_appends_only_its_new_tokens_and_publishes_past_the_rpo() -> None:
    """Defect caught: the whole conversation appended again each turn (the log doubles), or
    a turn answered before the page that bounds what a death re-prefills is in the tier."""
    p = Parts()
    record = p.hold(tokens=tokens(1, 2, 3), seq=4, published_seq=4)
    p.local.n_tokens = 5
    assert p.writer(rpo_tokens=0).end_turn(KEY, "t5", tokens(1, 2, 3, 4, 5)) is None
    assert p.log.appends == [("t5", 3, [4, 5])]
    assert [pub["n_tokens"] for pub in p.store.published] == [5]
    assert p.local.released == [b"page"]  # the copy's buffer let go
    assert (record.seq, record.published_seq, record.n_published, record.dirty_since) == (
        5,
        5,
        5,
        None,
    )
    assert (record.turn_id_logged, record.published_gen) == ("t5", 7)


def test_a_turn_under_the_rpo_bound_is_logged_and_left_dirty() -> None:
    """Decision: a turn leaving no more than `rpo_tokens` unpublished answers after its log
    append alone; the page waits for the publication thread."""
    p = Parts()
    record = p.hold(tokens=tokens(1, 2), n_published=2)
    writer = p.writer(rpo_tokens=100)
    assert writer.end_turn(KEY, "t2", tokens(1, 2, 3, 4)) is None
    assert p.log.appends == [("t2", 2, [3, 4])] and p.store.published == []
    assert record.dirty_since is not None and record.n_unpublished == 2
    assert writer.counters()["n_turns"] == 1


def test_a_token_log_that_lost_tokens_is_rewritten_whole() -> None:
    """Defect caught: an append refused for a gap (Redis lost data) leaving the log short for
    good: the turn's tokens are written from the start instead."""
    p = Parts(log=TokenLog(fail=[TokenLogGap(3, 1)]))
    p.hold(tokens=tokens(1, 2, 3))
    assert p.writer(rpo_tokens=100).end_turn(KEY, "t4", tokens(1, 2, 3, 4)) is None
    assert p.log.appends == [("t4", 0, [1, 2, 3, 4])]


def test_a_mind_lost_during_its_turn_fails_the_turn_and_is_dropped() -> None:
    """Defect caught: a replica whose lease another took publishing or answering as the owner
    (two owners of one mind): the fenced append is refused, the turn fails, the record goes."""
    p = Parts(log=TokenLog(fail=[StaleOwner("fence moved")]))
    p.hold(tokens=tokens(1))
    writer = p.writer()
    assert writer.end_turn(KEY, "t2", tokens(1, 2)) == LOST
    assert p.holdings.get(KEY) is None and p.store.published == []
    assert writer.counters()["n_lost"] == 1
    assert writer.end_turn(KEY, "t3", tokens(1, 2, 3)) == LOST  # and it stays lost


def test_a_lease_that_only_expired_is_taken_again_and_the_write_made_once_more() -> None:
    """Decision: a refusal because the lease expired while Redis was away (nobody else took
    the mind) is not a loss: the lease is taken again and the write repeated, once."""
    p = Parts(log=TokenLog(fail=[StaleOwner("expired")]))
    p.holdings.renews = True
    p.hold(tokens=tokens(1))
    assert p.writer(rpo_tokens=100).end_turn(KEY, "t2", tokens(1, 2)) is None
    assert p.log.appends == [("t2", 1, [2])]


def test_redis_away_never_holds_a_turns_answer_and_the_log_catches_up_whole() -> None:
    """Defect caught: every turn waiting on an unreachable Redis, or the turns of the outage
    missing from the log afterwards: the mind is marked behind, and its next publication
    appends the whole log first, with the last turn's chat record."""
    p = Parts()
    p.health.failed("lease renewal", RuntimeError("down"))
    record = p.hold(tokens=tokens(1))
    writer = p.writer()
    assert writer.end_turn(KEY, "t2", tokens(1, 2, 3), b"t2's chat record") is None
    assert p.log.appends == [] and p.store.published == []
    assert record.log_behind and record.dirty_since is not None
    p.health.ok()
    p.local.n_tokens = 3
    assert writer.publish(record) is Outcome.DONE
    assert p.log.appends == [("t2", 0, [1, 2, 3])]
    assert p.log.chats == [b"t2's chat record"]  # the next owner continues its answer too
    assert not record.log_behind and len(p.store.published) == 1


def test_a_failed_publication_keeps_the_mind_dirty_and_releases_the_copy() -> None:
    """Defect caught: a copy's buffer held forever after Redis refused the write, or the mind
    marked clean (its state never published): it is retried later."""
    p = Parts(store=Store(fail=[TierUnavailable("publish: timeout")]))
    record = p.hold(tokens=tokens(1, 2), seq=1, dirty_since=1.0)
    writer = p.writer()
    assert writer.publish(record) is Outcome.FAILED
    assert p.local.released == [b"page"]
    assert record.dirty_since == 1.0 and record.retry_at > 0
    assert writer.counters()["n_publish_failed"] == 1 and not p.health.reachable


def test_a_busy_slot_or_a_clean_mind_publishes_nothing() -> None:
    """Decision: a mind whose slot a turn holds is left to that turn's end (NOT_NOW, retried
    a second later: audit A2 found it asked of the engine every pass, forever); a mind with
    nothing unpublished takes no copy at all (CLEAN)."""
    p = Parts(local=Local(state=None, n_tokens=1))
    busy = p.hold(tokens=tokens(1), seq=1, dirty_since=1.0)
    assert p.writer().publish(busy) is Outcome.NOT_NOW
    assert busy.retry_at > 0 and busy.dirty_since == 1.0
    clean = held(mind_key(namespace_of("k"), "bob"), seq=2, published_seq=2)
    p.local.state = b"never copied"
    assert p.writer().publish(clean) is Outcome.CLEAN
    assert p.local.released == [] and p.store.published == []


def test_the_page_after_a_bad_chunk_is_written_whole() -> None:
    """Defect caught: a delta publication reusing chunks of a generation found corrupt."""
    p = Parts()
    record = p.hold(tokens=tokens(1), seq=1, publish_whole=True)
    assert p.writer().publish(record) is Outcome.DONE
    assert p.store.published[0]["whole"] is True and not record.publish_whole


def test_a_hand_off_publishes_releases_and_forgets_or_keeps_the_mind() -> None:
    """Defect caught: a hand-off that drops a mind it could not publish (its state lost), or
    keeps serving one it released."""
    p = Parts(store=Store(fail=[TierUnavailable("publish: down")]))
    p.hold(tokens=tokens(1), seq=1)
    writer = p.writer()
    assert writer.hand_off(KEY) is False
    assert p.holdings.released == [] and p.local.forgotten == []
    assert writer.hand_off(KEY) is True
    assert p.holdings.released == [KEY] and p.local.forgotten == [KEY]
    assert writer.counters()["n_handoffs"] == 1
    assert writer.hand_off(KEY) is False  # not held any more


def test_drain_publishes_every_dirty_mind_and_releases_every_lease() -> None:
    """Defect caught: a replica leaving (SIGTERM) with unpublished turns, or with leases that
    make the next owner wait a whole lease period."""
    p = Parts()
    for name in ("alice", "bob"):
        p.hold(key=mind_key(namespace_of("k"), name), tokens=tokens(1), seq=1)
    writer = p.writer()
    writer.drain()
    assert len(p.store.published) == 2 and len(p.holdings.released) == 2
    assert writer.counters()["n_drained"] == 2


def test_an_ended_mind_leaves_the_tier_or_stays_when_redis_is_away() -> None:
    """Defect caught: an erased mind resumed elsewhere from the tier's old page, or an erase
    that reports success while the tier still holds the mind."""
    p = Parts(store=Store(fail=[TierUnavailable("drop: down")]))
    p.hold(tokens=tokens(1))
    writer = p.writer()
    with pytest.raises(TierUnavailable):
        writer.end_mind(KEY)
    assert p.holdings.get(KEY) is not None
    writer.end_mind(KEY)
    assert len(p.store.dropped) == 1 and p.holdings.released == [KEY]


def test_a_dirty_mind_with_no_copy_left_here_stops_being_asked_for_one() -> None:
    """Audit A2: a held, dirty mind whose RAM page and files were dropped made the publication
    thread ask the engine for a copy every 0.2 s, forever: what the tier holds is all there
    is, so it is no longer dirty (and its lease can go)."""
    p = Parts(local=Local(state=None, n_tokens=0))
    record = p.hold(tokens=tokens(1, 2), seq=3, dirty_since=1.0)
    writer = p.writer()
    assert writer.publish(record) is Outcome.NOT_NOW
    assert record.dirty_since is None and writer.publish(record) is Outcome.CLEAN


def test_a_mind_idle_past_the_quiet_period_is_due_and_one_idle_past_release_is_let_go() -> None:
    """Decisions: a mind resting in its slot is published once idle `quiet_s` (a SIGKILL then
    loses only minds that were mid-turn), never while a turn holds it; a clean mind idle
    `release_s` has its lease released (audit A2: every mind ever served stayed held and
    renewed), a dirty one never."""
    p = Parts()
    record = p.hold(tokens=tokens(1, 2), seq=1, dirty_since=time.monotonic())
    writer = p.writer(release_s=30.0)
    p.registry.seated(KEY, 0)  # resting in slot 0
    p.registry.set_busy(KEY, True)
    record.last_used = time.monotonic() - 10
    assert not writer._due(record, catch_up=False)  # a turn holds it
    p.registry.set_busy(KEY, False)
    record.last_used = time.monotonic() - 1
    assert not writer._due(record, catch_up=False)  # not quiet yet
    record.last_used = time.monotonic() - 2.5
    assert writer._due(record, catch_up=False)
    record.last_used = time.monotonic() - 31
    assert not writer._idle(record)  # dirty: published first
    record.dirty_since = None
    assert writer._idle(record)
    writer._release_idle(record)
    assert p.holdings.released == [KEY] and writer.counters()["n_released_idle"] == 1


def test_drain_sends_nothing_while_redis_is_away() -> None:
    """Audit A3: a SIGTERM during a Redis outage spent the grace period on timeouts, one per
    mind and operation; now the drain skips the tier (the minds are on disk already)."""
    p = Parts()
    p.hold(tokens=tokens(1), seq=1)
    p.health.failed("lease renewal", RuntimeError("down"))
    writer = p.writer()
    writer.drain()
    assert p.store.published == [] and p.holdings.released == []
