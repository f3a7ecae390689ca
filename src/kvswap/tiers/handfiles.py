"""The demoter's side of the engine's hand-offs (`engine.seats.handoffs`): the files of the
minds that leave their slot straight for disk, with no copy in memory.

For each job the engine's hand-offs give (`Handoffs.take`), on the demoter thread:
- a file wanted for a mind: none is opened when the mind's disk copy is current already
  (written behind, unchanged since: the slot is freed at once), nor when the disk tier has no
  room for it (refused, or, with `--page-disk-drop-lru`, the mind dropped instead); else its
  next generation is opened in place, its blocks allocated (a full disk refuses here, typed,
  every earlier file kept) and its mapping handed to the engine to fill;
- a file filled: published as a spill is (crash-safe; a SIGKILL in the middle loses nothing
  but this generation), and recorded as the mind's disk copy; a mind a slot verb ended since is
  not written;
- a file whose hand-off ended (a slot verb ended the mind, or it outgrew the file): dropped.

Owns nothing between jobs but the last refusal (`refused`, which the demoter's pass reports).
"""

from __future__ import annotations

import logging
import threading
from typing import Protocol

from kvswap.core.keys import PageKey
from kvswap.core.page import PageLayout
from kvswap.engine.seats.handoffs import FileFilled, FileWanted, Handed, Handoffs, Job
from kvswap.engine.seats.registry import MindRegistry
from kvswap.files import FilesError, Publisher
from kvswap.files.publish import InPlace
from kvswap.tiers.diskbudget import DiskBudget
from kvswap.tiers.mindfiles import file_name
from kvswap.tiers.slotfiles import open_in_place, publish_in_place

log = logging.getLogger("kvswap.demoter")


class DemoterParts(Protocol):
    """What of the demoter the hand-offs' files share: its hand-offs and registry, its lock
    on writes, and its view of the disk copies."""

    handoffs: Handoffs
    registry: MindRegistry
    io: threading.Lock

    def is_current(self, key: PageKey) -> bool: ...

    def record_disk(self, key: PageKey, n_bytes: int, n_tokens: int) -> None: ...


def _nothing() -> None:
    """A dropped hand-off frees nothing here: the engine clears its slot."""


class HandoffFiles:
    """See the module docstring. Demoter thread (and the closing thread, once it stopped)."""

    def __init__(self, demoter: DemoterParts, publisher: Publisher, disk: DiskBudget) -> None:
        self.handoffs = demoter.handoffs
        self.registry = demoter.registry
        self.publisher = publisher
        self.disk = disk
        self._io = demoter.io  # one write at a time, the demoter's spills included
        self._is_current = demoter.is_current
        self._record_disk = demoter.record_disk
        self.refused = ""  # why the last file wanted was refused ("" none, or a quiet one)

    def run(self, job: Job) -> None:
        what = job.what
        if isinstance(what, InPlace):
            self.publisher.cancel_in_place(what)
        elif job.key is not None and isinstance(what, FileWanted):
            self._open(job.key, what.layout)
        elif job.key is not None and isinstance(what, FileFilled):
            self._publish(job.key, what, job.t_asked)

    def _open(self, key: PageKey, layout: PageLayout) -> None:
        handoffs = self.handoffs
        if self._is_current(key):
            handoffs.done(key, Handed.WRITTEN)  # its file holds this very state already
            return
        refusal = self.disk.room(key, layout.n_bytes, True)
        if refusal is not None:
            handed, self.refused = Handed.REFUSED, refusal
            if self.disk.give_way(key, _nothing, "its slot"):  # (the engine clears it)
                handed, self.refused = Handed.DROPPED, ""
            handoffs.done(key, handed)
            return
        try:
            with self._io:
                staged = open_in_place(self.publisher, file_name(key), layout)
        except FilesError as err:
            self._failed(key, err)
            return
        if not handoffs.opened(key, staged):  # its hand-off ended meanwhile
            self.publisher.cancel_in_place(staged)

    def _publish(self, key: PageKey, filled: FileFilled, t_asked: float) -> None:
        try:
            with self._io:
                if self.registry.forgotten_after(key, t_asked):
                    self.publisher.cancel_in_place(filled.staged)
                    return  # (its hand-off ended with it)
                receipt = publish_in_place(self.publisher, filled.staged, filled.layout)
        except FilesError as err:
            self._failed(key, err)
            return
        self._record_disk(key, receipt.n_bytes, filled.layout.n_tokens)
        self.registry.count(spills_total=1)
        self.handoffs.done(key, Handed.WRITTEN)

    def _failed(self, key: PageKey, err: FilesError) -> None:
        self.registry.count(spill_failed_total=1)
        log.error("mind %s could not be written to disk: %s", key, err)
        self.refused = f"a write to disk failed ({err})"
        self.handoffs.done(key, Handed.REFUSED)
