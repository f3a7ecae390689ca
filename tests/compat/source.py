"""Where the pinned llama.cpp source lies: the one place tests and scripts look for it.

`scripts/setup.sh` unpacks the llama-cpp-python 0.3.36 sdist into
`.cache/llama-cpp-python-0.3.36/` (git-ignored); its llama.cpp tree is
`.cache/llama-cpp-python-0.3.36/vendor/llama.cpp`. `$KVSWAP_LLAMA_CPP_SRC` names another tree
(scripts/compat.sh reads the same variable and default). `require_llama_cpp_src()` is what a
test calls: the tree, or a failure under CI (setup.sh should have fetched it), or a skip on a
developer machine that has not run setup.sh since this was added.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LLAMA_CPP_SRC_ENV = "KVSWAP_LLAMA_CPP_SRC"
DEFAULT_LLAMA_CPP_SRC = REPO / ".cache" / "llama-cpp-python-0.3.36" / "vendor" / "llama.cpp"


def llama_cpp_src() -> Path:
    """The pinned llama.cpp tree (it may not exist)."""
    return Path(os.environ.get(LLAMA_CPP_SRC_ENV) or DEFAULT_LLAMA_CPP_SRC)


def require_llama_cpp_src() -> Path:
    root = llama_cpp_src()
    if not (root / "common" / "arg.cpp").is_file():
        message = f"the pinned llama.cpp source is not at {root} (run scripts/setup.sh)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return root
