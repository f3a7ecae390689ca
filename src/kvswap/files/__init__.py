"""kvswap.files: slot files on disk and their crash-safe publication (docs/DESIGN.md, "Files that survive a crash"). No libllama.

Modules, each owning one thing:

- `errors`   typed errors (`FilesError` and kinds mapped to HTTP statuses)
- `types`    buffer type, file suffixes, on-disk constants
- `osio`     the one adapter every OS step goes through (fault seam for tests)
- `faults`   hooks for that seam (counting, failing, killing at step k): tests only
- `names`    slot file and page name validation
- `paths`    the save path's directory fds and kvswap's metadata folders inside it
- `checksum` CRC-32, chosen by measurement
- `seqfile`  codec of F, libllama's sequence file, and of RAM states
- `sidecar`  codec of F.ckpt / F.dft / F.lora
- `records`  commit records
- `locks`    cross-process, cross-thread shared/exclusive locks
- `stage`    stage folders, roll forward, the stage sweep
- `reader`   reading and verifying one generation
- `publish`  `Publisher`: publish, read, list, remove
- `replace`  one small document replaced whole, crash-safely (kvswap's own, not slot files)

Callers use `Publisher` from worker threads; the codecs (`seqfile`, `sidecar`, `names`) are pure
and usable from any thread.
"""

from kvswap.files.errors import (
    CorruptFileError,
    FilesError,
    FilesIOError,
    InvalidNameError,
    NotFoundError,
    SavePathError,
    TooLargeError,
    UnsafePathError,
    WrongModelError,
)
from kvswap.files.names import validate_filename, validate_page_name
from kvswap.files.osio import OsAdapter
from kvswap.files.publish import GenerationInfo, Publisher, PublishReceipt
from kvswap.files.reader import Generation, SidecarRead
from kvswap.files.sidecar import EncodedFile, Sidecar

__all__ = [
    "CorruptFileError",
    "EncodedFile",
    "FilesError",
    "FilesIOError",
    "Generation",
    "GenerationInfo",
    "InvalidNameError",
    "NotFoundError",
    "OsAdapter",
    "PublishReceipt",
    "Publisher",
    "SavePathError",
    "Sidecar",
    "SidecarRead",
    "TooLargeError",
    "UnsafePathError",
    "WrongModelError",
    "validate_filename",
    "validate_page_name",
]
