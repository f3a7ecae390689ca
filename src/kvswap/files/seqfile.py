"""Codec of `F`, libllama's sequence file, and of the RAM state it carries.

    F      = u32 magic 'GGSQ' (0x67677371) | u32 version 3 | u32 n_words | i32 words[n_words]
             | payload
    state  = u32 magic 0xaf143cd8 | u32 source seq id | payload     (llama_state_seq_get_data)

all little-endian. `llama_state_seq_load_file` hands `words` back verbatim as "tokens"; the
payload is the same in both, so kvswap writes `F` from a RAM state, and makes a state from `F`,
without libllama's file functions (which would do I/O on the engine thread).

`words` is what llama-server's `server_tokens::serialize` writes (tools/server/server-common.cpp):
the packed form `[-1 (LLAMA_TOKEN_NULL), u32 1 (version), u32 n_tokens, tokens..., u32 n_media]`.
A list not starting with -1 is a plain token list (older servers, `llama_state_seq_save_file`
callers). kvswap reads both and writes the packed form with `n_media = 0`, so llama-server
restores kvswap's files: its restore reads the word array through `llama_state_seq_load_file`
(which only checks that `n_words` fits the file) and then `server_tokens::deserialize`.

Owns: the byte layout, and its validation (`CorruptFileError` on a wrong magic or version, a
token list that overruns the file, a packed list with a wrong version, media chunks, trailing
words or a truncated length, negative tokens, no payload). Pure functions over buffers; no I/O,
no libllama; callable from any thread. Does not check tokens against a vocabulary (the caller
knows `n_vocab`) nor walk the payload (libllama's `set_data` refuses a malformed one).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt

from kvswap.files.errors import CorruptFileError
from kvswap.files.types import Buffer

GGSQ_MAGIC: Final = 0x67677371
GGSQ_VERSION: Final = 3
STATE_MAGIC: Final = 0xAF143CD8
TOKEN_NULL: Final = -1
PACKED_VERSION: Final = 1

FIXED_HEADER_BYTES: Final = 12  # magic, version, n_words
STATE_PREFIX_BYTES: Final = 8  # magic, source seq id
_PACKED_OVERHEAD_WORDS: Final = 4  # marker, version, n_tokens ... n_media
# Where a page (`core.page`: tokens, then the target state with its RAM prefix) starts in an F
# written in place, so that its state's payload lies where F's goes: F's header and packed words
# (4 words more than the tokens) end where the state's prefix does.
PAGE_IN_FILE: Final = FIXED_HEADER_BYTES + 4 * _PACKED_OVERHEAD_WORDS - STATE_PREFIX_BYTES
_MIN_PAYLOAD_BYTES: Final = 4  # every memory's payload starts with a u32 (n_stream, cells)

_FIXED = struct.Struct("<III")
_PREFIX = struct.Struct("<II")
_I32: Final = np.dtype("<i4")

Tokens = npt.NDArray[np.int32]


@dataclass(frozen=True)
class SeqFile:
    """A parsed `F`: views into the caller's buffer, nothing copied."""

    tokens: Tokens  # read-only view when the source buffer is read-only
    payload: memoryview  # the state payload, without the 8-byte RAM prefix
    packed: bool  # the word list was llama-server's packed form
    header_bytes: int  # offset of the payload in the file


def _as_tokens(tokens: Tokens | Sequence[int]) -> Tokens:
    arr = np.asarray(tokens, dtype=_I32)
    if arr.ndim != 1:
        raise ValueError("tokens must be one-dimensional")
    if arr.size and int(arr.min()) < 0:
        raise ValueError("tokens must be non-negative")
    return arr


def encode_header(tokens: Tokens | Sequence[int]) -> bytes:
    """The bytes of `F` before the payload, with the token list packed as llama-server's."""
    arr = _as_tokens(tokens)
    n_tokens = int(arr.size)
    n_words = n_tokens + _PACKED_OVERHEAD_WORDS
    head = _FIXED.pack(GGSQ_MAGIC, GGSQ_VERSION, n_words)
    # words: [-1, version 1, n_tokens] + tokens + [n_media = 0]
    packed_head = struct.pack("<iII", TOKEN_NULL, PACKED_VERSION, n_tokens)
    return b"".join((head, packed_head, arr.tobytes(), struct.pack("<I", 0)))


def state_payload(state: Buffer) -> memoryview:
    """The payload of a RAM state (`get_data` output): a view past the 8-byte prefix."""
    view = memoryview(state).cast("B")
    if len(view) < STATE_PREFIX_BYTES + _MIN_PAYLOAD_BYTES:
        raise CorruptFileError(f"sequence state of {len(view)} bytes is too short")
    magic, _seq_id = _PREFIX.unpack_from(view, 0)
    if magic != STATE_MAGIC:
        raise CorruptFileError(f"sequence state magic {magic:#010x}, expected {STATE_MAGIC:#x}")
    return view[STATE_PREFIX_BYTES:]


def file_parts(tokens: Tokens | Sequence[int], state: Buffer) -> list[Buffer]:
    """The buffers whose concatenation is `F` for `tokens` and a RAM state, for `writev`.

    The payload is a view of `state` (not copied); only the small header is new bytes.
    """
    return [encode_header(tokens), state_payload(state)]


def write_state_prefix(out: memoryview, seq_id: int = 0) -> None:
    """Write the 8-byte RAM-state prefix at the start of `out` (`set_data` ignores seq id)."""
    _PREFIX.pack_into(out, 0, STATE_MAGIC, seq_id)


def state_from_payload(payload: Buffer, out: memoryview | None = None) -> memoryview:
    """A RAM state for `set_data` from a file payload: exactly one copy of the payload.

    Into `out` when given (at least 8 + len(payload) bytes; returns the used prefix of it), else
    into a freshly allocated `bytearray` that the returned view keeps alive.
    """
    src = memoryview(payload).cast("B")
    n_bytes = STATE_PREFIX_BYTES + len(src)
    dst = memoryview(bytearray(n_bytes)) if out is None else out.cast("B")
    if len(dst) < n_bytes:
        raise ValueError(f"out holds {len(dst)} bytes, needs {n_bytes}")
    write_state_prefix(dst)
    dst[STATE_PREFIX_BYTES:n_bytes] = src
    return dst[:n_bytes]


def parse_fixed_header(head: Buffer, file_bytes: int) -> int:
    """Validate the first 12 bytes of an `F` of `file_bytes` bytes; return its word count."""
    if file_bytes < FIXED_HEADER_BYTES or len(head) < FIXED_HEADER_BYTES:
        raise CorruptFileError(f"sequence file of {file_bytes} bytes is truncated")
    magic, version, n_words = _FIXED.unpack_from(head, 0)
    if magic != GGSQ_MAGIC:
        raise CorruptFileError(f"not a sequence file (magic {magic:#010x})")
    if version != GGSQ_VERSION:
        raise CorruptFileError(f"sequence file version {version}, expected {GGSQ_VERSION}")
    words_end = FIXED_HEADER_BYTES + 4 * int(n_words)
    if words_end + _MIN_PAYLOAD_BYTES > file_bytes:
        raise CorruptFileError(
            f"sequence file truncated: {n_words} tokens and a payload need more than "
            f"{file_bytes} bytes"
        )
    return int(n_words)


def parse_words(words: Buffer) -> tuple[Tokens, bool]:
    """Tokens from the i32 word list (plain or packed), as a view; and whether it was packed."""
    view = memoryview(words).cast("B")
    if len(view) % 4:
        raise CorruptFileError("token list is not a whole number of 32-bit words")
    arr = np.frombuffer(view, dtype=_I32)
    if arr.size == 0 or arr[0] != TOKEN_NULL:
        tokens, packed = arr, False
    else:
        # [0]=-1 marker, [1]=version, [2]=n_tokens, [3:3+n]=tokens, [3+n]=n_media, then nothing
        if arr.size < _PACKED_OVERHEAD_WORDS:
            raise CorruptFileError("packed token list truncated")
        if int(arr[1]) != PACKED_VERSION:
            raise CorruptFileError(f"packed token list version {int(arr[1])}, expected 1")
        n_tokens = int(arr[2]) & 0xFFFFFFFF
        if 3 + n_tokens + 1 > arr.size:
            raise CorruptFileError(f"packed token list truncated ({n_tokens} tokens announced)")
        if int(arr[3 + n_tokens]) != 0:
            raise CorruptFileError("packed token list carries media chunks (not supported)")
        if 3 + n_tokens + 1 != arr.size:
            raise CorruptFileError("trailing data after the packed token list")
        tokens, packed = arr[3 : 3 + n_tokens], True
    if tokens.size and int(tokens.min()) < 0:
        raise CorruptFileError("negative token id in the token list")
    # '<i4' is the native int32 on little-endian hosts: astype is then a view, not a copy.
    return tokens.astype(np.int32, copy=False), packed


def parse_file(data: Buffer) -> SeqFile:
    """Parse a whole `F` held in memory; the result views `data` (zero-copy)."""
    view = memoryview(data).cast("B")
    n_words = parse_fixed_header(view, len(view))
    words_end = FIXED_HEADER_BYTES + 4 * n_words
    tokens, packed = parse_words(view[FIXED_HEADER_BYTES:words_end])
    return SeqFile(tokens=tokens, payload=view[words_end:], packed=packed, header_bytes=words_end)
