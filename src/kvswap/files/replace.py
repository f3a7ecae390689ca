"""One small file replaced whole, crash-safely: written to a temporary file in the same folder,
fsynced, renamed over the old one, and the folder fsynced, so a reader (or a restart after a
crash) finds the old document or the new one, never half of one. For kvswap's own small
documents (`cluster.json`, the minds' last turns); slot files and minds go through `Publisher`.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def replace_file(path: Path, text: str, prefix: str) -> None:
    """Make `path` hold `text` (UTF-8), atomically; `prefix`: the temporary file's name start."""
    fd, tmp = tempfile.mkstemp(prefix=prefix, dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
