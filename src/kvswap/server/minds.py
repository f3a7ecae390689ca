"""Minds on the HTTP side: one request per mind at a time, disk read-back, background
demotion to disk, the minds a restart finds, and the spill before exit.

- `session(request)`: the per-mind asyncio lock (two requests for one mind run in order); the
  mind is marked busy so the demoter never drops its RAM page meanwhile; a mind found only on
  disk is read back on an I/O worker and handed to the engine with the request
  (`Submit.restore`); the engine seats it (`engine.mindslots`).
- The demoter thread keeps `headroom` bytes free in the page store (a low watermark under
  `--page-ram-bytes`): it spills the least recently used idle mind pages to disk (crash-safe
  publication, off the engine thread) and drops them from RAM. `--page-disk-bytes` bounds the
  disk tier: when full, a spill is refused (a typed reason the waiting switch answers) unless
  `--page-disk-drop-lru` lets it drop the least recently used spilled minds (logged, counted).
- Ownership: a server owns each mind it serves through an exclusive lock file
  (`files.owners`), so two servers sharing a save path never serve one mind twice.
- `start()` lists the minds spilled under the save path and serves them (a mind survives a
  restart); `close()` (SIGTERM, normal exit) spills every resident mind and RAM page first.

Owns the demoter thread, the per-mind locks and the ownership locks. File I/O happens on the
I/O executor, the demoter thread or the closing thread, never on the engine thread.
"""

from __future__ import annotations

import asyncio
import logging
import struct
import threading
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from kvswap.engine.anoncache import KEY_PREFIX as ANON_PREFIX
from kvswap.engine.commands import Captured, FlushMinds, Nudge
from kvswap.engine.engine import Engine
from kvswap.engine.minds import (
    DiskCopy,
    MindRegistry,
    MindView,
    is_mind_key,
    mind_key,
    namespace_of,
    split_key,
)
from kvswap.engine.pagestore import PageStore
from kvswap.engine.slotstate import SlotState
from kvswap.engine.types import ErrorKind, GenerationRequest, KvswapError
from kvswap.files import FilesError, Publisher
from kvswap.files.owners import OwnerLocks
from kvswap.server.slotfiles import ReadState, files_error, publish_state, read_state

log = logging.getLogger("kvswap.minds")

_DEMOTER_POLL_S = 0.5  # the demoter also looks without being woken, this often
_FLUSH_TIMEOUT_S = 60.0


def request_mind(headers: Mapping[str, str], body_mind: str | None, keyed: bool) -> str:
    """The mind key a request names (`"mind"` in the body, else `X-Mind-Id`), in the namespace
    of its API key when the server has keys; "" when it names none."""
    name = body_mind if body_mind is not None else headers.get("x-mind-id")
    if name is None:
        return ""
    api_key = ""
    if keyed:
        raw = headers.get("authorization") or headers.get("x-api-key") or ""
        api_key = raw.removeprefix("Bearer ")
    return mind_key(namespace_of(api_key), name)


@dataclass(frozen=True)
class MindPolicy:
    """The minds' slice of the configuration."""

    page_disk_bytes: int | None = None  # --page-disk-bytes; None: no bound
    disk_drop_lru: bool = False  # --page-disk-drop-lru


class MindGate:
    """See the module docstring."""

    def __init__(
        self,
        engine: Engine,
        publisher: Publisher | None,
        save_dir: Path | None,
        policy: MindPolicy,
    ) -> None:
        self.engine = engine
        self.registry: MindRegistry = engine.minds
        self.publisher = publisher
        self.save_dir = save_dir
        self.policy = policy
        self.owners = OwnerLocks(save_dir) if save_dir is not None else None
        self._locks: dict[str, asyncio.Lock] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._io = threading.Lock()  # one spill at a time: demoter and close never interleave
        self._closed = False

    # -- lifecycle --------------------------------------------------------------------------

    def start(self) -> None:
        """Serve the minds spilled under the save path, then start the demoter."""
        if self.publisher is not None:
            self._list_spilled()
        if self.engine.store is not None:
            self._thread = threading.Thread(
                target=self._demote_loop, name="kvswap-demoter", daemon=True
            )
            self._thread.start()

    def _list_spilled(self) -> None:
        assert self.publisher is not None and self.save_dir is not None
        fingerprint = self.engine.page_geometry.file_fingerprint()
        n_served = 0
        for info in self.publisher.list_generations():
            if not is_mind_key(info.name):
                continue
            if info.fingerprint != fingerprint:
                log.warning(
                    "spilled mind %s was made by another model or KV type: not served", info.name
                )
                continue
            if not self._own(info.name):
                log.warning(
                    "spilled mind %s is served by another server: not served here", info.name
                )
                continue
            n_bytes = sum(f.n_bytes for f in info.files)
            copy = DiskCopy(n_bytes, _n_tokens(self.save_dir / info.name), info.created_unix_s)
            with self.registry.lock:
                self.registry.disk[info.name] = copy
                self.registry.last_used.setdefault(info.name, info.created_unix_s)
            n_served += 1
        if n_served:
            log.info("serving %d spilled mind(s) from %s", n_served, self.save_dir)

    def close(self) -> None:
        """Stop the demoter and spill every mind (residents and RAM pages) to disk."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        self.registry.wake.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        try:
            self._flush_all()
        finally:
            if self.owners is not None:
                self.owners.close()

    def _flush_all(self) -> None:
        store = self.engine.store
        if store is None or self.engine.crashed:
            return
        minds_in_ram = [i.name for i in store.infos() if i.in_store and is_mind_key(i.name)]
        done = threading.Event()
        result: list[object] = []

        def reply(value: object) -> None:
            result.append(value)
            done.set()

        self.engine.post(FlushMinds(reply))
        if not done.wait(_FLUSH_TIMEOUT_S):
            log.error("the engine did not hand over its resident minds: they are not spilled")
            return
        captured = result[0]
        if isinstance(captured, KvswapError):
            log.error("resident minds could not be copied out: %s", captured.message)
            return
        assert isinstance(captured, list)
        if self.publisher is None:
            for _, cap in captured:
                cap.buffer.close()
            if captured or minds_in_ram:
                log.warning(
                    "no --slot-save-path: %d mind(s) are lost at exit",
                    len(captured) + len(minds_in_ram),
                )
            return
        n_spilled = 0
        for key, cap in captured:
            n_spilled += self._spill_captured(key, cap)
        for key in minds_in_ram:
            n_spilled += self._spill(store, key, drop=False, bounded=False)
        log.info("spilled %d mind(s) before exit", n_spilled)

    def _spill_captured(self, key: str, cap: Captured) -> int:
        assert self.publisher is not None
        try:
            with self._io:
                receipt = publish_state(self.publisher, key, cap.buffer, cap.layout)
            self._record_disk(key, receipt.n_bytes, cap.layout.n_tokens)
            return 1
        except FilesError as err:
            self.registry.counters.spill_failed_total += 1
            log.error("mind %s could not be spilled: %s", key, err)
            return 0
        finally:
            cap.buffer.close()

    # -- requests ---------------------------------------------------------------------------

    @asynccontextmanager
    async def session(self, request: GenerationRequest) -> AsyncIterator[SlotState | None]:
        """Hold the mind for one request; yields the state read from disk, if it must be."""
        key = request.mind
        if self.engine.store is None:
            raise KvswapError(
                ErrorKind.NOT_SUPPORTED, "minds need the page store (--page-ram-bytes > 0)"
            )
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock:
            if not self._own(key):
                raise KvswapError(
                    ErrorKind.UNAVAILABLE,
                    "this mind is served by another server sharing the save path",
                )
            with self.registry.lock:
                self.registry.busy.add(key)
                on_disk_only = not self._live(key) and key in self.registry.disk
            read: ReadState | None = None
            try:
                if on_disk_only:
                    read = await self._read(key)
                yield read.state if read is not None else None
            finally:
                self.registry.set_busy(key, False)
                if read is not None:
                    await self._after_engine()  # the engine is done with the restored state
                    read.close()

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

        self.engine.post(Nudge(reply))
        await asyncio.shield(done)

    def _live(self, key: str) -> bool:
        """The mind is in a slot or a RAM page (a slot's mind moves to RAM before it leaves)."""
        store = self.engine.store
        return any(s.mind == key for s in self.engine.slots) or (
            store is not None and store.has(key)
        )

    async def _read(self, key: str) -> ReadState:
        assert self.publisher is not None
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(
                None, read_state, self.publisher, key, self.engine.page_geometry
            )
        except FilesError as err:
            raise files_error(err, "read the mind back") from err

    def _own(self, key: str) -> bool:
        return self.owners is None or self.owners.own(key)

    # -- the demoter ------------------------------------------------------------------------

    def _demote_loop(self) -> None:
        reg = self.registry
        while not self._stop.is_set():
            reg.wake.wait(_DEMOTER_POLL_S)
            reg.wake.clear()
            if self._stop.is_set():
                return
            try:
                self._demote()
            except Exception as err:
                log.exception("the demoter failed; it retries")
                reg.counters.spill_failed_total += 1
                reg.room_error = f"the demoter failed ({type(err).__name__})"
            reg.n_demote_passes += 1
            self.engine.post(Nudge())

    def _demote(self) -> None:
        """Spill least recently used idle mind pages until the headroom is free."""
        store = self.engine.store
        assert store is not None
        reg = self.registry
        target = store.ceiling_bytes - self.engine.mind_slots.headroom_bytes()
        while store.charged_bytes > target and not self._stop.is_set():
            cached = [i for i in store.infos() if i.in_store and i.name.startswith(ANON_PREFIX)]
            if cached:  # the anonymous prompt cache gives way first: dropped, never spilled
                store.remove(max(cached, key=lambda i: i.age_s).name)
                continue
            with reg.lock:
                candidates = [
                    i.name
                    for i in store.infos()
                    if i.in_store and is_mind_key(i.name) and i.name not in reg.busy
                ]
            if not candidates:
                reg.room_error = "no idle mind page can be spilled to disk now"
                return
            if self.publisher is None:
                reg.room_error = "there is no disk tier to spill to (--slot-save-path)"
                return
            if not self._spill(store, reg.lru(candidates)[0], drop=True, bounded=True):
                return
        reg.room_error = ""

    def _spill(self, store: PageStore, key: str, *, drop: bool, bounded: bool) -> int:
        """Write mind `key`'s RAM page to disk; `drop` then frees it from RAM (unless a request
        holds the mind meanwhile). 1 when written, 0 when refused or failed."""
        assert self.publisher is not None
        reg = self.registry
        try:
            page = store.hold(key)
        except KvswapError:
            return 1  # paged in (or spilled) meanwhile
        try:
            if bounded and not self._disk_room(key, page.n_bytes):
                return 0
            with self._io:
                receipt = publish_state(self.publisher, key, page.buffer, page.layout)
            self._record_disk(key, receipt.n_bytes, page.layout.n_tokens)
            if drop:
                with reg.lock:
                    if key not in reg.busy:
                        store.remove(key, page.generation)
            reg.counters.spills_total += 1
            return 1
        except FilesError as err:
            reg.counters.spill_failed_total += 1
            reg.room_error = f"a spill to disk failed ({err})"
            log.error("mind %s could not be spilled: %s", key, err)
            return 0
        finally:
            store.release(page)

    def _record_disk(self, key: str, n_bytes: int, n_tokens: int) -> None:
        with self.registry.lock:
            self.registry.disk[key] = DiskCopy(n_bytes, n_tokens, time.time())

    def _disk_room(self, key: str, n_bytes: int) -> bool:
        """Room for `n_bytes` more on disk (the mind's own old copy is replaced)."""
        bound = self.policy.page_disk_bytes
        if bound is None:
            return True
        reg = self.registry
        assert self.publisher is not None
        with reg.lock:
            used = sum(c.n_bytes for k, c in reg.disk.items() if k != key)
            victims = reg.lru([k for k in reg.disk if k != key and k not in reg.busy])
        if used + n_bytes <= bound:
            return True
        if not self.policy.disk_drop_lru:
            reg.counters.disk_refused_total += 1
            reg.room_error = (
                f"the disk tier is full ({used} of --page-disk-bytes {bound} bytes; start with "
                "--page-disk-drop-lru to drop the least recently used spilled minds)"
            )
            log.warning("spill of mind %s refused: %s", key, reg.room_error)
            return False
        for victim in victims:
            if used + n_bytes <= bound:
                break
            with reg.lock:
                copy = reg.disk.pop(victim)
            self.publisher.remove(victim)
            used -= copy.n_bytes
            reg.counters.disk_dropped_total += 1
            log.warning(
                "disk tier full: dropped spilled mind %s (%d bytes, --page-disk-drop-lru)",
                victim,
                copy.n_bytes,
            )
        return used + n_bytes <= bound

    # -- /pages -----------------------------------------------------------------------------

    def disk_bytes(self) -> int:
        """The bytes of every mind's spilled copy: what `--page-disk-bytes` bounds."""
        with self.registry.lock:
            return sum(copy.n_bytes for copy in self.registry.disk.values())

    def views(self) -> list[MindView]:
        """Every mind this server serves, with its live tier."""
        reg = self.registry
        store = self.engine.store
        resident = {key: (slot_id, n) for key, slot_id, n in self.engine.snapshot.minds}
        ram = {
            i.name: (i.n_tokens, i.n_bytes)
            for i in (store.infos() if store is not None else [])
            if i.in_store and is_mind_key(i.name)
        }
        with reg.lock:
            disk = dict(reg.disk)
            last = dict(reg.last_used)
        out = []
        for key in sorted(set(resident) | set(ram) | set(disk)):
            namespace, name = split_key(key)
            copy = disk.get(key)
            if key in resident:
                slot_id, n_tokens = resident[key]
                tier, n_bytes = "slot", 0
            elif key in ram:
                slot_id, (n_tokens, n_bytes), tier = -1, ram[key], "ram"
            else:
                assert copy is not None
                slot_id, n_tokens, n_bytes, tier = -1, copy.n_tokens, copy.n_bytes, "disk"
            out.append(
                MindView(key, namespace, name, tier, slot_id, n_tokens, n_bytes,
                         last.get(key, 0.0), copy is not None)
            )  # fmt: skip
        return out


def _n_tokens(path: Path) -> int:
    """The token count in a sequence file's header, for /pages; 0 if unreadable.

    GGSQ, version, word count, then either the tokens or (packed, as kvswap writes) a -1
    marker, a packing version and the token count."""
    try:
        with open(path, "rb") as f:
            head = f.read(24)
    except OSError:
        return 0
    if len(head) < 24:
        return 0
    words = struct.unpack("<IIIiII", head)
    return int(words[5]) if words[3] == -1 else int(words[2])
