"""The one writer and reader of slot files and page files, on worker threads.

A captured slot and a page share one layout (`core.page.PageLayout`), so `save` and `spill`
write through `publish_state` and `restore` reads through `read_state`: `F` in libllama's
sequence-file format straight from the RAM bytes (no copy), sidecars for the parts libllama's
file has no room for (`.ckpt` checkpoints, `.lora` the LoRA set), and the commit record with the
model and KV-type fingerprint. A `.ckpt` that cannot be read restores cold; a `.lora` that cannot
be read refuses the restore (typed 400): the KV must never be served under a set it was not
computed under. No `.lora` (a file saved without adapters, or by llama-server) means no adapters.

Never called on the engine thread or the event loop: callers run these in the I/O executor.
Buffers given to `publish_state` are not referenced once it returns, even when it raises, so the
caller can close them. Given the page store, `read_state` reads into buffers off its shelf of
freed ones (no page faults: a mind read back from the page cache costs its copy and its
checksum) and hands every buffer it read into back to the shelf when the state is closed.
"""

from __future__ import annotations

import logging
import mmap
import traceback
from dataclasses import dataclass, field
from typing import Any

import psutil

from kvswap.core.errors import ErrorKind, KvswapError
from kvswap.core.keys import spare_key
from kvswap.core.page import (
    CheckpointView,
    LoraRef,
    PageGeometry,
    PageLayout,
    SlotState,
    read_tokens,
)
from kvswap.engine.kv.pagestore import PageStore
from kvswap.files import FilesError, Generation, Publisher, PublishReceipt, SidecarRead, sidecar
from kvswap.files.mapping import new_buffer
from kvswap.files.publish import InPlace
from kvswap.files.seqfile import PAGE_IN_FILE, STATE_PREFIX_BYTES, encode_header, file_parts

log = logging.getLogger("kvswap.files")

Buffer = Any  # an mmap or anything else with the buffer protocol

_FILES_KINDS = {
    "invalid": ErrorKind.INVALID_REQUEST,
    "not_found": ErrorKind.NOT_FOUND,
    "corrupt": ErrorKind.INVALID_REQUEST,
    "io": ErrorKind.SERVER,
}


def files_error(err: FilesError, verb: str) -> KvswapError:
    return KvswapError(_FILES_KINDS[err.kind], f"Unable to {verb}: {err}")


def drop_frames(err: BaseException | None) -> None:
    """Clear the locals of the frames an exception (and its causes) carries, so the views of
    a buffer they held die now rather than whenever the exception does."""
    while err is not None:
        traceback.clear_frames(err.__traceback__)
        err = err.__cause__ or err.__context__


CKPT_FORMAT = (
    1  # the .ckpt sidecar's header: {"format", "checkpoints": [{n_tokens, pos_min, pos_max}]}
)
DFT_FORMAT = 1  # the .dft sidecar's header: {"format", "n_tokens"}; one section, the state


LORA_FORMAT = 1  # the .lora sidecar's header: {"format", "adapters": [{sha256, path, scale}]}


def _files(view: memoryview, layout: PageLayout) -> dict[str, Any]:
    """`F` and the sidecars of one generation, as buffers over `view` (no copy)."""
    t = layout.target
    files: dict[str, Any] = {"": file_parts(read_tokens(view, layout), view[t.offset : t.end])}
    return files | _sidecars(view, layout)


def _sidecars(view: memoryview, layout: PageLayout) -> dict[str, Any]:
    """The sidecars of one generation, as buffers over `view` (no copy)."""
    files: dict[str, Any] = {}
    if layout.checkpoints:
        header = {
            "format": CKPT_FORMAT,
            "checkpoints": [
                {"n_tokens": c.n_tokens, "pos_min": c.pos_min, "pos_max": c.pos_max}
                for c in layout.checkpoints
            ],
        }
        sections = [view[c.span.offset : c.span.end] for c in layout.checkpoints]
        files[".ckpt"] = sidecar.encode(".ckpt", header, sections)
    if layout.lora:
        adapters = [{"sha256": r.sha256, "path": r.path, "scale": r.scale} for r in layout.lora]
        files[".lora"] = sidecar.encode(".lora", {"format": LORA_FORMAT, "adapters": adapters}, [])
    d = layout.draft
    if d is not None:
        dft_header = {"format": DFT_FORMAT, "n_tokens": layout.draft_n_tokens}
        files[".dft"] = sidecar.encode(".dft", dft_header, [view[d.offset : d.end]])
    return files


def publish_state(
    publisher: Publisher, filename: str, buffer: Buffer, layout: PageLayout
) -> PublishReceipt:
    """Write one generation of `filename` from a captured slot or a page (`buffer` laid out by
    `layout`); no view of `buffer` outlives the call."""
    view = memoryview(buffer)[: layout.n_bytes]
    files = _files(view, layout)
    try:
        return publisher.publish(filename, files, layout.geometry.file_fingerprint())
    except BaseException as err:
        drop_frames(err)
        raise
    finally:
        del files
        view.release()


def open_in_place(publisher: Publisher, filename: str, layout: PageLayout) -> InPlace:
    """A generation of `filename` to be written in place from a slot (`publish_in_place`):
    its staged `F`, mapped with room for a page laid out by `layout` from `PAGE_IN_FILE` on
    (`page_of`), so that a slot's capture puts its target state's payload where F's goes and
    nothing is copied again; its disk blocks are allocated now (a full disk is refused here)."""
    return publisher.open_in_place(filename, PAGE_IN_FILE + layout.n_bytes)


def page_of(staged: InPlace) -> memoryview:
    """Where a slot's capture goes in a generation opened in place (the caller releases it)."""
    return memoryview(staged.buffer)[PAGE_IN_FILE:]


def publish_in_place(publisher: Publisher, staged: InPlace, layout: PageLayout) -> PublishReceipt:
    """Publish a generation opened in place whose page (`page_of`) holds a capture laid out by
    `layout`: F's header is written over the tokens and the state's prefix, the draft state and
    checkpoints past F's end go to their sidecars, and F is cut where its state ends."""
    n_f = PAGE_IN_FILE + layout.target.end

    def sidecars(view: memoryview) -> dict[str, Any]:
        page = view[PAGE_IN_FILE:]
        files = _sidecars(page, layout)  # (read before F's header covers the tokens)
        header = encode_header(read_tokens(page, layout))
        assert len(header) == PAGE_IN_FILE + layout.target.offset + STATE_PREFIX_BYTES
        view[: len(header)] = header
        return files

    try:
        return publisher.publish_in_place(staged, n_f, sidecars, layout.geometry.file_fingerprint())
    except BaseException as err:
        drop_frames(err)
        raise


READ_KEY = spare_key("disk-read")  # a read's buffers taken off the store's shelf


@dataclass
class ReadBuffers:
    """The buffers one read took: off the page store's shelf when one fits (faulted in
    already), else mapped fresh; offered back to the shelf once the state is applied. While a
    read holds them they are not charged to the store, as a read's buffers never were (they
    are the I/O's, for the moment of a restore): a tight store keeps its room for the switch's
    own page."""

    store: PageStore | None
    taken: list[mmap.mmap] = field(default_factory=list)

    def get(self, n_bytes: int) -> memoryview:
        store = self.store
        got = store.take_shelved(READ_KEY, n_bytes) if store is not None else None
        if store is not None and got is not None:
            buffer, res = got
            store.cancel(res)
        else:
            buffer = new_buffer(n_bytes)  # faulted in ahead: a read faults no page
        self.taken.append(buffer)
        return memoryview(buffer)

    def give_back(self) -> None:
        """Every view of the buffers is released: shelve them (or close them)."""
        taken, self.taken = self.taken, []
        for buffer in taken:
            if self.store is not None:
                self.store.shelve(buffer, None)
            else:
                buffer.close()


@dataclass
class ReadState:
    """A generation read back: the state to apply, and the buffers to let go afterwards."""

    state: SlotState
    generation: Generation
    n_bytes_read: int
    buffers: ReadBuffers | None = None

    def close(self) -> None:
        self.state.release()
        self.generation.close()
        if self.buffers is not None:
            self.buffers.give_back()


def readable_bytes() -> int:
    """The largest generation a restore reads: half the memory available now. A larger file
    (a sparse 64 GiB file planted in the save path, say) is a typed 400 before any buffer is
    allocated, not an allocation that fails with a 500 or succeeds and starves the machine."""
    return int(psutil.virtual_memory().available) // 2


def read_state(
    publisher: Publisher,
    filename: str,
    geometry: PageGeometry,
    store: PageStore | None = None,
    *,
    mapped: bool = False,
) -> ReadState:
    """Read and verify one generation of `filename` (a foreign file has no fingerprint), into
    buffers off `store`'s shelf when given (`ReadBuffers`); `mapped`: its state a view of the
    file mapped instead (`files.mapping`: a folder whose names only kvswap writes).

    A missing, torn or malformed sidecar restores that part cold, with a warning.
    """
    buffers = ReadBuffers(store) if store is not None else None
    try:
        gen = publisher.read_generation(
            filename,
            geometry.file_fingerprint(),
            alloc=buffers.get if buffers is not None else None,
            max_bytes=readable_bytes(),
            mapped=mapped,
        )
    except BaseException as err:
        drop_frames(err)  # (a traceback's frames would keep views of the buffers alive)
        if buffers is not None:
            buffers.give_back()
        raise
    try:
        lora = _lora(filename, gen.sidecars.get(".lora"))
    except KvswapError:
        gen.close()
        if buffers is not None:
            buffers.give_back()
        raise

    checkpoints = _checkpoints(filename, gen.sidecars.get(".ckpt"))
    draft, draft_n_tokens = _draft(filename, gen.sidecars.get(".dft"), len(gen.tokens))
    state = SlotState(
        tokens=gen.tokens.copy(),
        target=gen.state[:],
        draft=draft,
        draft_n_tokens=draft_n_tokens,
        checkpoints=checkpoints,
        lora=lora,
    )

    return ReadState(state, gen, gen.n_bytes_read, buffers)


def _lora(filename: str, read: SidecarRead | None) -> tuple[LoraRef, ...]:
    if read is None or read.status == "absent":
        return ()
    try:
        if read.status != "ok" or read.sidecar is None:
            raise ValueError(f"{read.status}: {read.reason}")
        header = read.sidecar.header
        if header.get("format") != LORA_FORMAT:
            raise ValueError(f"format {header.get('format')!r}")
        return tuple(
            LoraRef(str(a["sha256"]), str(a["path"]), float(a["scale"])) for a in header["adapters"]
        )
    except (KeyError, TypeError, ValueError) as err:
        raise KvswapError(
            ErrorKind.INVALID_REQUEST,
            f"Unable to restore slot: {filename}.lora, the LoRA set its KV was computed under, "
            f"cannot be read ({err})",
        ) from err


def _draft(filename: str, read: SidecarRead | None, n_tokens: int) -> tuple[memoryview | None, int]:
    """The draft state of a generation and how many tokens it holds; (None, 0): cold draft."""
    if read is None or read.status == "absent":
        return None, 0
    if read.status != "ok" or read.sidecar is None:
        log.warning(
            "%s.dft %s (%s): restoring with a cold draft", filename, read.status, read.reason
        )
        return None, 0
    header, sections = read.sidecar.header, read.sidecar.sections
    try:
        n = int(header["n_tokens"])
        if header.get("format") != DFT_FORMAT or len(sections) != 1 or not 0 < n <= n_tokens:
            raise ValueError("header does not match its section or the tokens")
    except (KeyError, TypeError, ValueError) as err:
        log.warning("%s.dft is malformed (%s): restoring with a cold draft", filename, err)
        return None, 0
    return sections[0], n


def _checkpoints(filename: str, read: SidecarRead | None) -> tuple[CheckpointView, ...]:
    if read is None or read.status == "absent":
        return ()
    if read.status != "ok" or read.sidecar is None:
        log.warning(
            "%s.ckpt %s (%s): restoring without context checkpoints",
            filename,
            read.status,
            read.reason,
        )
        return ()
    header, sections = read.sidecar.header, read.sidecar.sections
    try:
        if header.get("format") != CKPT_FORMAT or len(header["checkpoints"]) != len(sections):
            raise ValueError("header does not match its sections")
        return tuple(
            CheckpointView(int(c["n_tokens"]), int(c["pos_min"]), int(c["pos_max"]), data)
            for c, data in zip(header["checkpoints"], sections, strict=True)
        )
    except (KeyError, TypeError, ValueError) as err:
        log.warning(
            "%s.ckpt is malformed (%s): restoring without context checkpoints", filename, err
        )
        return ()
