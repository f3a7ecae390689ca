#!/usr/bin/env bash
# Lint, type-check and run the whole test suite (real libllama, real HTTP servers, real files),
# then llama.cpp's own server test suite against kvswap (scripts/compat.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
# The pinned llama.cpp source setup.sh unpacks (tests/compat/source.py reads the same variable).
export KVSWAP_LLAMA_CPP_SRC="${KVSWAP_LLAMA_CPP_SRC:-$PWD/.cache/llama-cpp-python-0.3.36/vendor/llama.cpp}"
.venv/bin/ruff check src tests
.venv/bin/ruff format --check src tests
.venv/bin/mypy
.venv/bin/pytest -q "$@"
# llama.cpp's own server test suite against kvswap (fails on any test llama-server passes);
# skipped when the arguments pick a subset of kvswap's own tests.
if [ $# -eq 0 ]; then
  bash scripts/compat.sh
fi
