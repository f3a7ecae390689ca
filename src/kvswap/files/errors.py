"""Typed errors of `kvswap.files`.

Every error this package raises on purpose is a `FilesError`; its `kind` tells the caller how to
answer a client (`http_status`), so HTTP code maps errors without knowing about files:

- `invalid` (400): a bad name, a path that would leave the save path, a symlink where kvswap
  needs a plain file, a state from another model;
- `not_found` (404): no such slot file;
- `corrupt` (400): a slot file that fails its structure or checksum check (a corrupt sidecar is
  not raised: it restores that part cold, see `reader`);
- `io` (500): the OS refused a step (permission, I/O error, full disk, failed sync) or the save
  path itself is unusable.

Raised by every module here; caught by the engine/server layers. Holds no state.
"""

from __future__ import annotations

from typing import ClassVar, Literal

ErrorKind = Literal["invalid", "not_found", "corrupt", "io"]

_HTTP_STATUS: dict[ErrorKind, int] = {"invalid": 400, "not_found": 404, "corrupt": 400, "io": 500}


class FilesError(Exception):
    """Base of every error raised by `kvswap.files`.

    `committed`, set on an error raised by `Publisher.publish`: False when the previous
    generation is untouched, True when the new generation passed its commit point (it is the
    committed one; a later read completes it), None when that could not be determined (the
    commit record decides at the next read). None on every other error.
    """

    kind: ClassVar[ErrorKind] = "io"
    committed: bool | None = None

    @property
    def http_status(self) -> int:
        return _HTTP_STATUS[self.kind]


class InvalidNameError(FilesError):
    """A file or page name that kvswap refuses (llama-server's rules plus kvswap's own)."""

    kind = "invalid"


class UnsafePathError(FilesError):
    """A named file in the save path is a symlink or not a regular file: never followed."""

    kind = "invalid"


class WrongModelError(FilesError):
    """The generation was written for another model fingerprint."""

    kind = "invalid"

    def __init__(self, name: str, expected: str, found: str) -> None:
        super().__init__(f"slot file {name!r} is for model {found!r}, not {expected!r}")
        self.expected = expected
        self.found = found


class TooLargeError(FilesError):
    """The generation is larger than the caller's limit (checked before anything is read)."""

    kind = "invalid"


class NotFoundError(FilesError):
    """No slot file under that name."""

    kind = "not_found"


class CorruptFileError(FilesError):
    """Bytes that fail a structure or checksum check; never applied."""

    kind = "corrupt"


class FilesIOError(FilesError):
    """An OS step failed; `errno` is the OS error number when there was one."""

    kind = "io"

    def __init__(self, message: str, errno: int | None = None) -> None:
        super().__init__(message)
        self.errno = errno


class SavePathError(FilesIOError):
    """The save path or kvswap's metadata folder is unusable (missing, a symlink, not a dir)."""
