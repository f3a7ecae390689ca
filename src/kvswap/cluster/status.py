"""`kvswap cluster status`, `drain ID` and `ready ID`: a running `cluster up` seen and steered
from another terminal.

`status` reads cluster.json (`state`), asks HAProxy's runtime API how it sees each replica
(`UP`, `DOWN`, `DRAIN`, `MAINT`, ...) and each replica that is up how many minds it holds (its
/health), then prints one line per child: its supervision state, pid, restarts and last exit,
HAProxy's view and the replica's minds. `drain` and `ready` send `set server
replicas/ID state drain|ready` on the runtime API socket (no `socat` needed) and read the new
state back. The socket comes from cluster.json, or from `--socket` for any HAProxy running the
generated config (a cluster not started by `cluster up`).

Owns the status report's text and the drain/ready steps; no process is started or signalled.
"""

from __future__ import annotations

import datetime
import json
import urllib.request
from pathlib import Path
from typing import Any

from kvswap.cluster import haproxy
from kvswap.cluster.procs import exit_text
from kvswap.cluster.state import StateError, read_state


def haproxy_view(doc: dict[str, Any]) -> dict[str, str] | None:
    """HAProxy's state of each replica, or None when its runtime API does not answer."""
    if not doc.get("running") or doc.get("stale"):
        return None
    try:
        return haproxy.server_status(doc["haproxy"]["socket"])
    except (OSError, RuntimeError):
        return None


def with_haproxy(doc: dict[str, Any]) -> dict[str, Any]:
    """cluster.json with each replica's `haproxy` state added (None: HAProxy did not answer)
    and the minds it holds (`n_minds_held`, from its /health; None: it did not answer)."""
    view = haproxy_view(doc)
    replicas = [
        {**r, "haproxy": None if view is None else view.get(r["id"], "unknown"),
         "n_minds_held": minds_held(r["url"]) if r["state"] == "up" else None}
        for r in doc["replicas"]
    ]  # fmt: skip
    return {**doc, "replicas": replicas}


def minds_held(url: str, timeout_s: float = 1.0) -> int | None:
    """How many minds the replica at `url` holds (its /health), None when it does not say."""
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=timeout_s) as r:
            n = json.loads(r.read()).get("n_minds_held")
    except (OSError, ValueError):
        return None
    return n if isinstance(n, int) else None


def _child_line(name: str, child: dict[str, Any], extra: str) -> str:
    pid = child["pid"] if child["pid"] is not None else "-"
    last = child["last_exit_status"]
    exited = f"  last exit {exit_text(last)}" if last is not None else ""
    return (
        f"  {name:<8} {child['state']:<10} pid {pid!s:<8} restarts {child['n_restarts']:<3}"
        f"{extra}{exited}"
    )


def render(doc: dict[str, Any]) -> str:
    """The status report of `with_haproxy(read_state(...))`."""
    when = datetime.datetime.fromtimestamp(doc["updated_unix_s"]).strftime("%H:%M:%S")
    if doc["stale"]:
        head = (
            f"kvswap cluster: stale: `cluster up` (pid {doc['pid']}) is gone without stopping "
            "its cluster (killed?); its children die with it. Start it again."
        )
    elif doc["running"]:
        head = f"kvswap cluster: running (cluster up pid {doc['pid']}), {doc['endpoint']}"
    else:
        head = "kvswap cluster: stopped"
    lines = [f"{head}  [cluster.json of {when}]"]
    lines.append(_child_line("haproxy", doc["haproxy"], f"  {doc['haproxy']['socket']}"))
    lines.append(_child_line("redis", doc["redis"], f"  {doc['redis']['url']}"))
    for r in doc["replicas"]:
        seen, n_minds = r.get("haproxy"), r.get("n_minds_held")
        extra = f"  {r['url']}" + (f"  haproxy {seen}" if seen is not None else "")
        extra += f"  minds {n_minds}" if n_minds is not None else ""
        lines.append(_child_line(r["id"], r, extra))
    return "\n".join(lines)


def socket_of(state_dir: Path, socket_path: str | None) -> str:
    """The runtime API socket: `--socket`, else the running cluster's."""
    if socket_path is not None:
        return socket_path
    doc = read_state(state_dir)
    if not doc["running"] or doc["stale"]:
        raise StateError(f"the cluster of {state_dir} is not running")
    return str(doc["haproxy"]["socket"])


def set_replica(socket_path: str, replica_id: str, state: str) -> str:
    """Drain or ready a replica; its state as HAProxy reports it afterwards."""
    before = haproxy.server_status(socket_path)
    if replica_id not in before:
        known = ", ".join(sorted(before)) or "none"
        raise RuntimeError(f"no replica {replica_id!r} in HAProxy's {haproxy.BACKEND} ({known})")
    haproxy.set_state(socket_path, replica_id, state)
    return haproxy.server_status(socket_path)[replica_id]
