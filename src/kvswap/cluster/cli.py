"""`kvswap cluster ...`: `haproxy-config` (print the HAProxy config for a list of replicas),
`up` (a local cluster of real processes, supervised), `status`, `drain ID` and `ready ID`.
Argument parsing only; the work is in `haproxy`, `up` and `status`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from kvswap.cluster import haproxy, status, up
from kvswap.cluster.state import StateError, read_state
from kvswap.cluster.supervise import RestartPolicy
from kvswap.config.errors import ConfigError
from kvswap.config.sizes import parse_size

_USAGE = """usage: kvswap cluster <command> [options]

commands:
  haproxy-config   print the HAProxy 2.6 config routing minds to replicas
                   (`kvswap cluster haproxy-config --replica r1=http://10.0.0.1:8080 ...`)
  up               start redis-server, HAProxy and N kvswap replicas on this machine, and
                   restart any that dies (`kvswap cluster up --replicas 3 [--port 8080]
                   [serve flags...]`)
  status           each replica, Redis and HAProxy: up, restarting or gave up; pid,
                   restarts, last exit; HAProxy's view (`kvswap cluster status [--dir DIR]`)
  drain ID         HAProxy sends replica ID no new minds; its minds move to the others
                   (`kvswap cluster drain r1 [--dir DIR | --socket PATH]`)
  ready ID         replica ID takes its minds again (`kvswap cluster ready r1`)
"""
_DEFAULT_DIR = Path("kvswap-cluster")


def _haproxy_config(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="kvswap cluster haproxy-config",
        description="Print the HAProxy 2.6 config of a kvswap cluster (consistent hashing on "
        "API key + mind, /health checks, drain through the runtime API).",
    )
    p.add_argument(
        "--replica",
        action="append",
        required=True,
        metavar="ID=URL",
        help="a replica: its id (fixes its place on the hash ring) and http://host:port",
    )
    p.add_argument("--port", type=int, default=8080, help="HAProxy's port (default 8080)")
    p.add_argument("--bind", default="127.0.0.1", help="HAProxy's address (default 127.0.0.1)")
    p.add_argument(
        "--socket",
        default="/run/haproxy/kvswap.sock",
        help="runtime API socket (default /run/haproxy/kvswap.sock)",
    )
    p.add_argument("--check-inter-ms", type=int, default=1000, help="health check interval")
    p.add_argument(
        "--dns",
        action="store_true",
        help="replicas are host names resolved at run time (compose, Kubernetes)",
    )
    p.add_argument("--out", type=Path, help="write the config here instead of stdout")
    args = p.parse_args(argv)  # fmt: skip
    try:
        cfg = haproxy.HaproxyConfig(
            tuple(haproxy.parse_replica(r) for r in args.replica),
            bind=args.bind,
            port=args.port,
            socket_path=args.socket,
            check_inter_ms=args.check_inter_ms,
            dns=args.dns,
        )
    except haproxy.HaproxyConfigError as err:
        p.error(str(err))
    text = haproxy.render(cfg)
    if args.out is None:
        sys.stdout.write(text)
    else:
        args.out.write_text(text)
    return 0


def _up(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="kvswap cluster up",
        allow_abbrev=False,
        description="Start redis-server, HAProxy on --port and N `kvswap serve` replicas on the "
        "ports after it; every other flag goes to each replica. A child that dies is restarted "
        "while the others keep serving (`kvswap cluster status` shows it). Ctrl-C or SIGTERM "
        "stops all.",
    )
    p.add_argument("--replicas", type=int, required=True, help="number of kvswap replicas")
    p.add_argument("--port", type=int, default=8080, help="HAProxy's port (default 8080)")
    p.add_argument(
        "--dir",
        type=Path,
        default=_DEFAULT_DIR,
        help="state and logs (default ./kvswap-cluster)",
    )
    p.add_argument(
        "--redis-port", type=int, help="redis-server's port (default: after the replicas)"
    )
    p.add_argument("--check-inter-ms", type=int, default=1000, help="HAProxy health check interval")
    p.add_argument(
        "--ready-timeout-s",
        type=float,
        default=600,
        help="how long a replica may take to load its model (default 600)",
    )
    p.add_argument(
        "--redis-maxmemory",
        default="1G",
        metavar="SIZE",
        help="redis-server's maxmemory (noeviction: past it writes are refused, never evicted); "
        "the replicas' --shared-tier-bytes defaults to 3/4 of it (default 1G)",
    )
    p.add_argument(
        "--max-restarts",
        type=int,
        default=5,
        help="a child that dies is restarted (back-off 1 s, 2 s, ... 30 s); after this many "
        "restarts in a row, each within a minute of its start, it is left down (default 5)",
    )
    args, serve_flags = p.parse_known_args(argv)  # fmt: skip
    try:
        maxmemory = parse_size(args.redis_maxmemory, "--redis-maxmemory")
        policy = RestartPolicy(max_restarts=args.max_restarts, start_timeout_s=args.ready_timeout_s)
        plan = up.make_plan(
            args.replicas, args.port, args.dir, serve_flags, args.redis_port, args.check_inter_ms,
            redis_maxmemory_bytes=maxmemory, policy=policy,
        )  # fmt: skip
    except (up.ClusterUpError, ConfigError, ValueError) as err:
        p.error(str(err))
    return up.run(plan, args.ready_timeout_s)


def _dir_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--dir",
        type=Path,
        default=_DEFAULT_DIR,
        help="the `cluster up` state folder (default ./kvswap-cluster)",
    )


def _status(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="kvswap cluster status",
        description="Each child of a `kvswap cluster up`: its state (starting, up, restarting, "
        "gave up, stopped), pid, restarts and last exit, and how HAProxy sees each replica.",
    )
    _dir_arg(p)
    p.add_argument("--json", action="store_true", help="print cluster.json with HAProxy's view")
    args = p.parse_args(argv)
    try:
        doc = status.with_haproxy(read_state(args.dir))
    except StateError as err:
        print(f"kvswap cluster status: {err}", file=sys.stderr)
        return 1
    print(json.dumps(doc, indent=2) if args.json else status.render(doc))
    return 0 if doc["running"] and not doc["stale"] else 3


def _set_state(state: str, argv: list[str]) -> int:
    what = {
        "drain": "HAProxy sends replica ID no new requests of minds (its minds move to their "
        "next replica; the turns it is serving finish)",
        "ready": "replica ID takes requests again (its minds come back)",
    }[state]
    p = argparse.ArgumentParser(prog=f"kvswap cluster {state}", description=what)
    p.add_argument("replica_id", metavar="ID", help="the replica (its HAProxy server name: r1)")
    _dir_arg(p)
    p.add_argument(
        "--socket", help="HAProxy's runtime API socket (default: the one in DIR/cluster.json)"
    )
    args = p.parse_args(argv)
    try:
        socket_path = status.socket_of(args.dir, args.socket)
        now = status.set_replica(socket_path, args.replica_id, state)
    except (StateError, RuntimeError, OSError) as err:
        print(f"kvswap cluster {state}: {err}", file=sys.stderr)
        return 1
    print(f"{args.replica_id}: {now}")
    return 0


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_USAGE)
        return 0 if argv else 2
    commands = {
        "haproxy-config": _haproxy_config,
        "up": _up,
        "status": _status,
        "drain": lambda a: _set_state("drain", a),
        "ready": lambda a: _set_state("ready", a),
    }
    command = commands.get(argv[0])
    if command is None:
        print(f"kvswap cluster: unknown command {argv[0]!r}\n\n{_USAGE}", file=sys.stderr)
        return 2
    return command(argv[1:])
