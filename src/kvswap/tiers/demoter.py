"""Minds between RAM and disk: the demoter thread, the disk budget, ownership, the minds a
restart finds, and the spill before exit.

- The demoter keeps `headroom` bytes free in the page store (a low watermark under
  `--page-ram-bytes`): it asks the engine's anonymous cache to shed first (`ShedCache`: the
  cache is the one owner of its eviction), then spills the least recently used idle mind pages
  to disk (crash-safe publication, off the engine thread) and drops them from RAM. Each pass
  ends with a `RoomReport` to the engine, which a mind switch waiting for room reads.
- `--page-disk-bytes` bounds the disk tier (`tiers.diskbudget`): when full, a spill is refused
  (a typed reason the waiting switch answers) unless `--page-disk-drop-lru` lets it drop the
  least recently used spilled minds (logged, counted).
- Ownership: a server owns each mind it serves live, in a slot or a RAM page, through a claim
  (`files.owners`: no descriptor per mind), so two servers sharing a save path never serve one
  mind twice. `settle` gives the claim up once the mind lives on disk only, and forgets a mind
  that lives nowhere any more: a name costs nothing until it holds state.
- Flushes (`--page-flush-seconds N`, 0: off): an idle mind changed N seconds ago is written to
  disk and stays where it is (RAM pages as they are, residents copied out by the engine), and
  once no mind has been used for `_QUIET_S` (none in use), every changed mind is written at
  once; so a SIGKILL loses at most N seconds of turns, and none once the minds went quiet. A
  flush never drops another mind's copy for room, and a copy of a mind ended since is never
  written.
- `start()` moves the minds an earlier version kept among the slot files into the minds'
  folder (`tiers.mindfiles`, once), then lists the minds spilled there and serves them (a mind
  survives a restart); `close()` (SIGTERM, sleep, normal exit) spills every resident mind and
  RAM page not already current on disk.

Each pass of the thread is `run_pass`. Owns the demoter thread, its bell (attached to the
engine's hand-offs, `engine.seats.handoffs`: the engine rings it when a hand-off waits or the
store is short of room) and the ownership claims. It reads and writes the mind registry, the
flush schedule and the hand-offs through the engine's `PagesHandle`. File I/O happens here, on the demoter thread, the closing thread or the
I/O executor, never on the engine thread or the event loop.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from kvswap.core.errors import ErrorKind, KvswapError
from kvswap.core.keys import PageKey, PageKind
from kvswap.core.page import PageGeometry
from kvswap.engine.commands import (
    ALL_HELD,
    Answer,
    Captured,
    Command,
    FlushMinds,
    RoomReport,
    ShedCache,
)
from kvswap.engine.handle import PagesHandle
from kvswap.engine.kv.pagestore import PageStore
from kvswap.engine.seats.registry import DiskCopy
from kvswap.files import FilesError, Publisher
from kvswap.files.owners import OwnerLocks
from kvswap.tiers.diskbudget import DiskBudget
from kvswap.tiers.handfiles import HandoffFiles
from kvswap.tiers.mindfiles import HEAD_BYTES, file_name, key_of, made_with, migrate, n_tokens_of
from kvswap.tiers.slotfiles import publish_state

log = logging.getLogger("kvswap.demoter")

_POLL_S = 0.5  # the demoter also looks without being woken, this often
_ENGINE_TIMEOUT_S = 60.0  # how long a flush or a shed waits for the engine's answer
_QUIET_S = 1.0  # no mind used for this long: the write-behind runs


@dataclass(frozen=True)
class MindPolicy:
    """The minds' slice of the configuration."""

    page_disk_bytes: int | None = None  # --page-disk-bytes; None: no bound
    disk_drop_lru: bool = False  # --page-disk-drop-lru
    flush_seconds: float = 0.0  # --page-flush-seconds; 0: no scheduled writes


class Demoter:
    """See the module docstring."""

    def __init__(
        self,
        *,
        pages: PagesHandle,
        post: Callable[[Command], None],
        publisher: Publisher | None,
        save_dir: Path | None,
        policy: MindPolicy,
        slot_files: Publisher | None = None,
    ) -> None:
        self.store = pages.store
        self.registry = pages.registry
        self.flushes = pages.flushes
        self.handoffs = pages.handoffs
        self.post = post
        self.publisher = publisher  # the minds' folder (tiers.mindfiles)
        self.slot_files = slot_files  # the slot files, where earlier versions kept minds
        self.save_dir = save_dir
        self.policy = policy
        self.owners = OwnerLocks(save_dir) if save_dir is not None else None
        self.io = threading.Lock()  # one spill at a time: demoter and close never interleave
        self.disk = (
            DiskBudget(
                bound_bytes=policy.page_disk_bytes,
                drop_lru=policy.disk_drop_lru,
                registry=self.registry,
                publisher=publisher,
                settle=self.settle,
            )
            if publisher is not None
            else None
        )
        self.files = (
            HandoffFiles(self, publisher, self.disk)
            if publisher is not None and self.disk is not None
            else None
        )
        self._bell = threading.Event()  # the engine (or `close`) wakes the thread
        self.handoffs.attach(self._bell.set, disk_tier=publisher is not None)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._n_passes = 0
        self._refused = ""  # why the last pass could not make room
        self._closed = False
        self._quiet_flushed = 0.0  # the last use before the quiet spell last flushed

    # -- lifecycle --------------------------------------------------------------------------

    def start(self, geometry: PageGeometry) -> None:
        """Serve the minds spilled under the save path, then start the demoter thread."""
        if self.publisher is not None:
            if self.slot_files is not None:
                migrate(self.slot_files, self.publisher)
            self._list_spilled(geometry)
        if self.store is not None:
            self._thread = threading.Thread(target=self._loop, name="kvswap-demoter", daemon=True)
            self._thread.start()

    def forget(self, key: PageKey) -> None:
        """A slot verb ended mind `key` (erase, page_out): its spilled files go too, so no
        tier holds it. Under the spill lock: no copy taken before this is written after it."""
        with self.io:
            copy = self.registry.forget(key, also=self._forget_rest)
            if copy is not None and self.publisher is not None:
                self.publisher.remove(file_name(key))
        self.settle(key)  # its claim goes too: it lives nowhere now

    def spill_now(self, key: PageKey) -> str | None:
        """A client's spill of mind `key` (POST /minds/{name}?action=spill): its RAM page is
        written to disk and leaves RAM (it stays when a request holds the mind meanwhile);
        None when done, else why not (the disk tier's refusal, the write's error)."""
        if self.publisher is None or self.store is None:
            return "there is no disk tier (--slot-save-path)"
        return self._spill(self.store, key, drop=True, bounded=True)

    def owns(self, key: PageKey) -> bool:
        """This server owns mind `key` already (no file is touched)."""
        return self.owners is None or self.owners.owns(file_name(key))

    def own(self, key: PageKey) -> bool:
        """This server owns mind `key` (now or already); False: another server does. Typed
        503 when the OS refuses the claim (no descriptor left, say): never an EMFILE."""
        if self.owners is None:
            return True
        try:
            return self.owners.own(file_name(key))
        except OSError as err:
            raise KvswapError(
                ErrorKind.UNAVAILABLE, f"cannot claim the mind in the save path now: {err}"
            ) from err

    def settle(self, key: PageKey) -> None:
        """Mind `key` may have stopped living here: give its claim up once it lives on disk
        only (any server may then take it), and forget it once it lives nowhere."""
        store, reg = self.store, self.registry
        in_ram = store.has if store is not None else (lambda _: False)
        owners = self.owners
        if owners is not None:
            reg.when_not_live(key, in_ram, lambda: owners.release(file_name(key)))

        def held(k: PageKey) -> bool:  # its RAM page, or its copy on its way to disk
            return in_ram(k) or self.handoffs.handing(k)

        reg.forget_if_gone(key, held, also=self._forget_rest)

    def _forget_rest(self, key: PageKey) -> None:
        """The flush schedule's and the hand-offs' entries of a forgotten mind."""
        self.flushes.forget(key)
        self.handoffs.forget(key)

    def _list_spilled(self, geometry: PageGeometry) -> None:
        assert self.publisher is not None
        fingerprint = geometry.file_fingerprint()
        n_served = 0
        for info in self.publisher.list_generations():
            key = key_of(info.name)
            if key is None:
                continue
            if info.fingerprint != fingerprint:
                what = made_with(info.fingerprint, fingerprint)
                self.registry.record_foreign(key, what)
                log.warning(
                    "spilled mind %s was made with %s: not served, its file is kept (requests "
                    "naming it are refused)",
                    key,
                    what,
                )
                continue
            if self.owners is not None and self.owners.owned_elsewhere(info.name):
                log.warning("spilled mind %s is served by another server: not served here", key)
                continue
            n_bytes = sum(f.n_bytes for f in info.files)
            try:
                n_tokens = n_tokens_of(self.publisher.read_head(info.name, HEAD_BYTES))
            except FilesError as err:
                log.warning("spilled mind %s cannot be read: not served (%s)", key, err)
                continue
            self.registry.record_disk(key, DiskCopy(n_bytes, n_tokens, info.created_unix_s))
            self.registry.touch(key, when_unix_s=info.created_unix_s)
            n_served += 1
        if n_served:
            log.info("serving %d spilled mind(s) from %s", n_served, self.save_dir)

    def close(self, engine_alive: bool) -> None:
        """Stop the demoter and spill every mind (residents and RAM pages) to disk; the
        residents only when the engine can still hand them over (`engine_alive`)."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        self._bell.set()  # wakes the thread so it sees the stop
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        try:
            if engine_alive:
                self._flush_all()
        finally:
            if self.owners is not None:
                self.owners.close()

    def _flush_all(self) -> None:
        store = self.store
        if store is None:
            return
        # Only minds whose disk copy is not current are copied out and counted.
        minds_in_ram = [k for k in _minds_in_ram(store) if not self.is_current(k)]
        resident = frozenset(k for k in self.registry.residents() if not self.is_current(k))
        answer = Answer()
        self.post(FlushMinds(answer, resident))
        if not answer.wait(_ENGINE_TIMEOUT_S):
            log.error("the engine did not hand over its resident minds: they are not spilled")
            return
        captured = answer.value
        if isinstance(captured, KvswapError):
            log.error("resident minds could not be copied out: %s", captured.message)
            return
        assert isinstance(captured, list)
        if self.publisher is None:
            for _, cap in captured:
                cap.close()
            if captured or minds_in_ram:
                log.warning(
                    "no --slot-save-path: %d mind(s) are lost at exit",
                    len(captured) + len(minds_in_ram),
                )
            return
        self._write_handoffs()
        n_spilled = sum(self._spill_captured(key, cap) for key, cap in captured)
        for key in minds_in_ram:
            n_spilled += self._spill(store, key, drop=False, bounded=False) is None
        if n_spilled:
            log.info("spilled %d mind(s) before exit", n_spilled)

    def is_current(self, key: PageKey) -> bool:
        """Mind `key`'s disk copy holds its newest state (nothing changed since it was taken)."""
        return self.registry.disk_copy(key) is not None and not self.flushes.is_dirty(key)

    def _spill_captured(self, key: PageKey, cap: Captured, t_copied: float | None = None) -> int:
        """Write a copy of mind `key` (taken at `t_copied`, if known) and close its buffer; 1
        when written (or already current on disk). A copy of a mind a slot verb ended since is
        not written."""
        assert self.publisher is not None
        if self.is_current(key):
            cap.close()
            return 1
        try:
            with self.io:
                if t_copied is not None and self.registry.forgotten_after(key, t_copied):
                    return 0
                receipt = publish_state(self.publisher, file_name(key), cap.buffer, cap.layout)
            self.record_disk(key, receipt.n_bytes, cap.layout.n_tokens)
            return 1
        except FilesError as err:
            self.registry.count(spill_failed_total=1)
            log.error("mind %s could not be spilled: %s", key, err)
            return 0
        finally:
            cap.close()

    # -- the demoter thread -----------------------------------------------------------------

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._bell.wait(_POLL_S)  # woken by the engine, or it looks anyway
            self._bell.clear()
            if self._stop.is_set():
                return
            self.post(self.run_pass())

    def run_pass(self) -> RoomReport:
        """One pass of the demoter thread: write the hand-offs, free the headroom, write the
        minds due; what it reports to the engine (a failure is logged, and retried next pass).
        The thread's, or a test's that drives the demoter without it."""
        try:
            self._write_handoffs()
            self._demote()
            if self.policy.flush_seconds > 0 and self.publisher is not None:
                self._flush_due(self._flush_age())
        except Exception as err:
            log.exception("the demoter failed; it retries")
            self.registry.count(spill_failed_total=1)
            self._refused = f"the demoter failed ({type(err).__name__})"
        self._n_passes += 1
        return RoomReport(self._n_passes, self._refused)

    def _flush_due(self, age_s: float) -> None:
        """Write the idle minds changed `age_s` ago (RAM pages directly, resident minds through
        a copy from the engine), so a SIGKILL loses at most `--page-flush-seconds`. A mind
        whose write is refused (the disk budget: flushes never drop other minds) waits another
        window."""
        store, reg = self.store, self.registry
        assert store is not None
        due = self.flushes.due(age_s, busy=reg.busy())
        if not due:
            return
        for key in [k for k in due if store.has(k)]:
            self._flush_page(store, key)
        resident = frozenset(k for k in due if reg.resident_slot(k) is not None)
        if not resident:
            return
        t_asked = time.time()
        answer = Answer()
        self.post(FlushMinds(answer, resident, charged=True))
        if not answer.wait(_ENGINE_TIMEOUT_S) or not isinstance(answer.value, list):
            return
        for key, cap in answer.value:
            if self._disk_refusal(key, cap.layout.n_bytes, may_drop=False) is not None:
                cap.close()
            elif self._spill_captured(key, cap, t_asked):  # closes the buffer
                self.flushes.flushed(key, t_asked)
                reg.count(flushes_total=1)

    def _flush_page(self, store: PageStore, key: PageKey) -> None:
        """Write mind `key`'s RAM page to disk, keeping it in RAM."""
        assert self.publisher is not None
        try:
            page = store.hold(key)
        except KvswapError:
            return  # paged in meanwhile: its next window writes it from the slot
        t_held = time.time()
        try:
            if self._disk_refusal(key, page.n_bytes, may_drop=False) is not None:
                return
            with self.io:
                if self.registry.forgotten_after(key, t_held):
                    return
                receipt = publish_state(self.publisher, file_name(key), page.buffer, page.layout)
            self.record_disk(key, receipt.n_bytes, page.layout.n_tokens)
            self.flushes.flushed(key, t_held)
            self.registry.count(flushes_total=1)
        except FilesError as err:
            self.registry.count(spill_failed_total=1)
            log.error("mind %s could not be written to disk: %s", key, err)
        finally:
            store.release(page)

    def _write_handoffs(self) -> None:
        """Open, publish or drop the files of the minds the engine hands over (`handfiles`)."""
        if self.files is None:
            return
        while (job := self.handoffs.take()) is not None:
            self.files.run(job)
            if self.files.refused:
                self._refused, self.files.refused = self.files.refused, ""

    def _demote(self) -> None:
        """Shed the anonymous cache, then spill least recently used idle mind pages, until the
        headroom is free."""
        store = self.store
        assert store is not None
        reg = self.registry
        target = store.ceiling_bytes - store.headroom_bytes
        shed = True
        while store.in_use_bytes > target and not self._stop.is_set():
            if shed and self._shed(store.in_use_bytes - target) > 0:
                continue  # the anonymous prompt cache gives way first: dropped, never spilled
            shed = False
            candidates = reg.idle(_minds_in_ram(store))
            if not candidates:
                self._refused = ALL_HELD
                return
            if self.publisher is None:
                self._refused = "there is no disk tier to spill to (--slot-save-path)"
                return
            refusal = self._spill(store, candidates[0], drop=True, bounded=True)
            if refusal is not None:
                self._refused = refusal
                return
        self._refused = ""

    def _flush_age(self) -> float:
        """How long ago a mind must have changed to be written now: `--page-flush-seconds`, or
        0 once in each quiet spell (no mind used for `_QUIET_S`), so that every changed mind
        reaches disk as soon as the minds go quiet and a SIGKILL then loses none."""
        last = self.registry.last_used()
        newest = max(last.values(), default=0.0)
        quiet = newest and time.time() - newest >= _QUIET_S and not self.registry.any_busy()
        if quiet and newest != self._quiet_flushed:
            self._quiet_flushed = newest
            return 0.0
        return self.policy.flush_seconds

    def _shed(self, n_bytes: int) -> int:
        """Ask the anonymous cache (on the engine thread) to drop `n_bytes`; bytes it freed."""
        answer = Answer()
        self.post(ShedCache(n_bytes, answer))
        if not answer.wait(_ENGINE_TIMEOUT_S) or not isinstance(answer.value, int):
            return 0
        return answer.value

    def _spill(self, store: PageStore, key: PageKey, *, drop: bool, bounded: bool) -> str | None:
        """Write mind `key`'s RAM page to disk; `drop` then frees it from RAM (unless a request
        holds the mind meanwhile; a page whose disk copy is current is freed unwritten). None
        when written (or current), else why not (the disk tier's refusal, the write's error):
        the caller's own answer, never another thread's."""
        assert self.publisher is not None
        reg = self.registry
        try:
            page = store.hold(key)
        except KvswapError:
            return None  # paged in (or spilled) meanwhile
        try:
            if drop and self.is_current(key):
                # Its disk copy holds this very state (written behind): only RAM is freed.
                if reg.drop_if_idle(key, lambda: store.remove(key, page.generation)):
                    self.settle(key)
                reg.count(spills_total=1)
                return None
            refusal = self._disk_refusal(key, page.n_bytes) if bounded else None
            if refusal is not None:
                assert self.disk is not None
                if drop and self.disk.give_way(
                    key, partial(store.remove, key, page.generation), "RAM"
                ):
                    return None  # the mind went instead of its copy
                return refusal or "the disk tier refused it"
            t_held = time.time()
            with self.io:
                receipt = publish_state(self.publisher, file_name(key), page.buffer, page.layout)
            self.record_disk(key, receipt.n_bytes, page.layout.n_tokens)
            self.flushes.flushed(key, t_held)
            if drop and reg.drop_if_idle(key, lambda: store.remove(key, page.generation)):
                self.settle(key)  # on disk only now: another server may take it
            reg.count(spills_total=1)
            return None
        except FilesError as err:
            reg.count(spill_failed_total=1)
            log.error("mind %s could not be spilled: %s", key, err)
            return f"a spill to disk failed ({err})"
        finally:
            store.release(page)

    def record_disk(self, key: PageKey, n_bytes: int, n_tokens: int) -> None:
        self.registry.record_disk(key, DiskCopy(n_bytes, n_tokens, time.time()))

    def _disk_refusal(self, key: PageKey, n_bytes: int, may_drop: bool = True) -> str | None:
        """Why the disk tier has no room for mind `key`'s copy (`diskbudget`; "" a quiet
        refusal), or None."""
        assert self.disk is not None
        return self.disk.room(key, n_bytes, may_drop)


def _minds_in_ram(store: PageStore) -> list[PageKey]:
    return [i.key for i in store.infos() if i.in_store and i.key.kind is PageKind.MIND]
