#!/usr/bin/env python3
"""Stands in for the llama-server binary in llama.cpp's server test suite.

The suite starts `$LLAMA_SERVER_BIN_PATH` with llama-server's flags and names its models by hub
repository (`--hf-repo R [--hf-file F]`); no machine here reaches a hub. This launcher replaces
those two flags with `--model PATH` from the map `standins.prepare` wrote
(`$KVSWAP_COMPAT_MODELS`), adds `--threads 1` unless a thread count is given (2-core machines),
and execs the server under test, `$KVSWAP_COMPAT_SERVER` (a command line: the pinned
llama-server binary, or `kvswap serve`). Every other flag passes through unchanged, so both
servers see the same command line. A hub model with no stand-in is refused with one line.

Standard library only: it runs once per test, before the server, under any Python 3.
"""

from __future__ import annotations

import json
import os
import shlex
import sys


def _take(argv: list[str], names: tuple[str, ...]) -> tuple[list[str], str | None]:
    """Remove every `NAME VALUE` of `names` from argv; the last value wins, as llama-server."""
    rest: list[str] = []
    value: str | None = None
    i = 0
    while i < len(argv):
        if argv[i] in names and i + 1 < len(argv):
            value = argv[i + 1]
            i += 2
            continue
        rest.append(argv[i])
        i += 1
    return rest, value


def rewrite(argv: list[str], models: dict[str, str]) -> list[str]:
    """llama-server's argv with hub models replaced by local files (SystemExit if unknown)."""
    argv, repo = _take(argv, ("-hf", "-hfr", "--hf-repo"))
    argv, hf_file = _take(argv, ("-hff", "--hf-file"))
    if repo is not None:
        path = models.get(f"{repo}|{hf_file or ''}")
        if path is None:
            shown = repo + (f" --hf-file {hf_file}" if hf_file else "")
            raise SystemExit(f"compat launcher: no local model stands in for --hf-repo {shown}")
        argv = ["--model", path, *argv]
    if not any(a in ("-t", "--threads") for a in argv):
        argv = [*argv, "--threads", "1"]
    return argv


def main() -> None:
    server = shlex.split(os.environ["KVSWAP_COMPAT_SERVER"])
    with open(os.environ["KVSWAP_COMPAT_MODELS"], encoding="utf-8") as f:
        models = json.load(f)["models"]
    argv = rewrite(sys.argv[1:], models)
    sys.stdout.flush()
    os.execvp(server[0], [*server, *argv])


if __name__ == "__main__":
    main()
