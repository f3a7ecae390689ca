"""What a cold start imports: kvswap's server loads libllama's bindings, not llama-cpp-python's
high-level API (`Llama`, its chat formats and jinja2), which cost most of the package's import
time. A subprocess, so this test's own imports do not count."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(120)

_CODE = """
import json, sys
import kvswap.serve, kvswap.server.loader, kvswap.server.app
import llama_cpp
print(json.dumps({
    "modules": sorted(m for m in sys.modules if m.startswith("llama_cpp")),
    "max_devices": llama_cpp.llama_max_devices(),
}))
"""


def test_the_server_imports_only_the_bindings_of_llama_cpp() -> None:
    out = subprocess.run(
        [sys.executable, "-c", _CODE], capture_output=True, text=True, timeout=100, check=True
    )
    found = json.loads(out.stdout.strip().splitlines()[-1])
    assert found["modules"] == ["llama_cpp", "llama_cpp._ctypes_extensions", "llama_cpp.llama_cpp"]
    assert found["max_devices"] >= 1  # `import llama_cpp` afterwards still reaches libllama
