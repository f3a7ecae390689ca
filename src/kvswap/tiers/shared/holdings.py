"""The minds this replica owns in the shared tier: their leases, what each has published, and
the renewal thread.

A mind is held from a successful `take` (its lease acquired, `lease.Leases`) until it is
released (`release`: a hand-off, an idle mind, the drain before exit) or lost. The renewal
thread renews every held lease each third of its TTL, all of them in pipelines of
`RENEW_BATCH` (one round trip per batch: 50,000 held minds renew in well under a second on a
LAN, where one round trip each took about 4 s). A renewal Redis refuses is handled on a worker
of its own, never on the renewal thread (taking the lease again, or forgetting the mind's
copies, waits on Redis, the engine and the disk), so one lost lease never holds up the others'
renewals. A renewal Redis refuses means the lease is gone: when
it merely expired (Redis was away longer than the TTL) and nobody wrote the mind since, it is
taken again and the mind carries on (`_regain`); otherwise the mind is lost: forgotten here,
unpublished state dropped (`on_lost`); a mind whose turn still runs is marked lost instead, and
the turn's end makes its fenced write, which Redis refuses (a stale owner, counted), before the
mind is dropped. While Redis cannot be reached the held minds stay held:
no other replica can take a lease from an unreachable Redis either, and every write a stale
holder might make later is refused by the fence inside Redis.

`Held` is what the writer needs per mind: the tokens its KV holds (what the token log says),
the turn that the published page follows, when it became dirty. Its scalar fields are read and
written under the holdings' lock; `Held.publishing` serialises the mind's publications.

With `KVSWAP_FENCE_LOG=FILE` every lease event (acquire, renew, release, lost) is appended to
FILE as a JSON line with Redis's clock, so a test can check that two replicas never held one
mind's lease at once (`FenceLog`).

A mind released while idle keeps its copies here; what it had published is remembered
(`Released`, the latest `MAX_RELEASED` minds), so taking it again finds out whether anyone
wrote it since (`resume`: if not, the copies here serve it, with no fetch).

Owns the leases and `Held` records, the renewal thread (`loops.Loop`: a failed pass is logged
and the next runs) and the worker that handles lost leases. Thread-safe.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Final

import numpy as np
import numpy.typing as npt
import redis

from kvswap.core.keys import PageKey
from kvswap.tiers.shared.connection import as_bytes
from kvswap.tiers.shared.errors import TierUnavailable, translating
from kvswap.tiers.shared.health import TierHealth
from kvswap.tiers.shared.keys import MindKeys
from kvswap.tiers.shared.lease import Lease, LeaseHolder, Leases
from kvswap.tiers.shared.loops import Loop, LoopView

log = logging.getLogger("kvswap.shared")

FENCE_LOG_ENV = "KVSWAP_FENCE_LOG"
RENEW_BATCH: Final = 2000  # leases renewed per pipeline (one round trip)
MAX_RELEASED: Final = 100_000  # released minds remembered (two ints and a turn id each)


@dataclass(frozen=True)
class Released:
    """What a mind released while idle had published, for its next take here."""

    gen: int  # its manifest's generation when released (0: none)
    turn_id: str  # the token log's last turn id when released
    n_published: int  # tokens of that page


@dataclass
class Held:
    """One mind this replica holds."""

    key: PageKey
    lease: Lease
    tokens: npt.NDArray[np.int32]  # what its KV holds after its last turn here (the token log)
    log_behind: bool = False  # the token log in Redis lags `tokens` (an append failed)
    turn_id: str = ""  # the last turn id, appended to the token log or waiting to be
    turn_id_logged: str = ""  # the last turn id Redis acknowledged
    chat: bytes = b""  # the last turn's chat record, written with its tokens (`token_log`)
    seq: int = 0  # turns ended here since it was taken
    published_seq: int = -1  # the turn its published page follows (-1: none since taken)
    n_published: int = 0  # tokens of the page in the tier (what a successor restores)
    published_gen: int = 0  # the manifest generation it last wrote or read
    dirty_since: float | None = None  # monotonic: its first unpublished turn; None: clean
    retry_at: float = 0.0  # monotonic: a failed publication is retried from then on
    resumed: bool = False  # its takeover is done (`resume`): turns just run
    publish_whole: bool = False  # the tier's page had bad chunks: write the next one whole
    lost: bool = False  # its lease is gone but a turn still runs: its end's write is refused
    last_used: float = field(default_factory=time.monotonic)  # its last turn's end, or take
    released: Released | None = None  # it was released here while idle, this is what it had
    publishing: threading.Lock = field(default_factory=threading.Lock, repr=False)
    # renewals, re-takes and the release of its lease, one at a time: a renewal that races a
    # release never takes the lease again behind it
    leasing: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def n_unpublished(self) -> int:
        if self.dirty_since is None:
            return 0
        return max(0, len(self.tokens) - self.n_published)


class FenceLog:
    """JSON lines of lease events, on Redis's clock (debug and tests: KVSWAP_FENCE_LOG)."""

    def __init__(self, path: str, replica_id: str, token: str) -> None:
        self._path = path
        self._who = {"replica": replica_id, "token": token[:12]}
        self._lock = threading.Lock()

    @classmethod
    def from_env(cls, replica_id: str, token: str) -> FenceLog | None:
        path = os.environ.get(FENCE_LOG_ENV)
        return cls(path, replica_id, token) if path else None

    def write(self, event: str, lease: Lease, t_ms: int = 0) -> None:
        line = {**self._who, "event": event, "mind": lease.keys.tag, "fence": lease.fence,
                "t_ms": t_ms, "ttl_ms": lease.ttl_ms}  # fmt: skip
        with self._lock, open(self._path, "a", encoding="utf-8") as f:
            f.write(json.dumps(line) + "\n")


class Holdings:
    """See the module docstring."""

    def __init__(
        self,
        client: redis.Redis,
        leases: Leases,
        *,
        prefix: str,
        health: TierHealth,
        busy: Callable[[PageKey], bool],
        on_lost: Callable[[Held], None],
    ) -> None:
        """`busy(key)`: a turn of the mind runs now; `on_lost(held)` runs for a mind whose
        lease is gone (on the thread that found out)."""
        self.leases = leases
        self.prefix = prefix
        self.ttl_ms = leases.ttl_ms
        self._client = client
        self._health = health
        self._busy = busy
        self._on_lost = on_lost
        self._fence_log = FenceLog.from_env(leases.incarnation.replica_id, leases.incarnation.token)
        self._lock = threading.Lock()
        self._held: dict[PageKey, Held] = {}
        self._released: OrderedDict[PageKey, Released] = OrderedDict()
        self.loop = Loop("kvswap-leases", self._pass, retry_s=self.ttl_ms / 3000)
        self._refused = ThreadPoolExecutor(1, thread_name_prefix="kvswap-lease-lost")

    # -- the records -------------------------------------------------------------------------

    def get(self, key: PageKey) -> Held | None:
        with self._lock:
            return self._held.get(key)

    def all(self) -> list[Held]:
        with self._lock:
            return list(self._held.values())

    def update(self, held: Held, **changes: object) -> None:
        """Set fields of a record (under the lock: the renewal and writer threads read them)."""
        with self._lock:
            for name, value in changes.items():
                setattr(held, name, value)

    def keys_of(self, key: PageKey) -> MindKeys:
        return MindKeys.of(key, self.prefix)

    # -- acquiring and giving up -------------------------------------------------------------

    def take(self, key: PageKey) -> Held | LeaseHolder:
        """Acquire the mind's lease: a new record (or the one held already), or its holder.
        Raises TierUnavailable."""
        held = self.get(key)
        if held is not None:
            return held
        got = self.leases.acquire(self.keys_of(key))
        if isinstance(got, LeaseHolder):
            return got
        held = Held(key, got, np.zeros(0, np.int32))
        with self._lock:
            held.released = self._released.pop(key, None)
            held = self._held.setdefault(key, held)
        self._log_event("acquire", got, got.t_ms)
        log.info("mind %s: lease taken (fence %d)", key.name, got.fence)
        return held

    def renew(self, held: Held) -> bool:
        """Renew now: True when it is still ours (renewed, or taken again), False when it is
        lost (the record is gone and `on_lost` ran, or marked lost while its turn runs).
        Raises TierUnavailable (Redis cannot say)."""
        with held.leasing:
            if self.get(held.key) is not held:
                return False  # released or dropped meanwhile
            t_ms = self.leases.renew(held.lease)
            if t_ms:
                self._log_event("renew", held.lease, t_ms)
                return True
            return self._regain(held)

    def release(self, held: Held, *, keep: bool = False) -> bool:
        """Give the lease up (after publishing); False when, with `keep`, a turn of the mind
        has begun meanwhile (it keeps the lease). With `keep` (an idle mind whose copies stay
        here) what it published is remembered for its next take. Raises TierUnavailable (the
        mind stays held)."""
        with held.leasing:
            # under the lease lock: a turn that began before this look renews after it, finds
            # the record gone and takes the lease again (`renew`)
            if keep and self._busy(held.key):
                return False
            t_ms = self.leases.release(held.lease)
            with self._lock:
                if self._held.get(held.key) is held:
                    del self._held[held.key]
                if keep:
                    self._released[held.key] = Released(
                        held.published_gen, held.turn_id_logged, held.n_published
                    )
                    while len(self._released) > MAX_RELEASED:
                        self._released.popitem(last=False)
        self._log_event("release", held.lease, t_ms)
        log.info("mind %s: lease released (fence %d)", held.key.name, held.lease.fence)
        return True

    def release_many(self, helds: list[Held]) -> int:
        """Release every lease of `helds` in one pipeline (the drain before exit); how many
        were still ours. Raises TierUnavailable (they stay held)."""
        replies = self.leases.release_many([h.lease for h in helds])
        with self._lock:
            for h in helds:
                if self._held.get(h.key) is h:
                    del self._held[h.key]
        for h, t_ms in zip(helds, replies, strict=True):
            self._log_event("release", h.lease, t_ms)
        return sum(1 for t_ms in replies if t_ms)

    def drop(self, held: Held, *, unless_busy: bool = False) -> None:
        """Forget a record whose lease is not ours anymore. With `unless_busy` (the renewal
        found out) a mind whose turn still runs is only marked lost: the turn's end tries its
        fenced write, Redis refuses it, and the record goes then."""
        with self._lock:
            if self._held.get(held.key) is not held:
                return
            if unless_busy and self._busy(held.key):
                held.lost = True
                return
            del self._held[held.key]
        self._log_event("lost", held.lease)
        log.warning("mind %s: lease lost (fence %d)", held.key.name, held.lease.fence)
        self._later(self._on_lost, held)

    def _regain(self, held: Held) -> bool:
        """The lease is not ours anymore: take it again when it merely expired and nobody wrote
        the mind since (the record carries on under the new fence); else the mind is lost."""
        keys = held.lease.keys
        got = self.leases.acquire(keys)
        if isinstance(got, Lease):
            self._log_event("acquire", got, got.t_ms)
            if self._untouched(held, keys):
                self.update(held, lease=got)
                log.warning(
                    "mind %s: lease expired while Redis was away; taken again (fence %d)",
                    held.key.name,
                    got.fence,
                )
                return True
            self._log_event("release", got, self.leases.release(got))
        self.drop(held, unless_busy=True)
        return False

    def _untouched(self, held: Held, keys: MindKeys) -> bool:
        """Nobody but this replica wrote the mind since it last did: the manifest is the one
        it wrote or read (or gone with Redis's data), the token log's last turn is its own."""
        with translating("lease check"):
            pipe = self._client.pipeline(transaction=True)
            pipe.hget(keys.manifest, "gen")
            pipe.lindex(keys.turns, 0)
            gen, turn = pipe.execute()
        gen_ok = gen is None or int(gen) == held.published_gen
        last = as_bytes(turn)
        turn_ok = last is None or last.decode("utf-8", "replace") == held.turn_id_logged
        return gen_ok and turn_ok

    def _probe(self) -> None:
        """Whether Redis answers again (a replica holding no mind renews nothing)."""
        try:
            with translating("ping"):
                self._client.ping()
        except TierUnavailable as err:
            self._health.failed("ping", err)
        else:
            self._health.ok()

    def _log_event(self, event: str, lease: Lease, t_ms: int = 0) -> None:
        if self._fence_log is not None:
            self._fence_log.write(event, lease, t_ms)

    # -- the renewal thread ------------------------------------------------------------------

    def start(self) -> None:
        self.loop.start()

    def stop(self) -> None:
        self.loop.stop()
        self._refused.shutdown(wait=True, cancel_futures=True)

    def threads(self) -> list[LoopView]:
        """The renewal thread as /health shows it (started again first if it had died)."""
        self.loop.ensure_running()
        return [self.loop.view()]

    def _pass(self) -> float:
        """Renew every held lease, in pipelines; the seconds until the next pass (a third of
        a TTL after this one started, or at once when it took longer)."""
        t0 = time.monotonic()
        if not self._health.reachable:
            self._probe()
        held = [h for h in self.all() if not h.lost]  # a lost one: its turn's end drops it
        for i in range(0, len(held), RENEW_BATCH):
            if self.loop.stopping:
                return 0.0
            batch = held[i : i + RENEW_BATCH]
            try:
                renewed = self.leases.renew_many([h.lease for h in batch])
            except TierUnavailable as err:
                self._health.failed("lease renewal", err)
                break
            self._health.ok()
            for h, t_ms in zip(batch, renewed, strict=True):
                if t_ms:
                    self._log_event("renew", h.lease, t_ms)
                else:
                    self._later(self._after_refusal, h)
        return max(0.0, self.ttl_ms / 3000 - (time.monotonic() - t0))

    def _later(self, fn: Callable[[Held], object], held: Held) -> None:
        """`fn(held)` on the lost-lease worker (inline once it has stopped: the drain)."""
        try:
            self._refused.submit(self._guarded, fn, held)
        except RuntimeError:  # shut down
            self._guarded(fn, held)

    def _after_refusal(self, held: Held) -> None:
        """A renewal Redis refused: take the lease again or lose the mind (on the worker)."""
        with held.leasing:
            if self.get(held.key) is held:  # not released meanwhile
                self._regain(held)

    def _guarded(self, fn: Callable[[Held], object], held: Held) -> None:
        """The lost-lease worker's call: every failure logged, none kills the worker."""
        try:
            fn(held)
        except TierUnavailable as err:
            self._health.failed("lease check", err)
        except Exception:
            log.exception("mind %s: handling its lost lease failed", held.key.name)
