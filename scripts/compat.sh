#!/usr/bin/env bash
# Runs llama.cpp's own server test suite (the pinned llama-cpp-python 0.3.36 sdist, fetched by
# scripts/setup.sh) against kvswap, tiny local models standing in for the hub models, and fails
# on any test that the pinned llama-server passes on the same models and kvswap does not
# (tests/compat/llama-server-passes.txt; deliberate differences: tests/compat/differences.txt,
# explained in docs/COMPAT.md).
#
#   scripts/compat.sh                     check kvswap on the tests llama-server passes (test.sh)
#   scripts/compat.sh --all               check kvswap on every test of the files
#   scripts/compat.sh --measure BINARY    run every test against a llama-server binary and
#                                         rewrite the pass list
#   scripts/compat.sh --table             --all, then print docs/COMPAT.md's per-file tables
#
# KVSWAP_LLAMA_CPP_SRC: the pinned llama.cpp tree (default
#   .cache/llama-cpp-python-0.3.36/vendor/llama.cpp, where setup.sh unpacks the sdist).
# COMPAT_FILES: suite files to run instead of the list below (space-separated, unit/...).
# COMPAT_PYTEST_ARGS: extra pytest arguments (e.g. "--tb=short -x").
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
SRC="${KVSWAP_LLAMA_CPP_SRC:-$ROOT/.cache/llama-cpp-python-0.3.36/vendor/llama.cpp}"
SUITE="$SRC/tools/server/tests"
if [ ! -d "$SUITE/unit" ]; then
  echo "compat: llama.cpp's server test suite is not at $SUITE (scripts/setup.sh fetches it)" >&2
  exit 1
fi

# The files a CPU and a tiny model can run (docs/COMPAT.md says why the others are left out).
DEFAULT_FILES="unit/test_basic.py unit/test_completion.py unit/test_chat_completion.py
  unit/test_slot_save.py unit/test_tokenize.py unit/test_metrics.py unit/test_security.py
  unit/test_stream.py unit/test_ignore_eos.py unit/test_ctx_shift.py
  unit/test_kv_keep_only_active.py unit/test_template.py unit/test_tool_call.py
  unit/test_compat_anthropic.py unit/test_compat_oai_responses.py unit/test_compat_gcp.py
  unit/test_speculative.py unit/test_lora.py unit/test_infill.py unit/test_router.py
  unit/test_sleep.py unit/test_proxy.py"
read -r -a FILES <<< "$(echo ${COMPAT_FILES:-$DEFAULT_FILES})"

MODE=check
SERVER="$ROOT/.venv/bin/kvswap serve"
case "${1:-}" in
  --measure) MODE=measure; SERVER="$(realpath "${2:?--measure needs the llama-server binary}")" ;;
  --table) MODE=table ;;
  --all) MODE=all ;;
  "") ;;
  *) echo "usage: scripts/compat.sh [--all | --measure LLAMA_SERVER_BINARY | --table]" >&2; exit 2 ;;
esac
# The check runs only the tests of the pass list (a server starts per test: this halves the
# cost); the other modes run the files whole.
TARGETS=("${FILES[@]}")
if [ "$MODE" = check ]; then
  mapfile -t TARGETS < <(.venv/bin/python tests/compat/report.py ids "${FILES[@]}")
fi

WORK="$ROOT/.cache/compat"
mkdir -p "$WORK"
RESULTS="$WORK/results-$MODE.jsonl"
rm -f "$RESULTS"
.venv/bin/python -m tests.compat.standins "$SUITE" "$WORK/models.json"

export LLAMA_SERVER_BIN_PATH="$ROOT/tests/compat/launcher.py"
export KVSWAP_COMPAT_SERVER="$SERVER"
export KVSWAP_COMPAT_MODELS="$WORK/models.json"
export KVSWAP_COMPAT_RESULTS="$RESULTS"
export PYTHONPATH="$ROOT/tests/compat"
# A port nobody else on this machine uses (the suite defaults to 8080).
PORT="$(.venv/bin/python -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
export PORT

echo "compat: running ${#TARGETS[@]} tests or files of $SUITE against: $SERVER"
start_s=$(date +%s)
set +e
(cd "$SUITE" && "$ROOT/.venv/bin/python" -m pytest -p results_plugin -p no:cacheprovider \
  -q --tb=no -o timeout=180 ${COMPAT_PYTEST_ARGS:-} "${TARGETS[@]}")
rc=$?
set -e
echo "compat: the suite took $(( $(date +%s) - start_s )) s"
# 0: all passed, 1: some failed (judged below); anything else is a broken run.
if [ "$rc" -gt 1 ]; then
  echo "compat: pytest stopped with status $rc" >&2
  exit "$rc"
fi

if [ "$MODE" = measure ]; then
  exec .venv/bin/python tests/compat/report.py measure "$RESULTS" \
    "scripts/compat.sh --measure $SERVER  (files: ${FILES[*]})"
fi
.venv/bin/python tests/compat/report.py check "$RESULTS" "${FILES[@]}" && ok=0 || ok=$?
if [ "$MODE" = table ]; then
  .venv/bin/python tests/compat/report.py table "$RESULTS" "${FILES[@]}"
fi
exit "$ok"
