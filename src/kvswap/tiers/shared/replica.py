"""The shared tier as one replica runs it: the one object the server holds (`SharedTier`).

Built from the cluster's slice of the configuration (`ClusterSettings`) and the engine's
handles, it owns the Redis client, this process's incarnation (a random token: a restarted
replica inherits no lease), the page store, the token log, the holdings (leases and their
renewal thread), the writer (the publication thread), the resumer and the counters, and wires
them: a mind lost to another replica is forgotten here; Redis answering again makes every
failed publication due.

Its methods block on Redis or on the engine's answers: the server calls them on worker threads,
never on the event loop. `take` is the ownership step of every turn of a mind: renew the lease
held (Redis away: keep serving what is held, without waiting on Redis each turn), else acquire
it, else say who holds it; it answers with a `Placement`, which `resume` turns into the state
the turn starts from (`Resumed`). The stored conversations' records travel through its log
(`append_record`, `read_records`).

What a caller may hold of the tier is defined here (or re-exported from here): `SharedTier`,
`Placement`, `Holder`, `Resumed`, `TierView`; its errors are `tiers.shared.errors`'. The rest
of the package is its inside.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import numpy.typing as npt

from kvswap.config.settings import ClusterSettings
from kvswap.core.keys import PageKey
from kvswap.core.page import PageGeometry
from kvswap.engine.commands import Command
from kvswap.engine.handle import PagesHandle
from kvswap.engine.seats.registry import MindRegistry
from kvswap.files import Publisher
from kvswap.tiers.shared.connection import SMALL_COMMAND_TIMEOUT_S, connect, redacted
from kvswap.tiers.shared.errors import TierUnavailable, translating
from kvswap.tiers.shared.health import TierHealth
from kvswap.tiers.shared.holdings import Held, Holdings
from kvswap.tiers.shared.lease import Incarnation, LeaseHolder, Leases
from kvswap.tiers.shared.local import LocalMinds
from kvswap.tiers.shared.loops import LoopView
from kvswap.tiers.shared.recordlog import RecordLog
from kvswap.tiers.shared.resume import Resumed, Resumer
from kvswap.tiers.shared.stats import ResumeStats
from kvswap.tiers.shared.store import SharedStore, StoreCounters
from kvswap.tiers.shared.token_log import TokenLog
from kvswap.tiers.shared.writer import MindWriter

log = logging.getLogger("kvswap.shared")
CLUSTER_STATE_ENV = "KVSWAP_CLUSTER_STATE"  # set by `kvswap cluster up` for its replicas

__all__ = [
    "HeldView", "Holder", "LoopView", "Placement", "Resumed", "SharedTier", "TierView", "redacted",
]  # fmt: skip


@dataclass(frozen=True)
class Holder:
    """Another replica's lease on a mind, as a turn finds it."""

    replica_id: str
    url: str  # where that replica is reached (its advertise URL)
    token: str  # its incarnation's lease token: a change means the lease changed hands
    ttl_left_ms: int  # how long the lease lasts unless renewed

    @classmethod
    def of(cls, lease: LeaseHolder) -> Holder:
        return cls(lease.replica_id, lease.advertise_url, lease.token, lease.ttl_left_ms)


@dataclass(frozen=True)
class Placement:
    """Whose a mind is for a turn, as `SharedTier.take` found it: ours (`holder` None; pass it
    to `resume`), or another replica's (`holder`)."""

    key: PageKey
    holder: Holder | None = None
    held: Held | None = field(default=None, repr=False)  # the tier's record, for `resume`

    @property
    def ours(self) -> bool:
        return self.holder is None


@dataclass(frozen=True)
class HeldView:
    """One mind this replica holds, as /pages shows it."""

    key: PageKey
    fence: int
    n_tokens: int
    n_published: int
    n_unpublished: int
    published_gen: int
    dirty: bool


@dataclass(frozen=True)
class TierView:
    """The shared tier as /pages, /props and /metrics show it."""

    replica_id: str
    advertise_url: str
    url: str  # the Redis URL without its password
    lease_ms: int
    rpo_tokens: int
    rpo_s: float
    budget_bytes: int | None
    reachable: bool
    n_unreachable: int
    tier_bytes: int | None  # the budget's count of page bytes in the tier (None: no budget)
    redis_used_bytes: int | None  # Redis's own memory count (None: Redis away)
    store: StoreCounters
    token_log: dict[str, int]
    writer: dict[str, int]
    resumes: dict[str, float]
    held: tuple[HeldView, ...]
    # the cluster's replicas as its `cluster up` supervises them (None: not started by it)
    replicas: tuple[ReplicaState, ...] | None = None


@dataclass(frozen=True)
class ReplicaState:
    """One replica of a `kvswap cluster up`, as its cluster.json says (`KVSWAP_CLUSTER_STATE`)."""

    replica_id: str
    url: str
    state: str  # starting, up, restarting, gave up, stopped
    n_restarts: int


def cluster_replicas(environ: Mapping[str, str]) -> tuple[ReplicaState, ...] | None:
    """The replicas `cluster up` lists in the file `KVSWAP_CLUSTER_STATE` names; None when no
    such file is named or it cannot be read now."""
    path = environ.get(CLUSTER_STATE_ENV)
    if not path:
        return None
    try:
        doc = json.loads(Path(path).read_text())
        return tuple(
            ReplicaState(str(r["id"]), str(r["url"]), str(r["state"]), int(r["n_restarts"]))
            for r in doc["replicas"]
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


class SharedTier:
    """See the module docstring."""

    def __init__(
        self,
        settings: ClusterSettings,
        *,
        post: Callable[[Command], None],
        pages: PagesHandle,
        publisher: Publisher | None,
        geometry: Callable[[], PageGeometry],
        forget_files: Callable[[PageKey], None],
    ) -> None:
        """`forget_files`: the demoter's `forget` (a mind's spilled files removed, under its
        spill lock)."""
        assert settings.shared_tier and settings.replica_id and settings.advertise_url
        self.settings = settings
        self.geometry = geometry
        self.incarnation = Incarnation.new(settings.replica_id, settings.advertise_url)
        self.client = connect(settings.shared_tier, command_timeout_s=SMALL_COMMAND_TIMEOUT_S)
        self.bulk = connect(settings.shared_tier)  # chunks: a longer timeout
        self.health = TierHealth()
        self.store = SharedStore(
            self.client,
            replica_id=settings.replica_id,
            budget_bytes=settings.shared_tier_bytes,
            bulk=self.bulk,
        )
        self.token_log = TokenLog(self.client)
        self.local = LocalMinds(
            post=post,
            pages=pages,
            publisher=publisher,
            geometry=geometry,
            forget_files=forget_files,
        )
        self.holdings = Holdings(
            self.client,
            Leases(self.client, self.incarnation, settings.lease_ms),
            prefix=self.store.prefix,
            health=self.health,
            busy=lambda key: not pages.registry.idle([key]),
            on_lost=self._lost,
        )
        self.writer = self._writer(pages.registry)
        self.resumer = Resumer(
            holdings=self.holdings,
            store=self.store,
            token_log=self.token_log,
            local=self.local,
            health=self.health,
        )
        self.stats = ResumeStats()
        self.records = RecordLog(self.client, self.store.prefix)
        self._closed = False

    def _writer(self, registry: MindRegistry) -> MindWriter:
        s = self.settings
        return MindWriter(
            holdings=self.holdings, store=self.store, token_log=self.token_log,
            local=self.local, registry=registry, health=self.health,
            rpo_tokens=s.rpo_tokens, rpo_s=s.rpo_seconds, quiet_s=s.quiet_seconds,
            release_s=s.release_seconds, drain_s=s.drain_seconds,
        )  # fmt: skip

    @property
    def replica_id(self) -> str:
        return self.incarnation.replica_id

    def start(self) -> None:
        self.holdings.start()
        self.writer.start()
        log.info(
            "shared tier %s: replica %s at %s (lease %d ms, RPO %d tokens / %.0f s)",
            redacted(self.settings.shared_tier or ""),
            self.replica_id,
            self.incarnation.advertise_url,
            self.settings.lease_ms,
            self.settings.rpo_tokens,
            self.settings.rpo_seconds,
        )

    # -- a turn ------------------------------------------------------------------------------

    @property
    def advertise_url(self) -> str:
        return self.incarnation.advertise_url

    @property
    def lease_s(self) -> float:
        """A lease's period: what a holder that stops renewing keeps a mind for, at most."""
        return self.settings.lease_ms / 1000

    def is_me(self, holder: Holder) -> bool:
        """`holder` is this replica: this process, or a past life at the same address (whose
        lease outlived it)."""
        return holder.url == self.incarnation.advertise_url

    def count(self, **deltas: float) -> None:
        """Add to the takeover and forwarding counters (`stats.ResumeCounters` names them)."""
        self.stats.count(**deltas)

    def take(self, key: PageKey) -> Placement:
        """The mind's lease for a turn: ours (renewed, or taken now), else who holds it.
        Raises TierUnavailable when Redis is away and the mind is not held here (a held mind
        keeps serving)."""
        held = self.holdings.get(key)
        if held is not None and held.lost:
            self.holdings.drop(held)
            held = None
        if held is not None:
            if not self.health.reachable:
                return Placement(key, held=held)  # Redis away: keep serving what is held
            try:
                if self.holdings.renew(held):
                    self.health.ok()
                    return Placement(key, held=held)
            except TierUnavailable as err:
                self.health.failed("lease renewal", err)
                return Placement(key, held=held)
        try:
            got = self.holdings.take(key)
        except TierUnavailable as err:
            self.health.failed("lease acquire", err)
            raise
        self.health.ok()
        if isinstance(got, LeaseHolder):
            return Placement(key, holder=Holder.of(got))
        return Placement(key, held=got)

    def resume(self, placement: Placement) -> Resumed:
        """What the turn of a mind that is ours starts from (a mind just taken over is fetched
        from the tier, or falls back)."""
        assert placement.held is not None, "resume a placement that is ours"
        return self.resumer.resume(placement.held, self.geometry())

    def end_turn(
        self, key: PageKey, turn_id: str, tokens: npt.NDArray[np.int32], chat: bytes = b""
    ) -> str | None:
        return self.writer.end_turn(key, turn_id, tokens, chat)

    def forget(self, key: PageKey) -> None:
        """Drop the local copies of a mind lost during its turn (the turn has ended)."""
        self.local.forget(key)

    def hand_off(self, key: PageKey) -> bool:
        return self.writer.hand_off(key)

    def end_mind(self, key: PageKey) -> None:
        """A slot verb ended the mind here: out of the tier too (TierUnavailable: it stays)."""
        self.writer.end_mind(key)

    def append_record(self, op: bytes, mind: PageKey | None) -> str:
        """Append a stored-conversation write to the records' log: fenced by `mind`'s lease
        when this replica holds it (StaleOwner when the lease moved). Its entry id."""
        held = self.holdings.get(mind) if mind is not None else None
        return self.records.append(op, held.lease if held is not None else None)

    def read_records(self, after: str) -> list[tuple[str, bytes]]:
        """The records' log after entry `after` ("0": all), oldest first."""
        return self.records.read_after(after)

    def holder(self, key: PageKey) -> Holder | None:
        """Who holds the mind's lease now (None: free). Raises TierUnavailable."""
        lease = self.holdings.leases.holder(self.holdings.keys_of(key))
        return Holder.of(lease) if lease is not None else None

    def n_minds_held(self) -> int:
        """Minds whose lease this replica holds now."""
        return len(self.holdings.all())

    def threads(self) -> list[LoopView]:
        """The tier's background threads (lease renewal, publication) as /health shows them;
        one that had died is started again first (logged)."""
        return [*self.holdings.threads(), *self.writer.threads()]

    def _lost(self, held: Held) -> None:
        """Another replica has the mind: drop our copies (unless a turn still runs on it: its
        end finds the mind lost and drops them then)."""
        self.local.forget(held.key)

    # -- views -------------------------------------------------------------------------------

    def view(self, read_redis: bool = True) -> TierView:
        """The tier's state; with `read_redis`, Redis's byte counts too (then call it on a
        worker thread)."""
        tier_bytes = used = None
        try:
            with translating("tier statistics"):
                if read_redis and self.store.budget is not None:
                    tier_bytes = self.store.budget.total_bytes()
                if read_redis:
                    used = int(self.client.info("memory").get("used_memory", 0))
        except TierUnavailable:
            pass
        s = self.settings
        held = tuple(
            HeldView(h.key, h.lease.fence, len(h.tokens), h.n_published, h.n_unpublished,
                     h.published_gen, h.dirty_since is not None)
            for h in self.holdings.all()
        )  # fmt: skip
        return TierView(
            replica_id=self.replica_id,
            advertise_url=self.incarnation.advertise_url,
            url=redacted(s.shared_tier or ""),
            lease_ms=s.lease_ms,
            rpo_tokens=s.rpo_tokens,
            rpo_s=s.rpo_seconds,
            budget_bytes=s.shared_tier_bytes,
            reachable=self.health.reachable,
            n_unreachable=self.health.n_failures,
            tier_bytes=tier_bytes,
            redis_used_bytes=used,
            store=self.store.counters_now(),
            token_log=self.token_log.counters(),
            writer=self.writer.counters(),
            resumes=self.stats.snapshot(),
            held=held,
            replicas=cluster_replicas(os.environ) if read_redis else None,
        )

    # -- the end -----------------------------------------------------------------------------

    def drain(self) -> None:
        """Publish every dirty mind and release every lease (SIGTERM, sleep); the engine must
        still run. Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            self.writer.drain()
        finally:
            self.holdings.stop()

    def close(self) -> None:
        self.drain()
        self.store.close()
        self.client.close()
        self.bulk.close()
