"""A pytest plugin for the compat run: writes each test's outcome as one JSON line.

Loaded into the pinned suite's pytest with `-p results_plugin` (scripts/compat.sh puts this
folder on PYTHONPATH); `$KVSWAP_COMPAT_RESULTS` is the file written. One line per test id:
`{"id": "unit/test_basic.py::test_server_props", "outcome": "passed"}`, the outcome being
passed, failed (the call or its setup/teardown failed) or skipped.
"""

from __future__ import annotations

import json
import os

import pytest

_outcomes: dict[str, str] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    previous = _outcomes.get(report.nodeid)
    if report.failed:
        _outcomes[report.nodeid] = "failed"
    elif report.skipped and previous is None:
        _outcomes[report.nodeid] = "skipped"
    elif report.when == "call" and report.passed and previous is None:
        _outcomes[report.nodeid] = "passed"


def pytest_sessionfinish(session: pytest.Session) -> None:
    if hasattr(session.config, "workerinput"):
        return  # an xdist worker: its reports reach the controller, which writes the file
    with open(os.environ["KVSWAP_COMPAT_RESULTS"], "w", encoding="utf-8") as f:
        for test_id, outcome in _outcomes.items():
            f.write(json.dumps({"id": test_id, "outcome": outcome}) + "\n")
