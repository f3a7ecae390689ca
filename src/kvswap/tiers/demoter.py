"""Minds between RAM and disk: the demoter thread, the disk budget, ownership, the minds a
restart finds, and the spill before exit.

- The demoter keeps `headroom` bytes free in the page store (a low watermark under
  `--page-ram-bytes`): it asks the engine's anonymous cache to shed first (`ShedCache`: the
  cache is the one owner of its eviction), then spills the least recently used idle mind pages
  to disk (crash-safe publication, off the engine thread) and drops them from RAM. Each pass
  ends with a `RoomReport` to the engine, which a mind switch waiting for room reads.
- `--page-disk-bytes` bounds the disk tier: when full, a spill is refused (a typed reason the
  waiting switch answers) unless `--page-disk-drop-lru` lets it drop the least recently used
  spilled minds (logged, counted).
- Ownership: a server owns each mind it serves through an exclusive lock file
  (`files.owners`), so two servers sharing a save path never serve one mind twice.
- `start()` lists the minds spilled under the save path and serves them (a mind survives a
  restart); `close()` (SIGTERM, sleep, normal exit) spills every resident mind and RAM page.

Owns the demoter thread and the ownership locks. File I/O happens here, on the demoter thread or
the closing thread, never on the engine thread or the event loop.
"""

from __future__ import annotations

import logging
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kvswap.core.errors import KvswapError
from kvswap.engine.client import PagesHandle
from kvswap.engine.commands import Answer, Captured, Command, FlushMinds, RoomReport, ShedCache
from kvswap.engine.kv.pagefmt import PageGeometry
from kvswap.engine.kv.pagestore import PageStore
from kvswap.engine.minds.registry import DiskCopy, is_mind_key
from kvswap.files import FilesError, Publisher
from kvswap.files.owners import OwnerLocks
from kvswap.tiers.slotfiles import publish_state

log = logging.getLogger("kvswap.demoter")

_POLL_S = 0.5  # the demoter also looks without being woken, this often
_ENGINE_TIMEOUT_S = 60.0  # how long a flush or a shed waits for the engine's answer


@dataclass(frozen=True)
class MindPolicy:
    """The minds' slice of the configuration."""

    page_disk_bytes: int | None = None  # --page-disk-bytes; None: no bound
    disk_drop_lru: bool = False  # --page-disk-drop-lru


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
    ) -> None:
        self.store = pages.store
        self.registry = pages.registry
        self.post = post
        self.publisher = publisher
        self.save_dir = save_dir
        self.policy = policy
        self.owners = OwnerLocks(save_dir) if save_dir is not None else None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._io = threading.Lock()  # one spill at a time: demoter and close never interleave
        self._n_passes = 0
        self._refused = ""  # why the last pass could not make room
        self._closed = False

    # -- lifecycle --------------------------------------------------------------------------

    def start(self, geometry: PageGeometry) -> None:
        """Serve the minds spilled under the save path, then start the demoter thread."""
        if self.publisher is not None:
            self._list_spilled(geometry)
        if self.store is not None:
            self._thread = threading.Thread(target=self._loop, name="kvswap-demoter", daemon=True)
            self._thread.start()

    def own(self, key: str) -> bool:
        """This server owns mind `key` (now or already); False: another server does."""
        return self.owners is None or self.owners.own(key)

    def _list_spilled(self, geometry: PageGeometry) -> None:
        assert self.publisher is not None and self.save_dir is not None
        fingerprint = geometry.file_fingerprint()
        n_served = 0
        for info in self.publisher.list_generations():
            if not is_mind_key(info.name):
                continue
            if info.fingerprint != fingerprint:
                log.warning(
                    "spilled mind %s was made by another model or KV type: not served", info.name
                )
                continue
            if not self.own(info.name):
                log.warning(
                    "spilled mind %s is served by another server: not served here", info.name
                )
                continue
            n_bytes = sum(f.n_bytes for f in info.files)
            n_tokens = _n_tokens(self.save_dir / info.name)
            self.registry.record_disk(info.name, DiskCopy(n_bytes, n_tokens, info.created_unix_s))
            self.registry.touch(info.name, when_unix_s=info.created_unix_s)
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
        self.registry.need_room()  # wakes the thread so it sees the stop
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
        minds_in_ram = [i.name for i in store.infos() if i.in_store and is_mind_key(i.name)]
        answer = Answer()
        self.post(FlushMinds(answer))
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
                cap.buffer.close()
            if captured or minds_in_ram:
                log.warning(
                    "no --slot-save-path: %d mind(s) are lost at exit",
                    len(captured) + len(minds_in_ram),
                )
            return
        n_spilled = sum(self._spill_captured(key, cap) for key, cap in captured)
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
            self.registry.count(spill_failed_total=1)
            log.error("mind %s could not be spilled: %s", key, err)
            return 0
        finally:
            cap.buffer.close()

    # -- the demoter thread -----------------------------------------------------------------

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.registry.wait_for_work(_POLL_S)
            if self._stop.is_set():
                return
            try:
                self._demote()
            except Exception as err:
                log.exception("the demoter failed; it retries")
                self.registry.count(spill_failed_total=1)
                self._refused = f"the demoter failed ({type(err).__name__})"
            self._n_passes += 1
            self.post(RoomReport(self._n_passes, self._refused))

    def _demote(self) -> None:
        """Shed the anonymous cache, then spill least recently used idle mind pages, until the
        headroom is free."""
        store = self.store
        assert store is not None
        reg = self.registry
        target = store.ceiling_bytes - reg.headroom_bytes(store.ceiling_bytes)
        shed = True
        while store.charged_bytes > target and not self._stop.is_set():
            if shed and self._shed(store.charged_bytes - target) > 0:
                continue  # the anonymous prompt cache gives way first: dropped, never spilled
            shed = False
            in_ram = [i.name for i in store.infos() if i.in_store and is_mind_key(i.name)]
            candidates = reg.idle(in_ram)
            if not candidates:
                self._refused = "no idle mind page can be spilled to disk now"
                return
            if self.publisher is None:
                self._refused = "there is no disk tier to spill to (--slot-save-path)"
                return
            if not self._spill(store, candidates[0], drop=True, bounded=True):
                return
        self._refused = ""

    def _shed(self, n_bytes: int) -> int:
        """Ask the anonymous cache (on the engine thread) to drop `n_bytes`; bytes it freed."""
        answer = Answer()
        self.post(ShedCache(n_bytes, answer))
        if not answer.wait(_ENGINE_TIMEOUT_S) or not isinstance(answer.value, int):
            return 0
        return answer.value

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
                reg.drop_if_idle(key, lambda: store.remove(key, page.generation))
            reg.count(spills_total=1)
            return 1
        except FilesError as err:
            reg.count(spill_failed_total=1)
            self._refused = f"a spill to disk failed ({err})"
            log.error("mind %s could not be spilled: %s", key, err)
            return 0
        finally:
            store.release(page)

    def _record_disk(self, key: str, n_bytes: int, n_tokens: int) -> None:
        self.registry.record_disk(key, DiskCopy(n_bytes, n_tokens, time.time()))

    def _disk_room(self, key: str, n_bytes: int) -> bool:
        """Room for `n_bytes` more on disk (the mind's own old copy is replaced)."""
        bound = self.policy.page_disk_bytes
        if bound is None:
            return True
        reg = self.registry
        assert self.publisher is not None
        copies = reg.disk_copies()
        used = sum(c.n_bytes for k, c in copies.items() if k != key)
        if used + n_bytes <= bound:
            return True
        if not self.policy.disk_drop_lru:
            reg.count(disk_refused_total=1)
            self._refused = (
                f"the disk tier is full ({used} of --page-disk-bytes {bound} bytes; start with "
                "--page-disk-drop-lru to drop the least recently used spilled minds)"
            )
            log.warning("spill of mind %s refused: %s", key, self._refused)
            return False
        for victim in reg.idle(k for k in copies if k != key):
            if used + n_bytes <= bound:
                break
            copy = reg.forget_disk(victim)
            if copy is None:
                continue
            self.publisher.remove(victim)
            used -= copy.n_bytes
            reg.count(disk_dropped_total=1)
            log.warning(
                "disk tier full: dropped spilled mind %s (%d bytes, --page-disk-drop-lru)",
                victim,
                copy.n_bytes,
            )
        return used + n_bytes <= bound


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
