"""`kvswap bench <name>`: dispatch to one benchmark; `kvswap bench --help` lists them."""

from __future__ import annotations

import importlib
import sys

# name -> what it measures (each bench's module is `kvswap.bench.<name>`, run by its `main`).
BENCHES: dict[str, str] = {
    "agents": "chat agents with long system prompts at the default flags, against llama-server",
    "coding": "Claude Code and Codex sessions captured from the real clients, replayed: vs llama-server",
    "minds": "minds that fit, exceed RAM, restart (SIGTERM, SIGKILL), grow long: vs llama-server",
    "startup": "process start to a first completion, beside llama-server (wall and CPU)",
    "flush": "what a SIGKILL loses, with and without --page-flush-seconds",
    "cluster": "minds across replicas: resume against re-prefill, bytes per turn, takeover",
    "stateful": "stored conversations (previous_response_id) against full re-sends and llama-server",
    "stalls": "how long a stream and the event loop stall while minds switch and pages move",
    "paging": "what a mind switch costs: page_out/page_in against save/restore and re-prefill",
    "throughput": "the server against a bare llama_decode loop and llama-server (several minutes)",
    "reconfigure": "a live reconfigure against a restart",
    "checkpoints": "what context checkpoints save, and what they hold",
    "lora": "what serving several LoRA sets at once costs",
    "spec": "decode speed and acceptance with and without speculative decoding",
    "grammar": "what a grammar costs per generated token, beside free decoding",
}


def usage() -> str:
    width = max(len(name) for name in BENCHES)
    lines = ["usage: kvswap bench <name> [options]  (`kvswap bench <name> --help`: its options)"]
    lines += ["", "benches:"]
    lines += [f"  {name:<{width}}  {what}" for name, what in BENCHES.items()]
    lines += ["", "Figures and commands: docs/BENCHMARKS.md."]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0 if argv else 2
    if argv[0] not in BENCHES:
        print(f"kvswap bench: unknown bench {argv[0]!r}\n\n{usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(f"kvswap.bench.{argv[0]}")
    return int(module.main(argv[1:]))
