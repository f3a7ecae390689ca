"""Fixtures shared by every test kind: quiet libllama, the real SmolLM2 model."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(scope="session", autouse=True)
def _route_libllama_logs() -> None:
    from kvswap.backend.liblog import route_libllama_logs

    route_libllama_logs(logging.WARNING)


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    from kvswap.models import default_model_path

    return default_model_path()


@pytest.fixture(scope="session")
def smollm2(smollm2_path: Path) -> Iterator[object]:
    from kvswap.backend.model import Model

    model = Model.load(smollm2_path)
    yield model
    model.close()
