"""The web page's settings and plumbing without a server: `--webui`/`--path` as llama-server
reads them, the packaged files and their paths, and the guard letting page paths through."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from kvswap.config import ConfigError, MachineInfo, ServerConfig, parse_serve_args
from kvswap.server import routes_web
from kvswap.server.guard import Guard
from kvswap.web import load_assets, page_paths

HOST = MachineInfo(physical_ram_bytes=16 << 30, n_cpu_physical=4, n_cpu_logical=8)


def parse(argv: Sequence[str] = (), env: Mapping[str, str] | None = None) -> ServerConfig:
    return parse_serve_args(list(argv), env or {}, machine=HOST)


@pytest.mark.parametrize(
    ("argv", "env", "webui"),
    [
        ([], {}, True),
        (["--no-webui"], {}, False),
        (["--no-ui"], {}, False),
        (["--no-ui", "--webui"], {}, True),
        (["--ui"], {"LLAMA_ARG_UI": "0"}, True),  # the command line beats the environment
        ([], {"LLAMA_ARG_UI": "false"}, False),
        ([], {"LLAMA_ARG_NO_UI": "1"}, False),
    ],
)
def test_webui_toggle(argv: list[str], env: dict[str, str], webui: bool) -> None:
    cfg = parse(argv, env)
    assert cfg.http.webui is webui
    assert cfg.ignored_flags == ()


def test_path_must_be_a_folder_while_the_ui_is_on(tmp_path: Path) -> None:
    assert parse(["--path", str(tmp_path)]).http.static_path == str(tmp_path)
    assert parse([], {"LLAMA_ARG_STATIC_PATH": str(tmp_path)}).http.static_path == str(tmp_path)
    empty = parse([], {"LLAMA_ARG_STATIC_PATH": ""})
    assert empty.http.static_path is None  # llama-server: an empty path is the built-in page
    missing = str(tmp_path / "nope")
    with pytest.raises(ConfigError, match=r"--path: static assets path not found: .*nope"):
        parse(["--path", missing])
    # Checked once parsing is done, so the flags' order does not matter (llama-server's start).
    assert parse(["--path", missing, "--no-webui"]).http.webui is False


def test_the_page_ships_in_the_package_and_stays_small() -> None:
    assets = load_assets()
    assert {"index.html", "main.js", "markdown.js", "style.css"} <= set(assets)
    assert assets["index.html"].content_type == "text/html; charset=utf-8"
    assert assets["main.js"].content_type == "text/javascript; charset=utf-8"
    assert sum(len(a.body) for a in assets.values()) < 300_000
    paths = page_paths()
    assert {"/", "/index.html", "/sw.js", "/web/main.js", "/web/style.css"} <= paths
    assert "/web/index.html" not in paths and "/pages" not in paths


class FakeSleeper:
    """Counts the requests that woke the server (`enter`)."""

    sleeping = True

    def __init__(self) -> None:
        self.n_entered = 0

    async def enter(self) -> None:
        self.n_entered += 1

    def leave(self) -> None:
        pass


def _serve(guard: Guard, path: str, headers: Sequence[tuple[bytes, bytes]] = ()) -> int:
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Any) -> None:
        sent.append(dict(message))

    scope = {"type": "http", "path": path, "method": "GET", "headers": list(headers)}
    asyncio.run(guard(scope, receive, send))
    return int(sent[0]["status"])


def _guard(ready: bool, sleeper: FakeSleeper | None = None) -> Guard:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    return Guard(
        app,
        api_keys=("k",),
        api_prefix="",
        max_body_bytes=1024,
        is_ready=lambda: ready,
        sleeper=sleeper,  # type: ignore[arg-type]
        page_paths=page_paths(),
    )


def test_page_paths_need_no_key_and_load_while_the_model_loads() -> None:
    loading = _guard(ready=False)
    assert _serve(loading, "/") == 200 and _serve(loading, "/web/main.js") == 200
    assert _serve(loading, "/props") == 503
    ready = _guard(ready=True)
    assert _serve(ready, "/") == 200 and _serve(ready, "/sw.js") == 200
    assert _serve(ready, "/pages") == 401 and _serve(ready, "/web/other.js") == 401
    assert _serve(ready, "/pages", [(b"authorization", b"Bearer k")]) == 200


def test_loading_the_page_does_not_wake_a_sleeping_server() -> None:
    sleeper = FakeSleeper()
    guard = _guard(ready=True, sleeper=sleeper)
    assert _serve(guard, "/") == 200 and _serve(guard, "/web/chat.js") == 200
    assert sleeper.n_entered == 0
    assert _serve(guard, "/pages", [(b"x-api-key", b"k")]) == 200
    assert sleeper.n_entered == 1  # the page's API calls do


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_wheel_carries_the_page(tmp_path: Path) -> None:
    """Built from a copy of the sources (the tree stays clean): every page file is inside."""
    repo = Path(__file__).resolve().parents[2]
    shutil.copytree(
        repo / "src", tmp_path / "src", ignore=shutil.ignore_patterns("*.egg-info", "__pycache__")
    )
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(repo / name, tmp_path / name)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
         "-w", str(tmp_path / "dist"), str(tmp_path)],
        check=True, capture_output=True, timeout=170,
    )  # fmt: skip
    (wheel,) = (tmp_path / "dist").glob("kvswap-*.whl")
    with zipfile.ZipFile(wheel) as z:
        shipped = {n.removeprefix("kvswap/web/assets/") for n in z.namelist() if "/assets/" in n}
    assert shipped == set(load_assets())


def test_a_link_swapped_in_after_the_check_is_not_followed(tmp_path: Path) -> None:
    """Audit B8: a `--path` file was checked by its resolved path, then opened by name, so a
    symbolic link swapped in between was followed out of the folder; it is now opened one
    component at a time without following links."""
    root = tmp_path / "static"
    (root / "docs").mkdir(parents=True)
    (root / "docs" / "page.html").write_text("<p>mine</p>")
    outside = tmp_path / "secret.txt"
    outside.write_text("not for you")
    checked = routes_web._folder_file(str(root), "docs/page.html")
    assert checked is not None
    assert routes_web._open_under(str(root), checked) == b"<p>mine</p>"
    (root / "docs" / "page.html").unlink()
    (root / "docs" / "page.html").symlink_to(outside)  # swapped after the check
    assert routes_web._open_under(str(root), checked) is None
    (root / "docs" / "page.html").unlink()
    (root / "docs").rmdir()
    (root / "docs").symlink_to(tmp_path)  # a folder on the way swapped too
    assert routes_web._open_under(str(root), checked) is None
