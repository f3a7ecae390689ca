#!/usr/bin/env bash
# Lint, type-check and run the whole test suite (real libllama, real HTTP servers, real files).
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/ruff check src tests
.venv/bin/ruff format --check src tests
.venv/bin/mypy
.venv/bin/pytest -q "$@"
