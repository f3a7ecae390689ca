"""Resuming a mind this replica has just taken over: what to restore once its lease is ours.

A mind whose lease was just acquired (its replica died, drained or handed it off; or it is new)
resumes from the best state there is:
1. the tier's page, when the tier holds one: fetched with every chunk checked (`store.fetch`)
   into a buffer of our own, and handed to the engine with the turn (`Submit.restore`, the path
   of a disk read-back: one memcpy into the slot); the local copies, older or not ours, are
   forgotten first, so the engine seats the fetched state;
2. a fetch that misses (a chunk gone or corrupt, another model, Redis away) is counted and
   logged, and falls back to the local copies, then to nothing: the engine prefills the
   request's whole prompt. The next publication then writes a whole page (no chunk of the bad
   generation is reused);
   The fetched page's buffer is charged to the page store (`--page-ram-bytes`) until the
   engine has applied it, so concurrent takeovers never hold RAM past the budget;
3. a mind the tier never held is served from the local copies, as without a cluster;
4. a mind this replica released while idle (`holdings.Released`) and nobody wrote since (the
   same manifest generation, the same last turn in its token log) is served from its copies
   here, with no fetch.
A fetched page counts as resumed only once a turn ran on it (`MindWriter.end_turn`): a turn
that never reached a slot (its client left during the fetch, a refusal at admission) leaves
the mind to be fetched again by the next turn, never re-prefilled for want of the page.
The token log is read too: it says which tokens the mind held before this turn, so the turn
can count the tokens it had to prefill again (for a retried turn that its dead owner had
already logged, what the restored page held).

A mind held here already needs none of this. Blocking (Redis, the engine, file removal): run
on a worker thread, never on the event loop.
"""

from __future__ import annotations

import logging
import mmap
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from kvswap.core.keys import PageKey, spare_key
from kvswap.core.page import PageGeometry, SlotState, state_of_page
from kvswap.core.vocab import ResumeSource
from kvswap.engine.kv.buffers import new_buffer
from kvswap.engine.kv.pagestore import PageStore, Reservation
from kvswap.tiers.shared.errors import Miss, MissReason, TierUnavailable
from kvswap.tiers.shared.health import TierHealth
from kvswap.tiers.shared.holdings import Held, Holdings
from kvswap.tiers.shared.local import LocalMinds
from kvswap.tiers.shared.manifest import Manifest
from kvswap.tiers.shared.store import Fetched, SharedStore
from kvswap.tiers.shared.token_log import LogRead, TokenLog

log = logging.getLogger("kvswap.shared")

_CHUNK_MISSES = (MissReason.CHUNK_MISSING, MissReason.CHUNK_CORRUPT)
TAKEOVER_KEY = spare_key("takeover")  # what the page store charges a fetched page to


@dataclass
class Resumed:
    """How a turn starts on a mind: the state to restore, and what the resume cost."""

    source: ResumeSource
    state: SlotState | None = None  # the tier's page, to apply with the turn
    tokens_known: npt.NDArray[np.int32] = field(default_factory=lambda: np.zeros(0, np.int32))
    last_turn: str = ""  # the token log's last turn id (this very turn's, when it is a retry)
    chat: bytes = b""  # that turn's chat record (`minds.turnrecord`), for the next prompt
    page_tokens: npt.NDArray[np.int32] = field(default_factory=lambda: np.zeros(0, np.int32))
    miss: str = ""  # why the tier's page was not used, when it had one
    fetch_s: float = 0.0
    verify_s: float = 0.0
    n_bytes: int = 0
    store: PageStore | None = field(default=None, repr=False)  # charges the fetched page
    _buffers: list[tuple[mmap.mmap, Reservation | None]] = field(default_factory=list, repr=False)

    def alloc(self, n_bytes: int) -> memoryview:
        """A buffer for the fetched page, closed with this resume, and charged to the page
        store until then (`--page-ram-bytes` bounds takeovers too: StoreFull, a typed 503,
        when it cannot take the page now)."""
        res = self.store.reserve(TAKEOVER_KEY, n_bytes) if self.store is not None else None
        try:
            buffer = new_buffer(n_bytes)
        except BaseException:
            if res is not None and self.store is not None:
                self.store.cancel(res)
            raise
        self._buffers.append((buffer, res))
        return memoryview(buffer)

    @property
    def taken_over(self) -> bool:
        return self.source not in (ResumeSource.HELD, ResumeSource.NEW)

    def close(self) -> None:
        """Free the fetched page (once the engine has applied it)."""
        if self.state is not None:
            self.state.release()
            self.state = None
        for buffer, res in self._buffers:
            try:
                buffer.close()
                closed = True
            except BufferError:  # a view is still alive: its bytes stay counted as leaked
                closed = False
            if res is not None and self.store is not None:
                self.store.cancel(res, closed=closed)
        self._buffers.clear()


class Resumer:
    """See the module docstring."""

    def __init__(
        self,
        *,
        holdings: Holdings,
        store: SharedStore,
        token_log: TokenLog,
        local: LocalMinds,
        health: TierHealth,
    ) -> None:
        self.holdings = holdings
        self.store = store
        self.token_log = token_log
        self.local = local
        self.health = health

    def resume(self, held: Held, geometry: PageGeometry) -> Resumed:
        """What the mind's next turn starts from (`held` was just taken when not resumed)."""
        if held.resumed:
            return Resumed(ResumeSource.HELD, tokens_known=held.tokens)
        keys = held.lease.keys
        try:
            read = self.token_log.read_log(keys)
        except TierUnavailable as err:
            self.health.failed("token log read", err)
            read = LogRead(np.zeros(0, np.int32), "", b"")
            self.holdings.update(held, log_behind=True)
        tokens, last_turn = read.tokens, read.turn_id
        self.holdings.update(held, tokens=tokens, turn_id_logged=last_turn, chat=read.chat)
        record = self.store.read_manifest(keys)
        if self._unchanged(held, record, last_turn):
            # released here while idle, and nobody wrote it since: its copies here are current
            released = held.released
            assert released is not None
            self.holdings.update(
                held, resumed=True, published_gen=released.gen,
                n_published=released.n_published, published_seq=0,
            )  # fmt: skip
            return Resumed(ResumeSource.HELD, tokens_known=tokens)
        if isinstance(record, Miss) and record.reason is MissReason.ABSENT:
            # the tier never held it: a new mind, or one this replica holds from before the
            # cluster (its copies here serve it, as without a shared tier)
            self.holdings.update(held, resumed=True)
            return Resumed(
                ResumeSource.NEW, tokens_known=tokens, last_turn=last_turn, chat=read.chat
            )
        return self._fetch(held, geometry, read)

    def _fetch(self, held: Held, geometry: PageGeometry, read: LogRead) -> Resumed:
        """The tier's page for the turn, or the fallback after a miss."""
        tokens, last_turn = read.tokens, read.turn_id
        out = Resumed(
            ResumeSource.TIER,
            tokens_known=tokens,
            last_turn=last_turn,
            chat=read.chat,
            store=self.local.store,
        )
        keys = held.lease.keys
        fetched = self.store.fetch(keys, fingerprint=geometry.file_fingerprint(), alloc=out.alloc)
        if isinstance(fetched, Fetched):
            self.local.forget(held.key)
            out.state = state_of_page(fetched.page, fetched.layout)
            out.page_tokens = out.state.tokens
            out.fetch_s, out.verify_s, out.n_bytes = (
                fetched.seconds,
                fetched.verify_s,
                fetched.n_bytes_read,
            )
            fetched.page.release()
            m = fetched.manifest
            self.holdings.update(held, n_published=m.n_tokens, published_gen=m.gen, published_seq=0)
            return out
        out.close()
        if fetched.reason is MissReason.UNAVAILABLE:
            self.health.failed("page fetch", RuntimeError(fetched.detail))
        source = self._fallback(held.key)
        log.warning(
            "mind %s: the shared tier's page is not usable (%s: %s); resuming from %s",
            held.key.name,
            fetched.reason.value,
            fetched.detail,
            "its copy here" if source is ResumeSource.LOCAL else "its prompt (a re-prefill)",
        )
        self.holdings.update(
            held,
            resumed=True,
            published_gen=fetched.gen,
            publish_whole=fetched.reason in _CHUNK_MISSES,
        )
        return Resumed(
            source, tokens_known=tokens, last_turn=last_turn, chat=read.chat,
            miss=fetched.reason.value,
        )  # fmt: skip

    def _unchanged(self, held: Held, record: Manifest | Miss, last_turn: str) -> bool:
        """Released here while idle, with copies here, and nobody wrote it since."""
        released = held.released
        if released is None or last_turn != released.turn_id or not self.local.has(held.key):
            return False
        if isinstance(record, Miss):
            return record.reason is MissReason.ABSENT and released.gen == 0
        return record.gen == released.gen

    def _fallback(self, key: PageKey) -> ResumeSource:
        """Where the turn starts without the tier's page: this replica's copies, or nothing."""
        return ResumeSource.LOCAL if self.local.has(key) else ResumeSource.NONE
