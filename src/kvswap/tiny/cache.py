"""A content-addressed folder of generated tiny models, shared by tests and benchmarks.

Owns `tiny_model_path()`: resolve the parameters, name the file by a hash of them and
GENERATOR_VERSION, and generate it only if it is not there yet. The folder is
`$KVSWAP_CACHE_DIR/tiny-models/` when that variable is set, else `<repo>/.cache/tiny-models/`
(git-ignored), else `~/.cache/kvswap/tiny-models/` outside a checkout. Safe under concurrent
callers without locks: the writer renames a complete temporary file into place, and two
processes that race write identical bytes, so whichever rename lands last changes nothing.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from kvswap.tiny.params import TinyParams
from kvswap.tiny.writer import GENERATOR_VERSION, resolve_params, write_tiny_gguf

CACHE_DIR_ENV = "KVSWAP_CACHE_DIR"
TINY_MODELS_SUBDIR = "tiny-models"


def _repo_root() -> Path | None:
    for parent in Path(__file__).resolve().parents:
        if (parent / "pyproject.toml").is_file() and (parent / "src" / "kvswap").is_dir():
            return parent
    return None


def cache_root() -> Path:
    env = os.environ.get(CACHE_DIR_ENV)
    if env:
        return Path(env)
    repo = _repo_root()
    if repo is not None:
        return repo / ".cache"
    return Path.home() / ".cache" / "kvswap"


def tiny_models_dir() -> Path:
    return cache_root() / TINY_MODELS_SUBDIR


def cache_key(params: TinyParams) -> str:
    """Hash of the resolved parameters: defaults spelled out or not give the same key."""
    _, geometry = resolve_params(params)
    doc = {"generator_version": GENERATOR_VERSION, **geometry.as_dict()}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:20]


def tiny_model_path(arch: str, **params: object) -> Path:
    """Path of the tiny model `TinyParams(arch, **params)`, generated on first use.

    Raises TinyModelError for a request that cannot be generated, TypeError for an unknown
    parameter name.
    """
    request = TinyParams(arch, **params)  # type: ignore[arg-type]
    folder = tiny_models_dir()
    path = folder / f"{arch}-{cache_key(request)}.gguf"
    if not path.is_file():
        folder.mkdir(parents=True, exist_ok=True)
        write_tiny_gguf(path, request)
    return path
