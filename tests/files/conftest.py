"""Fixtures for the kvswap.files tests: a save path with a sentinel folder beside it."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A folder beside the save path that kvswap must never read or write."""
    path = tmp_path / "outside"
    path.mkdir()
    (path / "secret").write_bytes(b"secret bytes that must never be read or replaced")
    return path


@pytest.fixture
def save_dir(tmp_path: Path, outside: Path) -> Path:
    path = tmp_path / "save"
    path.mkdir()
    return path
