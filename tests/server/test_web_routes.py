"""GET / over HTTP, as llama-server serves its UI: the page and its files (`--webui`), a
folder's files (`--path`), nothing with `--no-webui`, /sw.js always, and every page path open
without an API key (the API behind it still needs one), also under `--api-prefix`."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.server.harness import ServerProcess

pytestmark = [pytest.mark.model, pytest.mark.timeout(120)]

TINY = ("-c", "512", "-np", "1", "-t", "1")
PAGE_FILES = ("index.html", "main.js", "api.js", "chat.js", "minds.js", "markdown.js", "style.css")


def _not_found(resp) -> None:  # type: ignore[no-untyped-def]
    assert resp.status_code == 404, resp.text
    assert resp.json() == {
        "error": {"code": 404, "message": "File Not Found", "type": "not_found_error"}
    }


def _raw_get(server: ServerProcess, target: str, headers: dict[str, str]) -> tuple[int, bytes]:
    """GET with the request target sent exactly as written (no client normalises it)."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        conn.request("GET", target, headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


@contextlib.contextmanager
def serving(
    tmp_path_factory: pytest.TempPathFactory, *args: str, kind: type[ServerProcess] = ServerProcess
) -> Iterator[ServerProcess]:
    """A server for this module's tests only (stopped when done, not at the session's end)."""
    server = kind([*TINY, *args], tmp_path_factory.mktemp("log") / "server.log")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with serving(tmp_path_factory) as server:
        yield server


def test_the_page_and_its_files(page: ServerProcess) -> None:
    index = page.client.get("/")
    assert index.status_code == 200
    assert index.headers["content-type"] == "text/html; charset=utf-8"
    assert "script-src 'self'" in index.headers["content-security-policy"]
    assert '<script type="module" src="web/main.js">' in index.text
    assert page.client.get("/index.html").content == index.content
    for name in PAGE_FILES[1:]:
        resp = page.client.get(f"/web/{name}")
        assert resp.status_code == 200, name
        kind = "text/css" if name.endswith(".css") else "text/javascript"
        assert resp.headers["content-type"] == f"{kind}; charset=utf-8"
    _not_found(page.client.get("/web/nope.js"))
    _not_found(page.client.get("/web/index.html"))  # the page lives at / only
    assert page.client.get("/props").json()["ui"] is True


def test_a_reload_revalidates_with_the_etag(page: ServerProcess) -> None:
    first = page.client.get("/web/main.js")
    again = page.client.get("/web/main.js", headers={"If-None-Match": first.headers["etag"]})
    assert again.status_code == 304 and again.content == b""
    assert first.headers["cache-control"] == "no-cache"


def test_sw_js_unregisters_a_cached_llama_server_ui(page: ServerProcess) -> None:
    resp = page.client.get("/sw.js")
    assert resp.status_code == 200
    assert resp.headers["content-type"].startswith("application/javascript")
    assert "registration.unregister()" in resp.text


def test_no_webui_serves_no_page(tmp_path_factory: pytest.TempPathFactory) -> None:
    with serving(tmp_path_factory, "--no-webui") as server:
        _not_found(server.client.get("/"))
        _not_found(server.client.get("/web/main.js"))
        assert "registration.unregister()" in server.client.get("/sw.js").text
        assert server.client.get("/props").json()["ui"] is False


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("static")
    (root / "index.html").write_text("<p>my own page</p>")
    (root / "docs").mkdir()
    (root / "docs" / "index.html").write_text("<p>docs</p>")
    (root / "app.js").write_text("console.log(1)")
    secret = tmp_path_factory.mktemp("outside") / "secret.txt"
    secret.write_text("not for you")
    os.symlink(secret, root / "link.txt")
    return root


@pytest.fixture(scope="module")
def folder_server(
    tmp_path_factory: pytest.TempPathFactory, folder: Path
) -> Iterator[ServerProcess]:
    with serving(tmp_path_factory, "--path", str(folder), "--api-key", "k") as server:
        yield server


def test_path_serves_a_folder_instead(folder_server: ServerProcess) -> None:
    server = folder_server
    assert server.client.get("/").text == "<p>my own page</p>"  # the page path needs no key
    assert server.client.get("/", headers={"X-Api-Key": "k"}).text == "<p>my own page</p>"
    keyed = {"Authorization": "Bearer k"}
    assert server.client.get("/docs/", headers=keyed).text == "<p>docs</p>"
    app = server.client.get("/app.js", headers=keyed)
    assert app.text == "console.log(1)" and "javascript" in app.headers["content-type"]
    # Not a page path: it needs a key, as llama-server (its public paths are its own UI's).
    assert server.client.get("/app.js").status_code == 401
    _not_found(server.client.get("/missing.txt", headers=keyed))
    _not_found(server.client.get("/link.txt", headers=keyed))  # a link out of the folder
    # audit B8: a NUL in the path was an unhandled 500
    for target in ("/../outside0/secret.txt", "/%2e%2e/outside0/secret.txt", "/docs/../../x",
                   "/app%00.js"):  # fmt: skip
        status, body = _raw_get(server, target, keyed)
        assert status == 404 and json.loads(body)["error"]["type"] == "not_found_error", target
    assert server.client.get("/health").json() == {"status": "ok"}  # API routes come first
    assert "registration.unregister()" in server.client.get("/sw.js").text


class PrefixedServer(ServerProcess):
    """A server under `--api-prefix /p`: its /health is /p/health."""

    def wait_ready(self, timeout_s: float = 120) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log()}")
            with contextlib.suppress(httpx.TransportError):
                if self.client.get("/p/health").status_code == 200:
                    return
            time.sleep(0.1)
        raise TimeoutError(f"server not ready:\n{self.log()}")


@pytest.fixture(scope="module")
def prefixed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    args = ("--api-key", "k", "--api-prefix", "/p")
    with serving(tmp_path_factory, *args, kind=PrefixedServer) as server:
        yield server


def test_page_paths_need_no_key_under_an_api_prefix(prefixed: ServerProcess) -> None:
    server = prefixed
    index = server.client.get("/p/")
    assert index.status_code == 200 and "web/main.js" in index.text
    for path in ("/p/index.html", "/p/web/main.js", "/p/web/style.css", "/p/sw.js"):
        assert server.client.get(path).status_code == 200, path
    bare = server.client.get("/p")  # relative links need the slash
    assert bare.status_code == 308 and bare.headers["location"] == "/p/"
    for path in ("/p/pages", "/p/props", "/p/web/nope.js"):
        resp = server.client.get(path)
        assert resp.status_code == 401, path
        assert resp.json()["error"]["type"] == "authentication_error"
    assert server.client.get("/p/pages", headers={"X-Api-Key": "k"}).status_code == 200
