"""The one writer and reader of slot files and page files (SPEC §4), on worker threads.

A captured slot and a page share one layout (`pagefmt.PageLayout`), so `save` and `spill`
write through `publish_state` and `restore` reads through `read_state`: `F` in libllama's
sequence-file format straight from the RAM bytes (no copy), sidecars for the parts libllama's
file has no room for, and the commit record with the model and KV-type fingerprint.

Never called on the engine thread or the event loop: callers run these in the I/O executor.
Buffers given to `publish_state` are not referenced once it returns, even when it raises, so the
caller can close them.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass
from typing import Any

from kvswap.engine.pagefmt import PageGeometry, PageLayout, read_tokens
from kvswap.engine.slotstate import SlotState
from kvswap.engine.types import ErrorKind, KvswapError
from kvswap.files import FilesError, Generation, Publisher, PublishReceipt
from kvswap.files.seqfile import file_parts

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


def publish_state(
    publisher: Publisher, filename: str, buffer: Buffer, layout: PageLayout
) -> PublishReceipt:
    """Write one generation of `filename` from a captured slot or a page (`buffer` laid out by
    `layout`); no view of `buffer` outlives the call."""
    view = memoryview(buffer)[: layout.n_bytes]
    tokens = read_tokens(view, layout)
    t = layout.target
    files = {"": file_parts(tokens, view[t.offset : t.end])}
    try:
        return publisher.publish(filename, files, layout.geometry.file_fingerprint())
    except BaseException as err:
        drop_frames(err)
        raise
    finally:
        del files
        view.release()


@dataclass
class ReadState:
    """A generation read back: the state to apply, and the buffers to close afterwards."""

    state: SlotState
    generation: Generation
    n_bytes_read: int

    def close(self) -> None:
        self.state.target.release()
        self.generation.close()


def read_state(publisher: Publisher, filename: str, geometry: PageGeometry) -> ReadState:
    """Read and verify one generation of `filename` (a foreign file has no fingerprint)."""
    gen = publisher.read_generation(filename, geometry.file_fingerprint())
    state = SlotState(tokens=gen.tokens.copy(), target=gen.state[:])
    return ReadState(state, gen, gen.n_bytes_read)
