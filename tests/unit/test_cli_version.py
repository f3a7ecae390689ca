"""`kvswap --version` prints the version pip installed (pyproject's, not a stale constant)."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import version

import pytest

pytestmark = [pytest.mark.timeout(60)]


def test_version_matches_the_installed_distribution() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "kvswap", "--version"], capture_output=True, text=True, timeout=30
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"kvswap {version('kvswap')}"
