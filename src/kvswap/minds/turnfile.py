"""Each mind's last chat turn kept across a restart: `MindHistories` written beside the minds'
files at exit and read back at start, so the first turn after a restart continues the mind's
own tokens for its last answer (a tool call's syntax, the end-of-turn marker) instead of
prefilling that answer again (`minds.histories`).

One file, `<save>/.kvswap-turns.json` (a name no request's `filename` can reach: slot file names
may not start with `.kvswap`), replaced atomically (written beside, fsynced, renamed, the folder
fsynced): a crash leaves the previous file or the new one whole. A SIGKILL loses the turns since
the last clean exit, which costs those minds one answer's prefill each, never a wrong token: an
entry is matched against the prompt a client sends, whatever the mind holds. A file that does
not parse is logged and ignored. Runs at start and at exit, off the event loop.
"""

from __future__ import annotations

import base64
import json
import logging
from pathlib import Path
from typing import Any, Final

import numpy as np

from kvswap.core.keys import PageKey, PageKind
from kvswap.files.replace import replace_file
from kvswap.minds.histories import LastTurn, MindHistories

log = logging.getLogger("kvswap.minds")

TURNS_FILE: Final = ".kvswap-turns.json"
_VERSION: Final = 1


def save_turns(histories: MindHistories, save_dir: Path) -> int:
    """Write every mind's last turn under `save_dir` (atomically); how many were written."""
    turns = histories.items()
    doc = {"version": _VERSION, "turns": [_entry(key, turn) for key, turn in turns]}
    replace_file(save_dir / TURNS_FILE, json.dumps(doc), ".kvswap-turns-")
    return len(turns)


def load_turns(histories: MindHistories, save_dir: Path | None) -> int:
    """Read the last turns written at the previous exit into `histories`; how many (none
    without a save path)."""
    if save_dir is None or not (path := save_dir / TURNS_FILE).exists():
        return 0
    try:
        doc = json.loads(path.read_text())
        if doc.get("version") != _VERSION:
            raise ValueError(f"version {doc.get('version')!r}")
        turns = [_turn(e) for e in doc["turns"]]
    except (OSError, ValueError, KeyError, TypeError) as err:
        log.warning("%s could not be read (%s): minds continue without their last turns", path, err)
        return 0
    for key, turn in turns:
        histories.put(key, turn)
    log.info("read the last turns of %d minds written at the previous exit", len(turns))
    return len(turns)


def _entry(key: PageKey, turn: LastTurn) -> dict[str, Any]:
    return {
        "namespace": key.namespace,
        "name": key.name,
        "tokens": base64.b64encode(np.asarray(turn.tokens, dtype="<i4").tobytes()).decode(),
        **turn.fields(),
    }


def _turn(e: dict[str, Any]) -> tuple[PageKey, LastTurn]:
    tokens = np.frombuffer(base64.b64decode(e["tokens"]), dtype="<i4").astype(np.int32)
    key = PageKey(PageKind.MIND, str(e["namespace"]), str(e["name"]))
    return key, LastTurn.of_fields(tokens, e)
