"""Publishing the minds this replica holds: the token log through every turn, the page behind it
under the RPO bound, and everything before exit.

- `end_turn` (when a turn has ended, before its answer goes out): the turn's tokens are appended
  to the mind's token log (write-through, fenced; a replayed turn id applies once). When the
  turn leaves more than `rpo_tokens` tokens unpublished, the page is published now, before the
  answer (`rpo_tokens` 0: every turn), so a replica's death re-prefills at most that many
  tokens of any mind.
- The publication thread publishes, in the background, every dirty mind that has been idle
  `quiet_s` since its last turn (a mind resting in its slot between turns: a SIGKILL then
  loses only minds that were mid-turn), has left its slot (a demotion) or whose oldest
  unpublished turn is `rpo_s` old; a publication that failed (Redis away) or could not be
  made now (no copy here yet) is retried a second later, and once Redis answers again every
  dirty mind is published at once. A held mind idle `release_s` and clean (published) has its
  lease released (its copies here stay; the tier is its home): a replica does not hold, renew
  and list every mind it ever served.
- `hand_off` (another replica asked, the mind is idle) and `drain` (SIGTERM, sleep): publish,
  then release the lease; a hand-off also forgets the local copies. The drain skips Redis when
  it is away, stops publishing at its deadline (`drain_s`), and releases every lease in one
  pipeline.

A publication copies the mind's state out where it lives (`local.LocalMinds.copy`: one memcpy on
the engine thread for a resident mind, the page itself for a RAM page) and writes it to Redis
here, on a worker thread. One publication per mind at a time (`Held.publishing`), each taking
the turn count it follows first, so an older state never lands after a newer one. A write that
the fence refuses means the mind was lost: it is forgotten here and its unpublished state
dropped. Redis unreachable: the mind stays dirty, the failure is counted and logged once
(`health`), resident minds keep serving, and until Redis answers again a turn's end does not
wait on it (the publication thread catches up).

Owns the publication thread (`loops.Loop`: a failed pass is logged and the next runs) and its
counters. Never runs on the engine thread or the event loop.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import TypeVar

import numpy as np
import numpy.typing as npt

from kvswap.core.errors import KvswapError
from kvswap.core.keys import PageKey
from kvswap.engine.seats.registry import MindRegistry
from kvswap.tiers.shared.errors import StaleOwner, TierUnavailable, TokenLogGap
from kvswap.tiers.shared.health import TierHealth
from kvswap.tiers.shared.holdings import Held, Holdings
from kvswap.tiers.shared.local import LocalMinds
from kvswap.tiers.shared.loops import Loop, LoopView
from kvswap.tiers.shared.store import SharedStore
from kvswap.tiers.shared.token_log import TokenLog
from kvswap.tiers.slotfiles import drop_frames

log = logging.getLogger("kvswap.shared")

T = TypeVar("T")
_POLL_S = 0.2  # the publication thread looks for due minds this often
_RETRY_S = 1.0  # a failed publication is retried after this long


class Outcome(StrEnum):
    DONE = "done"
    CLEAN = "clean"  # nothing unpublished
    NOT_NOW = "not_now"  # a turn holds its slot, or no copy here: retried later
    FAILED = "failed"  # Redis away (or the engine did not answer): retried later
    LOST = "lost"  # the fence refused it: the mind is someone else's


@dataclass
class WriterCounters:
    n_turns: int = 0  # turns whose end was written
    n_log_failed: int = 0  # token-log appends that could not reach Redis
    n_publish_turn: int = 0  # pages published before a turn's answer (the RPO bound)
    n_publish_behind: int = 0  # ... in the background (demotion, age, retry)
    n_publish_failed: int = 0
    n_lost: int = 0  # minds lost to another replica (a write refused by the fence)
    n_handoffs: int = 0  # minds handed off to another replica
    n_drained: int = 0  # leases released before exit
    n_released_idle: int = 0  # leases of idle, published minds released (copies kept here)


class MindWriter:
    """See the module docstring."""

    def __init__(
        self,
        *,
        holdings: Holdings,
        store: SharedStore,
        token_log: TokenLog,
        local: LocalMinds,
        registry: MindRegistry,
        health: TierHealth,
        rpo_tokens: int,
        rpo_s: float,
        quiet_s: float,
        release_s: float,
        drain_s: float,
    ) -> None:
        self.holdings = holdings
        self.store = store
        self.token_log = token_log
        self.local = local
        self.registry = registry
        self.health = health
        self.rpo_tokens = rpo_tokens
        self.rpo_s = rpo_s
        self.quiet_s = quiet_s
        self.release_s = release_s
        self.drain_s = drain_s
        self._lock = threading.Lock()
        self._counters = WriterCounters()
        self._catch_up = False  # Redis is back: the next pass publishes every dirty mind
        self.loop = Loop("kvswap-publish", self._pass, retry_s=_RETRY_S)
        health.on_back(self._retry_all)

    def counters(self) -> dict[str, int]:
        with self._lock:
            return asdict(self._counters)

    def _count(self, **deltas: int) -> None:
        with self._lock:
            for name, delta in deltas.items():
                setattr(self._counters, name, getattr(self._counters, name) + delta)

    # -- a turn's end ------------------------------------------------------------------------

    def end_turn(
        self, key: PageKey, turn_id: str, tokens: npt.NDArray[np.int32], chat: bytes = b""
    ) -> str | None:
        """Write the turn's tokens through with its chat record (and its page, past the RPO
        bound); a message when the turn must fail: its mind was lost to another replica
        meanwhile."""
        held = self.holdings.get(key)
        if held is None:
            return "this replica lost the mind to another one during the turn"
        if not self.health.reachable:
            # Redis away: the turn is written when it answers again (no wait on it now)
            self._count(n_log_failed=1)
            self.holdings.update(
                held, tokens=tokens, turn_id=turn_id, chat=chat, seq=held.seq + 1, log_behind=True,
                dirty_since=held.dirty_since or time.monotonic(), last_used=time.monotonic(),
                resumed=True,
            )  # fmt: skip
            return None
        try:
            self._fenced(held, lambda: self._append(held, turn_id, tokens, chat))
        except StaleOwner:
            self._lost(held)
            return "this replica lost the mind to another one during the turn"
        except TierUnavailable as err:
            self.health.failed("token log append", err)
            self._count(n_log_failed=1)
            self.holdings.update(held, log_behind=True)
        self.holdings.update(
            held,
            tokens=tokens,
            turn_id=turn_id,
            chat=chat,
            seq=held.seq + 1,
            dirty_since=held.dirty_since or time.monotonic(),
            last_used=time.monotonic(),
            resumed=True,  # a turn ran on what it was resumed from
        )
        self._count(n_turns=1)
        if held.n_unpublished > self.rpo_tokens:
            outcome = self.publish(held)
            self._count(n_publish_turn=int(outcome is Outcome.DONE))
            if outcome is Outcome.LOST:
                return "this replica lost the mind to another one during the turn"
        return None

    def _append(self, held: Held, turn_id: str, tokens: npt.NDArray[np.int32], chat: bytes) -> None:
        """The token log becomes `tokens` (appending past the common prefix when it can)."""
        n_base = 0 if held.log_behind else _common_prefix(held.tokens, tokens)
        try:
            self.token_log.append(held.lease, turn_id, n_base, tokens[n_base:], chat)
        except TokenLogGap:  # the log lost tokens (Redis lost data): rewrite it
            self.token_log.append(held.lease, turn_id, 0, tokens, chat)
        self.health.ok()
        self.holdings.update(held, log_behind=False, turn_id_logged=turn_id)

    # -- publishing --------------------------------------------------------------------------

    def publish(self, held: Held) -> Outcome:
        """Publish the mind's latest state (and its token log, if it lags)."""
        with held.publishing:
            seq = held.seq
            if held.published_seq >= seq and not held.log_behind:
                return Outcome.CLEAN
            try:
                if held.log_behind:
                    self._fenced(
                        held, lambda: self._append(held, held.turn_id, held.tokens, held.chat)
                    )
                copy = self.local.copy(held.key)
            except StaleOwner:
                self._lost(held)
                return Outcome.LOST
            except (TierUnavailable, TimeoutError, KvswapError) as err:
                return self._failed(held, "publish", err)
            if copy is None:
                return self._not_now(held, seq)
            try:
                receipt = self._fenced(
                    held,
                    lambda: self.store.publish(
                        held.lease, held.key, copy.view, copy.layout, whole=held.publish_whole
                    ),
                )
            except StaleOwner as err:
                drop_frames(err)
                self._lost(held)
                return Outcome.LOST
            except TierUnavailable as err:
                drop_frames(err)
                return self._failed(held, "publish", err)
            finally:
                copy.close()
            self.health.ok()
            self.holdings.update(
                held,
                published_seq=seq,
                n_published=copy.layout.n_tokens,
                published_gen=receipt.gen,
                dirty_since=None if held.seq == seq else held.dirty_since,
                publish_whole=False,
            )
            log.debug(
                "mind %s: generation %d published from its %s (%d of %d bytes written)",
                held.lease.keys.tag,
                receipt.gen,
                copy.source,
                receipt.n_bytes_written,
                receipt.n_bytes_page,
            )
            return Outcome.DONE

    def _fenced(self, held: Held, write: Callable[[], T]) -> T:
        """A fenced write; refused, it is made again once if the lease was only expired
        (Redis away longer than the lease, nobody else took the mind: `Holdings.renew` takes it
        again). StaleOwner when the mind is someone else's."""
        try:
            return write()
        except StaleOwner:
            if held.lost or not self.holdings.renew(held):
                raise
        return write()

    def _not_now(self, held: Held, seq: int) -> Outcome:
        """No copy to publish now: its slot is busy (its turn's end publishes), or the mind
        has no state here at all (its RAM page and files were dropped): then what the tier
        holds is all there is, and it stops being dirty (else it would be asked every pass)."""
        if not self.local.has(held.key):
            log.warning(
                "mind %s: its unpublished turns are gone from this replica (no slot, RAM page "
                "or file); the tier keeps what it had",
                held.key.name,
            )
            self.holdings.update(held, published_seq=seq, dirty_since=None, log_behind=False)
            return Outcome.NOT_NOW
        self.holdings.update(held, retry_at=time.monotonic() + _RETRY_S)
        return Outcome.NOT_NOW

    def _failed(self, held: Held, what: str, err: Exception) -> Outcome:
        if isinstance(err, TierUnavailable):
            self.health.failed(what, err)
        else:
            log.error("mind %s: %s failed: %s", held.lease.keys.tag, what, err)
        self._count(n_publish_failed=1)
        self.holdings.update(held, retry_at=time.monotonic() + _RETRY_S)
        return Outcome.FAILED

    def _lost(self, held: Held) -> None:
        self._count(n_lost=1)
        self.holdings.drop(held)

    # -- a mind ended here ---------------------------------------------------------------------

    def end_mind(self, key: PageKey) -> None:
        """A slot verb ended the mind here (erase, page_out): the tier drops it too (its page
        and token log, fenced) and its lease is released, so no tier holds it and its next
        turn, on any replica, starts it fresh. Raises TierUnavailable (the tier keeps it)."""
        held = self.holdings.get(key)
        if held is None:
            return
        with held.publishing:
            try:
                self._fenced(held, lambda: self.store.drop(held.lease))
            except StaleOwner:
                self._lost(held)
                return
            except TierUnavailable as err:
                self.health.failed("mind drop", err)
                raise
            self.health.ok()
            self.holdings.release(held)

    # -- handing off and draining ------------------------------------------------------------

    def hand_off(self, key: PageKey) -> bool:
        """Publish the mind, release its lease and forget it here (the caller holds the mind:
        no turn runs). False when it is not held here or could not be published."""
        held = self.holdings.get(key)
        if held is None:
            return False
        if self.publish(held) in (Outcome.FAILED, Outcome.LOST):
            return False
        try:
            self.holdings.release(held)
        except TierUnavailable as err:
            self.health.failed("lease release", err)
            return False
        self.local.forget(key)
        self._count(n_handoffs=1)
        return True

    def drain(self) -> None:
        """Publish every dirty mind, then release every lease (SIGTERM, sleep), in at most
        `drain_s`; nothing is sent when Redis is away (the minds stay on this replica's disk,
        their leases expire by themselves)."""
        self.stop()
        held_all = self.holdings.all()
        if not held_all:
            return
        if not self.health.reachable:
            log.warning(
                "shared tier away: %d held mind(s) not published before exit (their copies "
                "here stay; their leases expire)",
                len(held_all),
            )
            return
        deadline = time.monotonic() + self.drain_s
        n_published = n_left = 0
        for held in held_all:
            if time.monotonic() > deadline or not self.health.reachable:
                n_left += 1
                continue
            n_published += int(self.publish(held) is Outcome.DONE)
        try:
            n_released = self.holdings.release_many(held_all)
        except TierUnavailable as err:
            self.health.failed("lease release", err)
            n_released = 0
        self._count(n_drained=n_released)
        log.info(
            "shared tier drained: %d mind(s) published, %d left unpublished (deadline %.0f s or "
            "Redis away), %d of %d lease(s) released",
            n_published,
            n_left,
            self.drain_s,
            n_released,
            len(held_all),
        )

    # -- the publication thread --------------------------------------------------------------

    def start(self) -> None:
        self.loop.start()

    def stop(self) -> None:
        self.loop.stop()

    def threads(self) -> list[LoopView]:
        """The publication thread as /health shows it (started again first if it had died)."""
        self.loop.ensure_running()
        return [self.loop.view()]

    def _retry_all(self) -> None:
        """Redis answers again: every dirty mind is published now, failed or not."""
        for held in self.holdings.all():
            self.holdings.update(held, retry_at=0.0)
        self._catch_up = True
        self.loop.wake.set()

    def _pass(self) -> float:
        catch_up, self._catch_up = self._catch_up, False
        for held in self.holdings.all():
            if self.loop.stopping:
                break
            if self._due(held, catch_up):
                outcome = self.publish(held)
                self._count(n_publish_behind=int(outcome is Outcome.DONE))
            elif self._idle(held):
                self._release_idle(held)
        return _POLL_S

    def _due(self, held: Held, catch_up: bool) -> bool:
        now = time.monotonic()
        dirty_since = held.dirty_since
        if held.lost or (dirty_since is None and not held.log_behind) or now < held.retry_at:
            return False
        if not self.registry.idle([held.key]):
            return False  # a turn holds it: its end writes it
        demoted = self.registry.resident_slot(held.key) is None
        aged = dirty_since is not None and now - dirty_since >= self.rpo_s
        quiet = now - held.last_used >= self.quiet_s
        return catch_up or demoted or aged or quiet or held.log_behind

    def _idle(self, held: Held) -> bool:
        """Idle long enough to let go of its lease, and nothing of it unpublished."""
        clean = held.dirty_since is None and not held.log_behind
        return (
            clean
            and not held.lost
            and time.monotonic() - held.last_used >= self.release_s
            and bool(self.registry.idle([held.key]))
        )

    def _release_idle(self, held: Held) -> None:
        with held.publishing:  # no publication of it runs meanwhile
            if not self._idle(held):
                return
            try:
                released = self.holdings.release(held, keep=True)
            except TierUnavailable as err:
                self.health.failed("lease release", err)
                return
        self._count(n_released_idle=int(released))


def _common_prefix(a: npt.NDArray[np.int32], b: npt.NDArray[np.int32]) -> int:
    n = min(len(a), len(b))
    if n == 0:
        return 0
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if len(diff) else n
