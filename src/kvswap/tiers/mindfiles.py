"""Minds on disk: their own folder of the save path, their file names, what a file says without
being read (the model it was made with, its token count, its tokens), and the one-time move of the minds
an earlier version kept among the slot files.

Every mind's generations live in `<save>/.kvswap-minds/` (published crash-safely by a
`Publisher` of their own), named `<namespace>~<the mind's name in hex>`. A request's `filename`
(save, restore, spill) can never name that folder or anything in it: slot file names have no
`/` and may not start with `.kvswap` (`files.names`), so no request reaches a mind's files, by
construction; and a restart lists exactly the minds, nothing a client saved.

Earlier versions kept a mind among the slot files as `mind~<namespace>~<hex>`, where a client's
`save` could overwrite it. `migrate` moves each such generation once into the minds' folder
(read and verified, published there, then removed), and logs what it moved.

Worker threads only (the loader's at start, the I/O executor for a GET /minds/{name}): never the
engine thread or the event loop.
"""

from __future__ import annotations

import logging
import struct
from pathlib import Path
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from kvswap.core.keys import PageKey, PageKind
from kvswap.files import FilesError, OsAdapter, Publisher, sidecar
from kvswap.files.seqfile import FIXED_HEADER_BYTES, file_parts, parse_fixed_header, parse_words

log = logging.getLogger("kvswap.minds")

MINDS_DIR: Final = ".kvswap-minds"
HEAD_BYTES: Final = 24  # what `n_tokens_of` reads of a mind's sequence file
_OLD_PREFIX: Final = "mind~"
_FILE_BYTES_UNKNOWN: Final = 1 << 62  # the header's own check of the file's size is skipped


def file_name(key: PageKey) -> str:
    """The file of mind `key` in the minds' folder."""
    assert key.kind is PageKind.MIND
    return f"{key.namespace}~{key.name.encode('utf-8').hex()}"


def key_of(name: str) -> PageKey | None:
    """The mind a file of the minds' folder holds; None for any other name."""
    namespace, sep, hex_name = name.partition("~")
    if not sep or not namespace:
        return None
    try:
        return PageKey(PageKind.MIND, namespace, bytes.fromhex(hex_name).decode("utf-8"))
    except ValueError:
        return None


def made_with(theirs: str, ours: str) -> str:
    """What differs between a file's fingerprint and this server's (`model[;rope=..];k=..;v=..`:
    `PageGeometry.file_fingerprint`)."""
    their_model, their_parts = _fingerprint_parts(theirs)
    our_model, our_parts = _fingerprint_parts(ours)
    if their_model != our_model:
        return "another model"
    their_rope, our_rope = their_parts.get("rope", ""), our_parts.get("rope", "")
    if their_rope != our_rope:
        return (
            f"the RoPE setting {their_rope or 'the model sets'} (this server: "
            f"{our_rope or 'the model sets'}; -c and the --rope-* flags choose it)"
        )
    return f"KV types {their_parts.get('k', '?')}/{their_parts.get('v', '?')}"


def _fingerprint_parts(fingerprint: str) -> tuple[str, dict[str, str]]:
    model, *parts = fingerprint.split(";")
    return model, dict(part.split("=", 1) for part in parts if "=" in part)


def n_tokens_of(head: bytes) -> int:
    """The token count in a sequence file's header (its first `HEAD_BYTES`), for /pages; 0 if
    unreadable.

    GGSQ, version, word count, then either the tokens or (packed, as kvswap writes) a -1
    marker, a packing version and the token count."""
    if len(head) < HEAD_BYTES:
        return 0
    words = struct.unpack("<IIIiII", head[:HEAD_BYTES])
    return int(words[5]) if words[3] == -1 else int(words[2])


def tokens_on_disk(minds: Publisher, key: PageKey) -> npt.NDArray[np.int32]:
    """The tokens of mind `key`'s spilled file, its header read without its state (GET
    /minds/{name} of a mind on disk only); FilesError when it has none, or a damaged one."""
    name = file_name(key)
    n_words = parse_fixed_header(minds.read_head(name, FIXED_HEADER_BYTES), _FILE_BYTES_UNKNOWN)
    head = minds.read_head(name, FIXED_HEADER_BYTES + 4 * n_words)
    tokens, _ = parse_words(head[FIXED_HEADER_BYTES:])
    return tokens.copy()


def open_minds(save_dir: Path, seam: OsAdapter | None = None) -> Publisher:
    """The publisher of the minds' folder (created on first use); `seam`: the crash tests'."""
    folder = save_dir / MINDS_DIR
    folder.mkdir(mode=0o700, exist_ok=True)
    return Publisher(folder, seam)


def migrate(slot_files: Publisher, minds: Publisher) -> int:
    """Move every mind an earlier version left among the slot files into the minds' folder;
    the number moved. A generation that cannot be read stays where it is (logged)."""
    n_moved = 0
    for info in slot_files.list_generations():
        if not info.name.startswith(_OLD_PREFIX):
            continue
        new_name = info.name[len(_OLD_PREFIX) :]
        if key_of(new_name) is None:
            continue
        try:
            _copy(slot_files, minds, info.name, new_name, info.fingerprint)
            slot_files.remove(info.name)
        except FilesError as err:
            log.error("mind file %s could not be moved into %s: %s", info.name, MINDS_DIR, err)
            continue
        n_moved += 1
    if n_moved:
        log.warning(
            "moved %d mind(s) from their old names among the slot files into %s (once: slot "
            "files no longer share a folder with minds)",
            n_moved,
            MINDS_DIR,
        )
    return n_moved


def _copy(src: Publisher, dst: Publisher, name: str, new_name: str, fingerprint: str) -> None:
    """Publish generation `name` of `src` as `new_name` of `dst`, byte for byte (a sidecar
    that does not verify is left out: that part restores cold, as it would have)."""
    with src.read_generation(name, fingerprint) as gen:
        files: dict[str, Any] = {"": file_parts(gen.tokens, gen.state)}
        for suffix, read in gen.sidecars.items():
            if read.status == "ok" and read.sidecar is not None:
                files[suffix] = sidecar.encode(suffix, read.sidecar.header, read.sidecar.sections)
        try:
            dst.publish(new_name, files, fingerprint)
        finally:
            del files
