"""The console script: `kvswap --version`, `kvswap bench --help` lists every bench with a line."""

from __future__ import annotations

import pkgutil

import pytest

import kvswap.bench
from kvswap import __version__
from kvswap.bench.cli import BENCHES
from kvswap.bench.cli import main as bench_main
from kvswap.cli import main


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"kvswap {__version__}"


def test_bench_help_lists_every_bench_with_a_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench_main(["--help"]) == 0
    out = capsys.readouterr().out
    modules = {m.name for m in pkgutil.iter_modules(kvswap.bench.__path__)}
    # Every bench module is listed (the helpers are not benches).
    helpers = {"cli", "server", "progress", "minds_script", "minds_report", "cluster_floor",
               "stateful_report", "coding_report", "switch_floors"}  # fmt: skip
    assert set(BENCHES) == modules - helpers
    for name, what in BENCHES.items():
        assert f"  {name}" in out and what in out
    assert bench_main(["nope"]) == 2
    assert "unknown bench 'nope'" in capsys.readouterr().err
