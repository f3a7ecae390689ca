"""A mind's session: one turn (or mind verb) of a mind at a time, and what holding it takes.

`MindSession.turn(key, facts)` holds mind `key` for a request's turn, `hold(key)` for a mind
verb; both yield a `HeldMind`:
1. the per-mind asyncio lock (two requests of one mind run in order; a lock lives only while
   someone holds or awaits it, so any number of names costs no lock);
2. the mind marked busy (the demoter never drops its RAM page meanwhile), then claimed for this
   server in the save path (`Claims.own`, on the I/O executor: a claim is a file, never a
   descriptor per mind); a mind another server holds is a 503, one made by another model or
   KV types a 400 (its file is kept);
3. in a cluster, a turn is placed (`shared.SharedMinds.place`: serve, forward, wait the lease
   out and take over; a mind taken over is resumed from the shared tier, and its last chat
   turn read from there into `histories`: `minds.turnrecord`);
4. `restore(held)`, asked once by the turn before it goes to the engine: the state the engine
   applies with it (`Submit.restore`): a fork's seed (another mind's state, `HeldMind.seed`),
   the shared tier's page, else the mind's disk copy when it lives there only (read on an I/O
   worker; one made under other KV types is re-prefilled);
5. at the end: when a restored state went to the engine, the barrier (a `Nudge`: every
   command posted so far handled, so the engine is done with the buffers) before they are
   freed; the busy mark cleared, and what a mind that holds no live state no longer needs let
   go (`Claims.settle`, on the I/O executor, also after a failure or a cancellation).

`turn_done` is the turn's end before its answer goes out (in a cluster, written to the shared
tier); `served` completes the engine's account of how the mind was seated (the tier it came
from, the switch's time). Also the minds' views for GET /pages, and forgetting a mind a slot verb ended.

RAM-to-disk movement (the demoter, the disk budget, ownership files, the spill before exit)
lives in `kvswap.tiers.demoter`. Runs on the event loop; file I/O on the I/O executor.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Executor
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from typing import Protocol

import numpy as np
import numpy.typing as npt

from kvswap.core.errors import ErrorKind, KvswapError, StoreOff
from kvswap.core.keys import PageKey, PageKind
from kvswap.core.page import SlotState
from kvswap.core.types import Completion, EngineError, GenerationRequest, MindServed
from kvswap.core.vocab import MindSource, MindTier, ResumeSource
from kvswap.engine.commands import Command, Nudge
from kvswap.engine.kv.pagestore import PageStore
from kvswap.engine.seats.registry import MindRegistry, MindView
from kvswap.engine.snapshot import EngineSnapshot
from kvswap.files import FilesError, WrongModelError
from kvswap.minds.diskseed import DiskSeeds
from kvswap.minds.histories import DEFAULT_BUDGET_TOKENS, MindHistories
from kvswap.minds.placement import TurnFacts
from kvswap.minds.shared import SharedMinds
from kvswap.minds.turnrecord import decode_record
from kvswap.tiers.shared.replica import Resumed
from kvswap.tiers.slotfiles import ReadState, files_error

log = logging.getLogger("kvswap.minds")


class Claims(Protocol):
    """Who may write a mind's files (`tiers.demoter.Demoter` is one): claims and their end."""

    def owns(self, key: PageKey) -> bool: ...

    def own(self, key: PageKey) -> bool: ...

    def settle(self, key: PageKey) -> None: ...

    def forget(self, key: PageKey) -> None: ...


@dataclass
class Seed:
    """Another mind's state a new mind starts from (a fork), and what frees it once the
    engine is done with it."""

    state: SlotState
    close: Callable[[], None]


@dataclass
class HeldMind:
    """A mind held for one turn or verb (see the module docstring)."""

    key: PageKey
    facts: TurnFacts | None = None  # a request's turn: what its request says about it
    resumed: Resumed | None = None  # in a cluster, how the turn starts (None: a verb)
    lease_wait_s: float = 0.0  # a takeover's wait for a dead owner's lease
    on_disk_only: bool = False  # its state lives in its disk copy only
    read: ReadState | None = None  # the disk copy read back for the engine
    read_ms: float = 0.0  # ... and how long its read took
    restored: bool = False  # `restore` was asked (once per turn)
    seed: Seed | None = None  # a fork: the state it starts from (set before `restore`)
    disk_seed: bool = False  # `read` is another mind's state, a new mind's seed (`diskseed`)


class MindSession:
    """See the module docstring."""

    def __init__(
        self,
        *,
        registry: MindRegistry,
        store: PageStore | None,
        claims: Claims,
        post: Callable[[Command], None],
        snapshot: Callable[[], EngineSnapshot],
        io: Executor,
        read_back: Callable[[PageKey], ReadState] | None = None,
        shared: SharedMinds | None = None,
        seeds: DiskSeeds | None = None,
    ) -> None:
        """`read_back(key)`: the mind's disk copy read (blocking; None: no disk tier);
        `seeds`: new minds may start from their tenant's minds on disk (None: they may not)."""
        self.registry = registry
        self.store = store
        self.claims = claims
        self.post = post
        self.snapshot = snapshot
        self.io = io
        self.read_back = read_back
        self.shared = shared
        self.seeds = seeds
        # Each mind's last chat turn, for its next one (in a cluster, read from the shared
        # tier when a replica takes the mind over: `minds.turnrecord`).
        self.histories = MindHistories(DEFAULT_BUDGET_TOKENS)
        # A lock per mind, with how many requests hold or await it (dropped at 0).
        self._locks: dict[PageKey, tuple[asyncio.Lock, int]] = {}

    # -- holding a mind ---------------------------------------------------------------------

    @asynccontextmanager
    async def turn(self, key: PageKey, facts: TurnFacts | None) -> AsyncIterator[HeldMind]:
        """Hold mind `key` for a request's turn (placed first in a cluster)."""
        async with self._holding(HeldMind(key, facts), place=True) as held:
            yield held

    @asynccontextmanager
    async def hold(self, key: PageKey) -> AsyncIterator[HeldMind]:
        """Hold mind `key` for a mind verb (in a cluster, this replica's copy)."""
        async with self._holding(HeldMind(key), place=False) as held:
            yield held

    @asynccontextmanager
    async def _holding(self, held: HeldMind, *, place: bool) -> AsyncIterator[HeldMind]:
        store = self.store
        if store is None:
            raise StoreOff("minds need the page store (--page-ram-bytes > 0)")
        key = held.key
        async with self.exclusive(key), self._claimed(key):
            if place and self.shared is not None:
                held.resumed, held.lease_wait_s = await self.shared.place(key, held.facts)
                self._take_last_turn(key, held.resumed)
            held.on_disk_only = self.registry.begin_use(key, store.has)
            try:
                yield held
            finally:
                await self._let_go(held)

    def _take_last_turn(self, key: PageKey, resumed: Resumed) -> None:
        """A mind taken over continues from the last turn its previous owner recorded in the
        shared tier (a mind held here already has its own, as current)."""
        if resumed.taken_over or resumed.source is ResumeSource.NEW:
            turn = decode_record(resumed.chat, resumed.tokens_known, resumed.last_turn)
            if turn is not None:
                self.histories.put(key, turn)

    async def restore(
        self, held: HeldMind, prompt: npt.NDArray[np.int32] | None = None
    ) -> SlotState | None:
        """The state the engine applies with the held mind's turn, if it needs one (asked
        once, right before the turn is submitted). `prompt`: the turn's, which a new mind may
        start from a prefix of (`held.disk_seed` then says the state is another mind's)."""
        assert not held.restored, "a turn restores its mind once"
        held.restored = True
        if held.seed is not None:
            return held.seed.state
        resumed = held.resumed
        if resumed is not None and resumed.state is not None:
            return resumed.state
        if held.on_disk_only:
            return await self.read_again(held)
        if prompt is not None and self.seeds is not None and self.tier(held.key) is None:
            return await self._seed_from_disk(held, prompt)
        return None

    async def _seed_from_disk(
        self, held: HeldMind, prompt: npt.NDArray[np.int32]
    ) -> SlotState | None:
        """A new mind's start: the state of its tenant's mind on disk sharing the longest
        prefix with its prompt (`minds.diskseed`); None when none pays its read, or the read
        fails (logged: the mind starts from its prompt)."""
        assert self.seeds is not None
        loop = asyncio.get_running_loop()
        found = await loop.run_in_executor(self.io, self.seeds.donor, held.key, prompt)
        if found is None:
            return None
        donor, n_prefix = found
        try:
            read = await self._read(donor)
        except KvswapError as err:
            log.warning("mind %s: no seed from %s: %s", held.key, donor, err.message)
            return None
        if read is None:
            return None
        held.read, held.disk_seed = read, True
        log.info(
            "mind %s starts from %s's first %d tokens, read from disk", held.key, donor, n_prefix
        )
        return read.state

    async def read_again(self, held: HeldMind) -> SlotState | None:
        """The held mind's disk copy read back for its turn: a mind on disk only, or one a
        switch moved straight to disk while its turn waited (`MindOnDisk`: sent again)."""
        assert held.read is None and held.seed is None, "a turn reads its mind once"
        held.on_disk_only = True
        t0 = time.perf_counter()
        held.read = await self._read(held.key)
        held.read_ms = (time.perf_counter() - t0) * 1e3
        return held.read.state if held.read is not None else None

    def served(self, held: HeldMind, served: MindServed) -> MindServed:
        """The engine's account of how the held mind was seated, completed with what only this
        side knows: a state it restored came from the shared tier (in a cluster) or from disk,
        and the fetch or read before the engine applied it is part of the switch."""
        if served.source is not MindSource.DISK:
            return served
        resumed = held.resumed
        if resumed is not None and resumed.state is not None:
            before_ms = (resumed.fetch_s + resumed.verify_s + held.lease_wait_s) * 1e3
            return replace(served, source=MindSource.SHARED, switch_ms=served.switch_ms + before_ms)
        return replace(served, switch_ms=served.switch_ms + held.read_ms)

    async def _let_go(self, held: HeldMind) -> None:
        self.registry.pop_restore_ms(held.key)  # read by the turn's end, if at all
        resumed = held.resumed
        given = held.read is not None or (resumed is not None and resumed.state is not None)
        try:
            if held.restored and (given or held.seed is not None):
                await self._after_engine()  # the engine is done with the restored state
        finally:
            if held.seed is not None:
                held.seed.close()
            if held.read is not None:
                held.read.close()
            if resumed is not None:
                resumed.close()

    async def turn_done(
        self, held: HeldMind, request: GenerationRequest, completion: Completion
    ) -> Completion | EngineError:
        """The held mind's turn has completed: in a cluster its end is written to the shared
        tier first; the event to answer with."""
        restore_ms = self.registry.pop_restore_ms(held.key) or 0.0
        done: Completion | EngineError = completion
        if self.shared is not None:
            done = await self.shared.turn_done(
                request,
                completion,
                facts=held.facts,
                resumed=held.resumed,
                lease_wait_s=held.lease_wait_s,
                restore_ms=restore_ms,
            )
        if isinstance(done, Completion) and request.turn_mark is not None and not done.cancelled:
            self.histories.record(held.key, request.prompt_tokens, done, request.turn_mark)
        return done

    @asynccontextmanager
    async def exclusive(self, key: PageKey) -> AsyncIterator[None]:
        """Hold the mind's lock: no other request of the mind runs meanwhile (a session holds
        it; so does a cluster hand-off). The lock lives while someone holds or awaits it."""
        lock, n_users = self._locks.get(key, (asyncio.Lock(), 0))
        self._locks[key] = (lock, n_users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, n_users = self._locks[key]
            if n_users == 1:
                del self._locks[key]
            else:
                self._locks[key] = (lock, n_users - 1)

    @asynccontextmanager
    async def _claimed(self, key: PageKey) -> AsyncIterator[None]:
        """The mind is busy (the demoter keeps its RAM page) and claimed for this server; at
        the end, what it no longer needs is released (`Claims.settle`)."""
        loop = asyncio.get_running_loop()
        self.registry.set_busy(key, True)  # before the claim: a settle never races it
        try:
            if not self.claims.owns(key) and not await loop.run_in_executor(
                self.io, self.claims.own, key
            ):
                raise KvswapError(
                    ErrorKind.UNAVAILABLE,
                    "this mind is served by another server sharing the save path",
                )
            made_with = self.registry.foreign(key)
            if made_with is not None:
                # Its state stays in its file for the server that made it: never written over.
                raise KvswapError(
                    ErrorKind.INVALID_REQUEST,
                    f"this mind was spilled by a server running {made_with}, which this server "
                    "cannot load: its file is kept; serve it from a server with that model and "
                    "those KV types, or name another mind",
                )
            yield
        finally:
            self.registry.set_busy(key, False)
            await asyncio.shield(loop.run_in_executor(self.io, self.claims.settle, key))

    async def _after_engine(self) -> None:
        """Wait until the engine has handled every command posted so far (a seat that applies a
        restored state runs before the next command is read, so its buffers are then free)."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()

        def settle() -> None:
            if not done.done():
                done.set_result(None)

        def reply(_: object) -> None:
            loop.call_soon_threadsafe(settle)

        self.post(Nudge(reply))
        await asyncio.shield(done)

    async def read_state(self, key: PageKey) -> ReadState | None:
        """Mind `key`'s disk copy read back (held by the caller; None: it cannot be loaded)."""
        return await self._read(key)

    async def _read(self, key: PageKey) -> ReadState | None:
        """The mind's state read back from disk; None when it was made under KV types (or a
        model) the server no longer runs: the mind then starts from its prompt (logged)."""
        assert self.read_back is not None, "a mind on disk only, with no disk tier"
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self.io, self.read_back, key)
        except WrongModelError as err:
            log.warning("mind %s: its disk copy cannot be loaded here (%s): re-prefilled", key, err)
            return None
        except FilesError as err:
            raise files_error(err, "read the mind back") from err

    # -- what the pages and the verbs ask ---------------------------------------------------

    def tier(self, key: PageKey) -> MindTier | None:
        """Where mind `key` lives now, or None (nowhere)."""
        if self.registry.resident_slot(key) is not None:
            return MindTier.SLOT
        if self.store is not None and self.store.has(key):
            return MindTier.RAM
        return MindTier.DISK if self.registry.disk_copy(key) is not None else None

    def disk_bytes(self, namespace: str) -> int:
        """The bytes of tenant `namespace`'s spilled minds."""
        copies = self.registry.disk_copies()
        return sum(c.n_bytes for k, c in copies.items() if k.namespace == namespace)

    async def forget(self, key: PageKey) -> None:
        """A slot verb ended mind `key` (erase, page_out): its spilled copy goes too, so no
        tier holds it any more (the files are removed on an I/O worker; in a cluster the shared
        tier drops it too)."""
        if self.shared is not None:
            await self.shared.ended(key)
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(self.io, self.claims.forget, key)
        except FilesError as err:
            raise files_error(err, "remove the mind's spilled copy") from err

    def views(self, namespace: str) -> list[MindView]:
        """The minds of tenant `namespace`, with their live tier."""
        store = self.store
        resident = {
            key: (slot_id, n)
            for key, slot_id, n in self.snapshot().minds
            if key.namespace == namespace
        }
        ram = {
            i.key: (i.n_tokens, i.n_bytes)
            for i in (store.infos() if store is not None else [])
            if i.in_store and i.key.kind is PageKind.MIND and i.key.namespace == namespace
        }
        disk = {k: c for k, c in self.registry.disk_copies().items() if k.namespace == namespace}
        last = self.registry.last_used()
        out = []
        for key in sorted(set(resident) | set(ram) | set(disk)):
            copy = disk.get(key)
            if key in resident:
                slot_id, n_tokens = resident[key]
                tier, n_bytes = MindTier.SLOT, 0
            elif key in ram:
                slot_id, (n_tokens, n_bytes), tier = -1, ram[key], MindTier.RAM
            else:
                assert copy is not None
                slot_id, n_tokens, n_bytes, tier = -1, copy.n_tokens, copy.n_bytes, MindTier.DISK
            out.append(
                MindView(key, tier, slot_id, n_tokens, n_bytes, last.get(key, 0.0),
                         copy is not None, copy.n_tokens if copy is not None else 0)
            )  # fmt: skip
        return out
