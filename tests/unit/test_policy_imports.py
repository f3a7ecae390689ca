"""The policy objects build without libllama: importing the seating, the anonymous cache, the
reconfigurer, the demoter, the shared tier's local copies and the CPU stand-ins loads no
`llama_cpp` (they take the narrow views of `engine.ports` and `engine.handle`, not the runtime
or the engine). A subprocess, so this test's own imports do not count.

Defect caught: a manager importing the runtime (or the engine) again for a type, which puts
libllama back under every CPU test of its decisions.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(120)

POLICY_MODULES = (
    "kvswap.engine.seats.seating",
    "kvswap.engine.seats.anoncache",
    "kvswap.engine.reconfigure",
    "kvswap.tiers.demoter",
    "kvswap.tiers.shared.local",
    "tests.unit.standins",
)

_CODE = f"""
import json, sys
for name in {POLICY_MODULES!r}:
    __import__(name)
print(json.dumps(sorted(m for m in sys.modules if m.startswith(("llama_cpp", "kvswap.backend")))))
"""


def test_the_policy_objects_import_no_libllama() -> None:
    out = subprocess.run(
        [sys.executable, "-c", _CODE], capture_output=True, text=True, timeout=100, check=True
    )
    loaded = json.loads(out.stdout.strip().splitlines()[-1])
    assert loaded == ["kvswap.backend", "kvswap.backend.info"]
