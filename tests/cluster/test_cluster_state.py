"""cluster.json (`cluster.state`): written whole (no temporary file left behind, a reader sees
one document or the next), read back with `stale` when the `cluster up` that wrote it is gone,
and a missing or foreign file is an error that says where it looked."""

from __future__ import annotations

import json
import os
import subprocess
import threading
from pathlib import Path

import pytest

from kvswap.cluster.state import STATE_FILE, StateError, read_state, write_state

pytestmark = pytest.mark.timeout(60)


def test_written_atomically_and_read_back(tmp_path: Path) -> None:
    path = tmp_path / STATE_FILE
    stop = threading.Event()
    seen: list[int] = []

    def reader() -> None:  # reads while the writer replaces the file: never half a document
        while not stop.is_set():
            if path.exists():
                seen.append(json.loads(path.read_text())["n"])

    t = threading.Thread(target=reader)
    t.start()
    try:
        for n in range(200):
            write_state(path, {"running": True, "pid": os.getpid(), "n": n, "pad": "x" * 5000})
    finally:
        stop.set()
        t.join()
    assert seen == sorted(seen) and seen  # each read was a whole document, in order
    assert [p.name for p in tmp_path.iterdir()] == [STATE_FILE]
    doc = read_state(tmp_path)
    assert doc["n"] == 199 and doc["version"] == 1 and doc["stale"] is False


def test_a_running_state_whose_writer_is_gone_is_stale(tmp_path: Path) -> None:
    gone = subprocess.Popen(["true"])
    gone.wait()
    write_state(tmp_path / STATE_FILE, {"running": True, "pid": gone.pid})
    assert read_state(tmp_path)["stale"] is True
    write_state(tmp_path / STATE_FILE, {"running": False, "pid": gone.pid})
    assert read_state(tmp_path)["stale"] is False  # it stopped and said so


def test_missing_or_foreign_files_are_errors_that_say_where(tmp_path: Path) -> None:
    with pytest.raises(StateError, match=f"no {tmp_path / STATE_FILE}.*--dir"):
        read_state(tmp_path)
    (tmp_path / STATE_FILE).write_text('{"version": 99}')
    with pytest.raises(StateError, match="version 99"):
        read_state(tmp_path)
    (tmp_path / STATE_FILE).write_text("{not json")
    with pytest.raises(StateError, match="cannot read"):
        read_state(tmp_path)
