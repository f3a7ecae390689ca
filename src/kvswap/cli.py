"""The `kvswap` console script: `serve`, `make-tiny-model`, `bench`, `cluster`.

Dispatch only; each subcommand owns its arguments. Heavy imports (libllama) happen inside the
subcommand that needs them, so `kvswap --help` is instant.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

_USAGE = """usage: kvswap <command> [options] | kvswap --version

commands:
  serve             run the llama-server-compatible HTTP server (llama-server's flags;
                    `kvswap serve --help` lists them). With no -m, serves SmolLM2-135M-Instruct.
  make-tiny-model   write a tiny random-weight GGUF model (tests, drafts, benchmarks)
  bench             run a benchmark (`kvswap bench --help` lists them)
  cluster           replicas behind HAProxy: `haproxy-config`, `up`, `status`, `drain`,
                    `ready` (`kvswap cluster --help`)

options:
  --version         print kvswap's version
"""


def _serve(argv: list[str]) -> int:
    from kvswap.serve import main as serve_main

    return serve_main(argv)


def _make_tiny_model(argv: list[str]) -> int:
    from kvswap.tiny.cli import main as tiny_main

    return tiny_main(argv)


def _bench(argv: list[str]) -> int:
    from kvswap.bench.cli import main as bench_main

    return bench_main(argv)


def _cluster(argv: list[str]) -> int:
    from kvswap.cluster.cli import main as cluster_main

    return cluster_main(argv)


COMMANDS: dict[str, Callable[[list[str]], int]] = {
    "serve": _serve,
    "make-tiny-model": _make_tiny_model,
    "bench": _bench,
    "cluster": _cluster,
}


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help", "help"):
        print(_USAGE)
        return 0 if args else 2
    if args[0] == "--version":
        from kvswap import __version__

        print(f"kvswap {__version__}")
        return 0
    command = COMMANDS.get(args[0])
    if command is None:
        print(f"kvswap: unknown command {args[0]!r}\n\n{_USAGE}", file=sys.stderr)
        return 2
    return command(args[1:])


if __name__ == "__main__":
    sys.exit(main())
