"""A mind's copies on this replica (slot, RAM page, disk) as the shared tier sees them: one copy
of its latest state to publish, and forgetting them all once another replica owns the mind.

`copy(key)` finds the mind where it lives now:
- in a slot: the engine copies the slot's state out (`FlushMinds` for that mind: one memcpy on
  the engine thread; the slot keeps its state); a slot busy with a turn gives nothing (its turn
  publishes when it ends);
- as a RAM page: the page itself, held while it is published (pages are never mutated);
- on disk only: its committed generation, read and verified, packed into one page buffer.

`forget(key)` frees the mind's slot and RAM page (`ForgetMind`, on the engine thread) and
removes its spilled files through the demoter's `forget` (under its spill lock, so no copy taken
before is written after, and no scheduled flush writes the mind again). Called from worker threads only (it waits for the engine and does
file I/O); never from the engine thread or the event loop.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from kvswap.core.errors import KvswapError
from kvswap.core.keys import PageKey
from kvswap.core.page import PageGeometry, PageLayout, SlotState, plan_layout, write_tokens
from kvswap.core.restream import RestreamError, find_stream, stream_count
from kvswap.core.vocab import MindTier
from kvswap.engine.commands import Answer, Captured, Command, FlushMinds, ForgetMind
from kvswap.engine.handle import PagesHandle
from kvswap.files import FilesError, Publisher
from kvswap.tiers.mindfiles import file_name
from kvswap.tiers.slotfiles import read_state

log = logging.getLogger("kvswap.shared")

ENGINE_TIMEOUT_S = 60.0  # how long a copy or a forget waits for the engine's answer


@dataclass
class PageCopy:
    """A mind's state laid out as a page, and how to let it go."""

    view: memoryview
    layout: PageLayout
    source: MindTier  # where the copy was taken from
    release: Callable[[], None]

    def close(self) -> None:
        self.view.release()
        self.release()


class LocalMinds:
    """See the module docstring."""

    def __init__(
        self,
        *,
        post: Callable[[Command], None],
        pages: PagesHandle,
        publisher: Publisher | None,
        geometry: Callable[[], PageGeometry],
        forget_files: Callable[[PageKey], None],
    ) -> None:
        self.post = post
        self.forget_files = forget_files
        self.store = pages.store
        self.registry = pages.registry
        self.publisher = publisher
        self.geometry = geometry

    def _ask(self, make: Callable[[Answer], Command], what: str) -> object:
        """Post a command and wait for its answer (TimeoutError, or its KvswapError)."""
        answer = Answer()
        self.post(make(answer))
        if not answer.wait(ENGINE_TIMEOUT_S):
            raise TimeoutError(f"the engine did not answer {what} in {ENGINE_TIMEOUT_S:.0f} s")
        if isinstance(answer.value, KvswapError):
            raise answer.value
        return answer.value

    def copy(self, key: PageKey) -> PageCopy | None:
        """The mind's latest state here, or None (busy in a slot, or held nowhere)."""
        captured = self._ask(lambda a: FlushMinds(a, keys=frozenset({key})), "a copy")
        assert isinstance(captured, list)
        if captured:
            (_, cap), *rest = captured
            assert not rest and isinstance(cap, Captured)
            buffer = cap.buffer
            return PageCopy(
                memoryview(buffer)[: cap.layout.n_bytes], cap.layout, MindTier.SLOT, buffer.close
            )
        if self.registry.resident_slot(key) is not None:
            return None  # in a slot that a turn holds
        store = self.store
        if store is not None and store.has(key):
            try:
                page = store.hold(key)
            except KvswapError:
                pass  # paged in or dropped meanwhile
            else:
                return PageCopy(page.view(), page.layout, MindTier.RAM, lambda: store.release(page))
        if self.publisher is not None and self.registry.disk_copy(key) is not None:
            return self._from_disk(key)
        return None

    def _from_disk(self, key: PageKey) -> PageCopy | None:
        assert self.publisher is not None
        try:
            read = read_state(self.publisher, file_name(key), self.geometry())
        except (FilesError, KvswapError) as err:
            log.warning("%s: its disk copy cannot be read to publish it: %s", key, err)
            return None
        try:
            buffer, layout = pack(read.state, self.geometry())
        finally:
            read.close()
        return PageCopy(memoryview(buffer), layout, MindTier.DISK, lambda: None)

    def forget(self, key: PageKey) -> bool:
        """Drop every copy of the mind here; False when its slot is busy (nothing dropped)."""
        if not self._ask(lambda a: ForgetMind(key, a), "a forget"):
            return False
        try:
            self.forget_files(key)
        except FilesError as err:
            log.error("%s: its disk copy could not be removed: %s", key, err)
        return True

    def has(self, key: PageKey) -> bool:
        """Some copy of the mind lives here."""
        store = self.store
        return (
            self.registry.resident_slot(key) is not None
            or (store is not None and store.has(key))
            or self.registry.disk_copy(key) is not None
        )


def pack(state: SlotState, geometry: PageGeometry) -> tuple[bytearray, PageLayout]:
    """A state read from files, copied into one buffer laid out as a page."""
    checkpoints = tuple(
        (c.n_tokens, c.pos_min, c.pos_max, c.data.nbytes) for c in state.checkpoints
    )
    stream = state.stream
    if stream is None:
        try:
            stream = find_stream(state.target, stream_count(state.target))
        except RestreamError:
            stream = 0  # not a plain KV state: its stream header is loaded as it is
    layout = plan_layout(
        len(state.tokens),
        state.target.nbytes,
        geometry,
        draft_bytes=state.draft.nbytes if state.draft is not None else None,
        checkpoints=checkpoints,
        stream=stream,
        draft_n_tokens=state.draft_n_tokens,
    )
    layout = replace(layout, lora=state.lora)
    buffer = bytearray(layout.n_bytes)
    view = memoryview(buffer)
    write_tokens(view, layout, np.asarray(state.tokens, dtype=np.int32))
    view[layout.target.offset : layout.target.end] = state.target
    if layout.draft is not None and state.draft is not None:
        view[layout.draft.offset : layout.draft.end] = state.draft
    for span, ckpt in zip(layout.checkpoints, state.checkpoints, strict=True):
        view[span.span.offset : span.span.end] = ckpt.data
    view.release()
    return buffer, layout
