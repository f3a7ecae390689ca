"""GET / : kvswap's web page (`--webui`), or a folder's files (`--path`), and /sw.js.

As llama-server (`server-http.cpp`): with the UI on, `/` and `/index.html` serve the page and
`/web/NAME` its files (`kvswap.web`); `--path DIR` serves DIR's files at `/` instead (a
folder's `index.html` for a folder); `--no-webui` serves neither (a typed 404). `/sw.js` always
answers: DIR's own `sw.js` if it has one, else a service worker that unregisters itself, so a
browser that ran llama-server's web UI on this address drops the UI it cached and loads this
one. The guard serves these paths without an API key and while the model loads.

Unlike llama-server, whose file handler runs before its routes, API routes win over files of
`--path` with the same name. Files are read on worker threads, opened one path component at a
time from the folder's descriptor without following a symbolic link (a link swapped in after
the check is refused, not followed out of the folder).
"""

from __future__ import annotations

import asyncio
import mimetypes
import os

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response

from kvswap.config.settings import HttpSettings
from kvswap.core.errors import ErrorKind, KvswapError
from kvswap.web import ASSET_PREFIX, INDEX, SERVICE_WORKER, Asset, load_assets

# What the page may load and run: only its own files and its own server (no inline script, no
# other origin), so even markup that slipped past the Markdown renderer could not run.
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)

# llama-server's sw_remove_js: unregister, empty the caches, reload the open pages.
_SW_REMOVE_JS = b"""
self.addEventListener('install', () => self.skipWaiting());
self.addEventListener('activate', (e) => e.waitUntil((async () => {
    await self.registration.unregister();
    for (const key of await caches.keys()) await caches.delete(key);
    for (const c of await self.clients.matchAll({ type: 'window' })) c.navigate(c.url);
})()));
"""


def _not_found() -> KvswapError:
    return KvswapError(ErrorKind.NOT_FOUND, "File Not Found")


def _asset_response(asset: Asset, request: Request) -> Response:
    headers = {
        "ETag": asset.etag,
        "Cache-Control": "no-cache",  # revalidated on every load: a new kvswap shows its page
        "X-Content-Type-Options": "nosniff",
        "Content-Security-Policy": CONTENT_SECURITY_POLICY,
        "Referrer-Policy": "no-referrer",
    }
    if request.headers.get("if-none-match") == asset.etag:
        return Response(status_code=304, headers=headers)
    return Response(asset.body, media_type=asset.content_type, headers=headers)


def _page_routes(router: APIRouter) -> None:
    assets = load_assets()
    index = assets[INDEX]

    @router.get("/", include_in_schema=False)
    @router.get("/" + INDEX, include_in_schema=False)
    async def page(request: Request) -> Response:
        raw_path: bytes = request.scope.get("raw_path") or b"/"
        if raw_path.endswith((b"/", b"/" + INDEX.encode())):
            return _asset_response(index, request)
        # `--api-prefix /p` serves `/p` as `/`: the page's relative links need `/p/`.
        return RedirectResponse(request.scope.get("root_path", "") + "/", status_code=308)

    @router.get(ASSET_PREFIX + "{name}", include_in_schema=False)
    async def asset(name: str, request: Request) -> Response:
        found = assets.get(name)
        if found is None or name == INDEX:
            raise _not_found()
        return _asset_response(found, request)


def _folder_file(root: str, rel: str) -> str | None:
    """The file `rel` names under `root` (a folder's index.html), or None; never outside
    `root`, symbolic links included (a NUL in the name names nothing)."""
    try:
        base = os.path.realpath(root)
        target = os.path.realpath(os.path.join(base, rel.lstrip("/")))
    except ValueError:  # an embedded NUL
        return None
    if os.path.commonpath([base, target]) != base:
        return None
    if os.path.isdir(target):
        target = os.path.join(target, INDEX)
    return target if os.path.isfile(target) else None


def _open_under(root: str, path: str) -> bytes | None:
    """The bytes of `path` (resolved, under `root`), opened one component at a time from
    `root`'s descriptor without following a symbolic link: a link swapped in after
    `_folder_file` looked is refused (None), never followed out of the folder."""
    base = os.path.realpath(root)
    parts = os.path.relpath(path, base).split(os.sep)
    fd = os.open(base, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for i, part in enumerate(parts):
            last = i == len(parts) - 1
            flags = os.O_RDONLY | os.O_NOFOLLOW | (0 if last else os.O_DIRECTORY)
            try:
                nxt = os.open(part, flags, dir_fd=fd)
            except OSError:
                return None
            os.close(fd)
            fd = nxt
        with os.fdopen(fd, "rb", closefd=False) as f:
            return f.read()
    finally:
        os.close(fd)


def _folder_response(root: str, rel: str, headers: dict[str, str] | None = None) -> Response | None:
    found = _folder_file(root, rel)
    data = _open_under(root, found) if found is not None else None
    if found is None or data is None:
        return None
    media = mimetypes.guess_type(found)[0] or "application/octet-stream"
    return Response(data, media_type=media, headers=headers)


def _folder_routes(router: APIRouter, root: str) -> None:
    @router.get("/{rel:path}", include_in_schema=False)
    async def folder(rel: str) -> Response:
        found = await asyncio.to_thread(_folder_response, root, rel)
        if found is None:
            raise _not_found()
        return found


def router(http: HttpSettings) -> APIRouter:
    """The routes of `/` for these settings; include it after every API router (a `--path`
    folder answers every GET path no API route took)."""
    out = APIRouter()
    folder = http.static_path if http.webui else None

    @out.get(SERVICE_WORKER, include_in_schema=False)
    async def service_worker() -> Response:
        if folder is not None:
            own = await asyncio.to_thread(
                _folder_response, folder, "sw.js", {"Cache-Control": "no-cache"}
            )
            if own is not None:
                return own
        return Response(
            _SW_REMOVE_JS,
            media_type="application/javascript",
            headers={"Cache-Control": "no-cache"},
        )

    if folder is not None:
        _folder_routes(out, folder)
    elif http.webui:
        _page_routes(out)
    return out
