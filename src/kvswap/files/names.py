"""Validation of slot file names (`filename` of save/restore/spill) and page names.

Owns the naming rules; pure functions, no I/O, callable from any thread (HTTP handlers validate
before posting a command).

Slot file names follow llama-server's `fs_validate_filename` (common/common.cpp, without
subdirectories): 1-255 bytes of well-formed UTF-8; no C0/C1 control characters or DEL; none of
`/ \\ : * ? " < > |`, nor their look-alikes U+FF0E, U+2215, U+2216; no surrogates, U+FFFD or
U+FEFF; no leading or trailing space, no trailing dot, no `..` anywhere, not `.`. kvswap adds:
the name plus its longest sidecar suffix must fit one directory entry (so at most 250 bytes),
and it may not collide with kvswap's own files (the metadata folder `.kvswap*`, or a name ending
in a sidecar suffix `.ckpt`, `.dft`, `.lora`, compared case-insensitively for case-folding file
systems).

Page names never become paths: 1-255 bytes of UTF-8, no path separators, no `..`, no
control characters.

Does not touch the file system: symlinks and existing entries are `paths`' business.
"""

from __future__ import annotations

from typing import Final

from kvswap.files.errors import InvalidNameError
from kvswap.files.types import META_DIR_NAME, SIDECAR_SUFFIXES

NAME_MAX_BYTES: Final = 255
_LONGEST_SUFFIX_BYTES: Final = max(len(s) for s in SIDECAR_SUFFIXES)
FILENAME_MAX_BYTES: Final = NAME_MAX_BYTES - _LONGEST_SUFFIX_BYTES

_FORBIDDEN_CHARS: Final = frozenset('/\\:*?"<>|')
_FORBIDDEN_CODEPOINTS: Final = frozenset({0xFF0E, 0x2215, 0x2216, 0xFFFD, 0xFEFF})


def _is_control(c: int) -> bool:
    return c <= 0x1F or c == 0x7F or 0x80 <= c <= 0x9F


def _utf8_len(name: str, what: str) -> int:
    try:
        return len(name.encode("utf-8"))
    except UnicodeEncodeError as e:  # lone surrogates, e.g. from a JSON "\ud800" escape
        raise InvalidNameError(f"{what} is not valid UTF-8") from e


def validate_filename(name: str) -> str:
    """Return `name` if it may name a slot file `F`; raise `InvalidNameError` otherwise."""
    if not isinstance(name, str) or not name:
        raise InvalidNameError("Invalid filename: empty")
    n_bytes = _utf8_len(name, "Invalid filename")
    if n_bytes > FILENAME_MAX_BYTES:
        raise InvalidNameError(
            f"Invalid filename: {n_bytes} bytes, at most {FILENAME_MAX_BYTES} "
            "(the name plus a sidecar suffix must fit 255 bytes)"
        )
    for ch in name:
        c = ord(ch)
        if (
            _is_control(c)
            or ch in _FORBIDDEN_CHARS
            or c in _FORBIDDEN_CODEPOINTS
            or 0xD800 <= c <= 0xDFFF
        ):
            raise InvalidNameError(f"Invalid filename: forbidden character U+{c:04X}")
    if name[0] == " " or name[-1] == " " or name[-1] == ".":
        raise InvalidNameError("Invalid filename: leading/trailing space or trailing dot")
    if ".." in name or name == ".":
        raise InvalidNameError("Invalid filename: '.' or '..'")
    folded = name.casefold()
    if folded.startswith(META_DIR_NAME):
        raise InvalidNameError(f"Invalid filename: {META_DIR_NAME!r} is reserved by kvswap")
    for suffix in SIDECAR_SUFFIXES:
        if folded.endswith(suffix):
            raise InvalidNameError(f"Invalid filename: the suffix {suffix!r} is a kvswap sidecar")
    return name


def validate_page_name(name: str) -> str:
    """Return `name` if it may name a RAM page; raise `InvalidNameError` otherwise."""
    if not isinstance(name, str) or not name:
        raise InvalidNameError("Invalid page name: empty")
    n_bytes = _utf8_len(name, "Invalid page name")
    if n_bytes > NAME_MAX_BYTES:
        raise InvalidNameError(f"Invalid page name: {n_bytes} bytes, at most {NAME_MAX_BYTES}")
    for ch in name:
        if ch in "/\\" or _is_control(ord(ch)):
            raise InvalidNameError(f"Invalid page name: forbidden character U+{ord(ch):04X}")
    if ".." in name:
        raise InvalidNameError("Invalid page name: '..'")
    return name
