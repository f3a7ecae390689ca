"""`kvswap cluster ...`: `haproxy-config` (print the HAProxy config for a list of replicas) and
`up` (a local cluster of real processes). Argument parsing only; the work is in `haproxy` and
`up`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kvswap.cluster import haproxy, up

_USAGE = """usage: kvswap cluster <command> [options]

commands:
  haproxy-config   print the HAProxy 2.6 config routing minds to replicas
                   (`kvswap cluster haproxy-config --replica r1=http://10.0.0.1:8080 ...`)
  up               start redis-server, HAProxy and N kvswap replicas on this machine
                   (`kvswap cluster up --replicas 3 [--port 8080] [serve flags...]`)
"""


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
        "ports after it; every other flag goes to each replica. Ctrl-C or SIGTERM stops all.",
    )
    p.add_argument("--replicas", type=int, required=True, help="number of kvswap replicas")
    p.add_argument("--port", type=int, default=8080, help="HAProxy's port (default 8080)")
    p.add_argument(
        "--dir",
        type=Path,
        default=Path("kvswap-cluster"),
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
    args, serve_flags = p.parse_known_args(argv)  # fmt: skip
    try:
        plan = up.make_plan(
            args.replicas, args.port, args.dir, serve_flags, args.redis_port, args.check_inter_ms
        )
    except up.ClusterUpError as err:
        p.error(str(err))
    return up.run(plan, args.ready_timeout_s)


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_USAGE)
        return 0 if argv else 2
    commands = {"haproxy-config": _haproxy_config, "up": _up}
    command = commands.get(argv[0])
    if command is None:
        print(f"kvswap cluster: unknown command {argv[0]!r}\n\n{_USAGE}", file=sys.stderr)
        return 2
    return command(argv[1:])
