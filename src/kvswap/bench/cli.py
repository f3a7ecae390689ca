"""`kvswap bench <name>`: dispatch to one benchmark."""

from __future__ import annotations

import sys
from collections.abc import Callable


def _throughput(argv: list[str]) -> int:
    from kvswap.bench.throughput import main

    return main(argv)


def _paging(argv: list[str]) -> int:
    from kvswap.bench.paging import main

    return main(argv)


def _checkpoints(argv: list[str]) -> int:
    from kvswap.bench.checkpoints import main

    return main(argv)


def _reconfigure(argv: list[str]) -> int:
    from kvswap.bench.reconfigure import main

    return main(argv)


def _lora(argv: list[str]) -> int:
    from kvswap.bench.lora import main

    return main(argv)


def _spec(argv: list[str]) -> int:
    from kvswap.bench.spec import main

    return main(argv)


def _grammar(argv: list[str]) -> int:
    from kvswap.bench.grammar import main

    return main(argv)


def _cluster(argv: list[str]) -> int:
    from kvswap.bench.cluster import main

    return main(argv)


def _minds(argv: list[str]) -> int:

    from kvswap.bench.minds import main

    return main(argv)


BENCHES: dict[str, Callable[[list[str]], int]] = {
    "minds": _minds,
    "cluster": _cluster,
    "reconfigure": _reconfigure,
    "throughput": _throughput,
    "paging": _paging,
    "checkpoints": _checkpoints,
    "lora": _lora,
    "spec": _spec,
    "grammar": _grammar,
}


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in BENCHES:
        print("usage: kvswap bench {" + ",".join(BENCHES) + "} [options]", file=sys.stderr)
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    return BENCHES[argv[0]](argv[1:])
