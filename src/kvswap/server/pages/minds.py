"""Minds on the HTTP side: which mind a request names, one request per mind at a time, the disk
read-back, and the minds view of GET /pages.

- `request_mind(headers, body_mind, namespace)`: the mind key a request names, in the namespace
  of the tenant the guard authenticated (`guard.tenant_namespace`).
- `session(request)`: the per-mind asyncio lock (two requests for one mind run in order); the
  mind is marked busy so the demoter never drops its RAM page meanwhile, and claimed in the save
  path (`Demoter.own`, on the I/O executor: a claim is a file, never a descriptor per mind); a
  mind found only on disk is read back on an I/O worker and handed to the engine with the
  request (`Submit.restore`); the engine seats it (`engine.minds.seating`). At the end
  `Demoter.settle` releases what a mind that holds no live state no longer needs. The server's
  `Runner` (`server.streaming`) runs every mind's request inside its session.
- `views(namespace)`: the minds of one tenant with their live tier, for GET /pages.
- In a cluster (`--shared-tier`), the session first makes the mind this replica's for the turn
  (`pages.cluster.ClusterGate.place`: serve, forward to its owner, or take it over and resume
  it from the shared tier, the resumed state handed to the engine as a disk read-back is), and
  `turn_done` writes the turn's end to the shared tier before the answer goes out.

RAM-to-disk movement (the demoter, the disk budget, ownership, the spill before exit) lives in
`kvswap.tiers.demoter`. Owns the per-mind locks, each kept only while a request holds or awaits
it (so any number of names costs no lock). File I/O happens on the I/O executor.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Mapping
from concurrent.futures import Executor
from contextlib import asynccontextmanager

from kvswap.core.errors import ErrorKind, KvswapError, StoreOff
from kvswap.core.keys import PageKey, PageKind, mind_key
from kvswap.core.page import SlotState
from kvswap.core.types import Completion, EngineError, GenerationRequest
from kvswap.core.vocab import MindTier
from kvswap.engine.client import EngineClient
from kvswap.engine.commands import Nudge
from kvswap.engine.minds.registry import MindView
from kvswap.files import FilesError, Publisher, WrongModelError
from kvswap.server.pages.cluster import ClusterGate
from kvswap.tiers.demoter import Demoter
from kvswap.tiers.mindfiles import file_name
from kvswap.tiers.slotfiles import ReadState, files_error, read_state

log = logging.getLogger("kvswap.minds")


def request_mind(
    headers: Mapping[str, str], body_mind: str | None, namespace: str
) -> PageKey | None:
    """The mind a request names (`"mind"` in the body and/or `X-Mind-Id`), in its tenant's
    `namespace`; None when it names none. The header is read as UTF-8 (HTTP hands its bytes
    over as Latin-1), so both ways name the same mind; a typed 400 when they disagree or the
    header is not UTF-8."""
    header = _header_utf8(headers.get("x-mind-id"))
    if body_mind is not None and header is not None and body_mind != header:
        raise KvswapError(
            ErrorKind.INVALID_REQUEST,
            f'the X-Mind-Id header ({header!r}) and the body\'s "mind" ({body_mind!r}) name '
            "different minds",
        )
    name = body_mind if body_mind is not None else header
    if name is None:
        return None
    return mind_key(namespace, name)


def _header_utf8(raw: str | None) -> str | None:
    if raw is None:
        return None
    try:
        return raw.encode("latin-1").decode("utf-8")
    except UnicodeError as err:
        raise KvswapError(
            ErrorKind.INVALID_REQUEST, "the X-Mind-Id header must be UTF-8 text"
        ) from err


def mind_name(key: PageKey | None, namespace: str) -> str | None:
    """The name of mind `key` as a caller of `namespace` may see it: None for another
    tenant's mind (or no mind)."""
    if key is None or key.namespace != namespace:
        return None
    return key.name


class MindGate:
    """See the module docstring."""

    def __init__(
        self,
        client: EngineClient,
        demoter: Demoter,
        publisher: Publisher | None,
        io: Executor,
        cluster: ClusterGate | None = None,
    ) -> None:
        self.client = client
        self.store = client.pages.store
        self.registry = client.pages.registry
        self.demoter = demoter
        self.publisher = publisher
        self.io = io
        self.cluster = cluster
        # A lock per mind, with how many requests hold or await it (dropped at 0).
        self._locks: dict[PageKey, tuple[asyncio.Lock, int]] = {}

    @asynccontextmanager
    async def session(self, request: GenerationRequest) -> AsyncIterator[SlotState | None]:
        """Hold the mind for one request; yields the state read from disk, if it must be."""
        assert request.mind is not None
        async with self.hold(request.mind, turn=True) as restore:
            yield restore

    @asynccontextmanager
    async def hold(
        self, key: PageKey, read: bool = True, turn: bool = False
    ) -> AsyncIterator[SlotState | None]:
        """Hold mind `key` (for a request's `turn`, or a mind verb): its lock, busy and
        claimed; yields its state read back (from disk, or the shared tier in a cluster) when
        it lives there only (and `read`)."""
        store = self.store
        if store is None:
            raise StoreOff("minds need the page store (--page-ram-bytes > 0)")
        async with self.exclusive(key), self._held(key):
            # A turn in a cluster: serve here, forward to the owner (ForwardTurn), or take the
            # mind over; a mind verb acts on this replica's copy.
            resumed = await self.cluster.place(key) if turn and self.cluster is not None else None
            on_disk_only = self.registry.begin_use(key, store.has)
            read_back: ReadState | None = None
            try:
                if resumed is not None and resumed.state is not None:
                    yield resumed.state
                else:
                    if on_disk_only and read:
                        read_back = await self._read(key)
                    yield read_back.state if read_back is not None else None
            finally:
                self.registry.pop_restore_ms(key)  # read by the turn's end, if at all
                if read_back is not None or (resumed is not None and resumed.state is not None):
                    await self._after_engine()  # the engine is done with the restored state
                if read_back is not None:
                    read_back.close()
                if resumed is not None:
                    resumed.close()

    async def turn_done(
        self, request: GenerationRequest, completion: Completion
    ) -> Completion | EngineError:
        """The mind's turn has completed (its session still held): in a cluster its end is
        written to the shared tier first; the event to answer with."""
        if self.cluster is None:
            return completion
        return await self.cluster.turn_done(request, completion)

    @asynccontextmanager
    async def exclusive(self, key: PageKey) -> AsyncIterator[None]:
        """Hold the mind's lock: no other request of the mind runs meanwhile (a session holds
        it; so does a cluster hand-off and a mind verb). The lock lives while someone holds or
        awaits it."""
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

    def tier(self, key: PageKey) -> str | None:
        """Where mind `key` lives now: "slot", "ram", "disk", or None (nowhere)."""
        if self.registry.resident_slot(key) is not None:
            return "slot"
        if self.store is not None and self.store.has(key):
            return "ram"
        return "disk" if self.registry.disk_copy(key) is not None else None

    @asynccontextmanager
    async def _held(self, key: PageKey) -> AsyncIterator[None]:
        """The mind is busy (the demoter keeps its RAM page) and claimed for this server; at
        the end, what it no longer needs is released (`Demoter.settle`)."""
        loop = asyncio.get_running_loop()
        self.registry.set_busy(key, True)  # before the claim: a settle never races it
        try:
            if not self.demoter.owns(key) and not await loop.run_in_executor(
                self.io, self.demoter.own, key
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
            await asyncio.shield(loop.run_in_executor(self.io, self.demoter.settle, key))

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

        self.client.post(Nudge(reply))
        await asyncio.shield(done)

    async def _read(self, key: PageKey) -> ReadState | None:
        """The mind's state read back from disk; None when it was made under KV types (or a
        model) the server no longer runs: the mind then starts from its prompt (logged)."""
        assert self.publisher is not None
        loop = asyncio.get_running_loop()
        geometry = self.client.snapshot.page_geometry
        name = file_name(key)
        try:
            return await loop.run_in_executor(self.io, read_state, self.publisher, name, geometry)
        except WrongModelError as err:
            log.warning("mind %s: its disk copy cannot be loaded here (%s): re-prefilled", key, err)
            return None
        except FilesError as err:
            raise files_error(err, "read the mind back") from err

    def disk_bytes(self, namespace: str) -> int:
        """The bytes of tenant `namespace`'s spilled minds."""
        copies = self.registry.disk_copies()
        return sum(c.n_bytes for k, c in copies.items() if k.namespace == namespace)

    async def forget(self, key: PageKey) -> None:
        """A slot verb ended mind `key` (erase, page_out): its spilled copy goes too, so no
        tier holds it any more (the files are removed on an I/O worker; in a cluster the shared
        tier drops it too)."""
        if self.cluster is not None:
            await self.cluster.ended(key)
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(self.io, self.demoter.forget, key)
        except FilesError as err:
            raise files_error(err, "remove the mind's spilled copy") from err

    def views(self, namespace: str) -> list[MindView]:
        """The minds of tenant `namespace`, with their live tier."""
        store = self.store
        resident = {
            key: (slot_id, n)
            for key, slot_id, n in self.client.snapshot.minds
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
