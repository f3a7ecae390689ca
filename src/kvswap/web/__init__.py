"""kvswap's web page: the files served at `/` (`--webui`), shipped inside the package.

Owns the page's files (`assets/`: `index.html`, the style sheet and the ES modules, written by
hand: no build step, no CDN, nothing fetched at install or run time), their content types and
ETags, and the URL paths they are served under: the page at `/` and `/index.html`, every other
file at `/web/NAME`. The files are read once through `importlib.resources`, so an installed
wheel serves what the source tree does. Pure data: `kvswap.server.routes_web` serves it and the
guard lets `page_paths()` through without an API key.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from importlib import resources
from importlib.resources.abc import Traversable

INDEX = "index.html"
ASSET_PREFIX = "/web/"  # every file but index.html is served under it
SERVICE_WORKER = "/sw.js"  # always answered (routes_web): llama-server's web UI registers one

_CONTENT_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".svg": "image/svg+xml",
    ".png": "image/png",
}


@dataclass(frozen=True)
class Asset:
    """One file of the page."""

    name: str  # file name under assets/, e.g. "main.js"
    body: bytes
    content_type: str
    etag: str  # a strong ETag from the content (quoted, as HTTP wants it)


def _asset_files() -> list[Traversable]:
    folder = resources.files(__package__).joinpath("assets")
    return sorted((f for f in folder.iterdir() if f.is_file()), key=lambda f: f.name)


def _content_type(name: str) -> str:
    suffix = name[name.rfind(".") :]
    return _CONTENT_TYPES.get(suffix, "application/octet-stream")


def load_assets() -> dict[str, Asset]:
    """Every file of the page by name, read from the installed package."""
    out = {}
    for f in _asset_files():
        body = f.read_bytes()
        etag = '"' + hashlib.sha256(body).hexdigest()[:32] + '"'
        out[f.name] = Asset(f.name, body, _content_type(f.name), etag)
    return out


def asset_path(name: str) -> str:
    """The URL path a file of the page is served under."""
    return "/" if name == INDEX else ASSET_PREFIX + name


def page_paths() -> frozenset[str]:
    """The paths the page loads from, which llama-server serves without a key: `/`,
    `/index.html`, `/sw.js` and every file under `/web/`."""
    names = [f.name for f in _asset_files()]
    return frozenset({"/", "/" + INDEX, SERVICE_WORKER, *(asset_path(n) for n in names)})
