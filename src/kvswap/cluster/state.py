"""`cluster.json`: what a running `kvswap cluster up` is made of, for `kvswap cluster status`,
`drain`/`ready`, the replicas (`KVSWAP_CLUSTER_STATE` names the file) and the user.

The file is rewritten whole at every change of a child's state (a temporary file in the same
folder, fsynced, then renamed over the old one: a reader sees the old document or the new one,
never half of one). It never holds a dead pid: a child that exited has `"pid": null` until it
runs again, and once `cluster up` has stopped every child the document says `"running": false`.
A `cluster up` killed with SIGKILL cannot say so; its `pid` then names a process that is gone,
which `read_state` reports as `stale`.

Its shape (version 1):

    {"version": 1, "running": true, "stale": false, "pid": 4242, "updated_unix_s": 1.7e9,
     "endpoint": "http://127.0.0.1:8080",
     "haproxy": CHILD + {"config": PATH, "socket": PATH},
     "redis": CHILD + {"url": "redis://:***@127.0.0.1:8084/0", "conf": PATH,
                       "maxmemory_bytes": N},
     "replicas": [CHILD + {"id": "r1", "url": "http://127.0.0.1:8081", "slots": PATH}, ...]}

    CHILD = {"state": "starting" | "up" | "restarting" | "gave up" | "stopped",
             "pid": 4243 | null, "n_restarts": 0, "last_exit_status": -9 | null,
             "since_unix_s": 1.7e9, "log": PATH}

`last_exit_status` is the child's last exit status (negative: the signal that ended it). The
Redis password is never in this file: the URL shows `***`, and `conf` is the 0600 file that
holds it.

Owns the file format and its atomic write; no process logic.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Final

from kvswap.files.replace import replace_file

STATE_FILE: Final = "cluster.json"
ENV_VAR: Final = "KVSWAP_CLUSTER_STATE"  # set for every replica: where this file is
VERSION: Final = 1


class StateError(RuntimeError):
    """No readable cluster.json where one was expected (the message says where and why)."""


def write_state(path: Path, doc: dict[str, Any]) -> None:
    """Replace `path` with `doc` atomically (see the module docstring)."""
    replace_file(path, json.dumps({"version": VERSION, **doc}, indent=2) + "\n", ".cluster-")


def pid_alive(pid: int | None) -> bool:
    """A process `pid` exists and is not a zombie."""
    if pid is None:
        return False
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return fields[0] != b"Z"


def read_state(state_dir: Path) -> dict[str, Any]:
    """The cluster.json of `state_dir`, with `stale` true when it says running but its
    `cluster up` is gone."""
    path = state_dir / STATE_FILE
    try:
        doc: dict[str, Any] = json.loads(path.read_text())
    except FileNotFoundError as err:
        raise StateError(
            f"no {path}: is `kvswap cluster up` running with --dir {state_dir}?"
        ) from err
    except (OSError, ValueError) as err:
        raise StateError(f"cannot read {path}: {err}") from err
    if doc.get("version") != VERSION:
        raise StateError(f"{path}: version {doc.get('version')!r}, expected {VERSION}")
    doc["stale"] = bool(doc.get("running")) and not pid_alive(doc.get("pid"))
    return doc
