"""A bench's progress on stderr: one line redrawn in place, `label [####....] done/total what`,
so a bench that runs for minutes shows it is working (stdout keeps only the report)."""

from __future__ import annotations

import sys

_WIDTH = 30


def progress(label: str, done: int, total: int, what: str = "steps") -> None:
    filled = _WIDTH * done // max(1, total)
    end = "\n" if done >= total else ""
    print(
        f"\r{label:>13} [{'#' * filled}{'.' * (_WIDTH - filled)}] {done}/{total} {what}",
        end=end,
        file=sys.stderr,
        flush=True,
    )
