"""Codec of the sidecars `F.ckpt` (context checkpoints), `F.dft` (draft state), `F.lora` (LoRA set).

Layout (little-endian), one container for all three kinds:

    offset  size
    0       4     magic: b"KVCK" (.ckpt), b"KVDF" (.dft), b"KVLR" (.lora)
    4       4     u32 format version (1)
    8       4     u32 header_bytes: length of the JSON header
    12      4     u32 n_sections
    16      8*n   u64 length of each section
    ..      H     JSON header (UTF-8 object): whatever the caller passes (checkpoint positions,
                  adapter hashes, ...)
    ..      ...   the sections, back to back, as the caller gave them
    end-8   4     u32 CRC-32 of every byte before it
    end-4   4     b"KVND" end marker

The sizes are checked against the file length before anything is read, so a truncated or
extended file is refused without trusting a length field; the CRC then covers the header and the
sections. Sections are written zero-copy (the returned parts view the caller's buffers) and read
zero-copy (the returned sections view the caller's buffer).

Owns the byte layout; pure functions, no I/O, any thread. Does not know what the sections mean:
the engine encodes checkpoints, draft states and adapter lists into them.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from kvswap.files import checksum
from kvswap.files.errors import CorruptFileError
from kvswap.files.types import Buffer, Suffix

FORMAT_VERSION: Final = 1
MAGIC: Final[dict[Suffix, bytes]] = {".ckpt": b"KVCK", ".dft": b"KVDF", ".lora": b"KVLR"}
END_MARKER: Final = b"KVND"
MAX_HEADER_BYTES: Final = 16 << 20
MAX_SECTIONS: Final = 1 << 16

_FIXED = struct.Struct("<4sIII")
_TRAILER = struct.Struct("<I4s")
TRAILER_BYTES: Final = _TRAILER.size


@dataclass(frozen=True)
class EncodedFile:
    """The buffers of one file, its size, and the CRC-32 of the whole file (trailer included)."""

    parts: list[Buffer]
    n_bytes: int
    crc32: int


@dataclass(frozen=True)
class Sidecar:
    """A decoded sidecar: the caller's JSON header and zero-copy views of its sections."""

    kind: Suffix
    header: dict[str, Any]
    sections: list[memoryview]


def _magic(kind: Suffix) -> bytes:
    try:
        return MAGIC[kind]
    except KeyError:
        raise ValueError(f"{kind!r} is not a sidecar suffix") from None


def encode(kind: Suffix, header: Mapping[str, Any], sections: Sequence[Buffer]) -> EncodedFile:
    """The parts of a sidecar file; sections are referenced, not copied (one CRC pass)."""
    views = [memoryview(s).cast("B") for s in sections]
    if len(views) > MAX_SECTIONS:
        raise ValueError(f"{len(views)} sections, at most {MAX_SECTIONS}")
    header_json = json.dumps(dict(header), separators=(",", ":"), sort_keys=True).encode()
    if len(header_json) > MAX_HEADER_BYTES:
        raise ValueError(f"sidecar header of {len(header_json)} bytes is too large")
    fixed = _FIXED.pack(_magic(kind), FORMAT_VERSION, len(header_json), len(views))
    lengths = struct.pack(f"<{len(views)}Q", *(len(v) for v in views))
    head = fixed + lengths + header_json
    body_crc = checksum.update(0, head)
    for v in views:
        body_crc = checksum.update(body_crc, v)
    trailer = _TRAILER.pack(body_crc, END_MARKER)
    parts: list[Buffer] = [head, *views, trailer]
    n_bytes = len(head) + sum(len(v) for v in views) + TRAILER_BYTES
    return EncodedFile(parts=parts, n_bytes=n_bytes, crc32=checksum.update(body_crc, trailer))


def decode(kind: Suffix, data: Buffer, *, body_crc: int | None = None) -> Sidecar:
    """Parse and verify a sidecar held in memory; sections view `data`.

    `body_crc`, when the caller already computed the CRC-32 of all bytes but the last 8 while
    reading the file, saves a second pass.
    """
    view = memoryview(data).cast("B")
    n_file = len(view)
    if n_file < _FIXED.size + TRAILER_BYTES:
        raise CorruptFileError(f"{kind} sidecar of {n_file} bytes is truncated")
    magic, version, header_bytes, n_sections = _FIXED.unpack_from(view, 0)
    if magic != _magic(kind):
        raise CorruptFileError(f"{kind} sidecar has magic {bytes(magic)!r}")
    if version != FORMAT_VERSION:
        raise CorruptFileError(f"{kind} sidecar format version {version}, expected 1")
    if header_bytes > MAX_HEADER_BYTES or n_sections > MAX_SECTIONS:
        raise CorruptFileError(f"{kind} sidecar has an implausible header")
    lengths_end = _FIXED.size + 8 * n_sections
    if lengths_end + header_bytes + TRAILER_BYTES > n_file:
        raise CorruptFileError(f"{kind} sidecar is truncated")
    lengths = struct.unpack_from(f"<{n_sections}Q", view, _FIXED.size)
    header_end = lengths_end + header_bytes
    if header_end + sum(lengths) + TRAILER_BYTES != n_file:
        raise CorruptFileError(f"{kind} sidecar length does not match its sections")
    body_end = n_file - TRAILER_BYTES
    stored_crc, end_marker = _TRAILER.unpack_from(view, body_end)
    if end_marker != END_MARKER:
        raise CorruptFileError(f"{kind} sidecar has no end marker")
    actual_crc = checksum.update(0, view[:body_end]) if body_crc is None else body_crc
    if actual_crc != stored_crc:
        raise CorruptFileError(f"{kind} sidecar checksum mismatch")
    try:
        header = json.loads(bytes(view[lengths_end:header_end]))
    except (ValueError, RecursionError) as e:  # bad UTF-8, bad JSON, absurd nesting
        raise CorruptFileError(f"{kind} sidecar header is not JSON: {e}") from None
    if not isinstance(header, dict):
        raise CorruptFileError(f"{kind} sidecar header is not a JSON object")
    sections: list[memoryview] = []
    off = header_end
    for n in lengths:
        sections.append(view[off : off + n])
        off += n
    return Sidecar(kind=kind, header=header, sections=sections)
