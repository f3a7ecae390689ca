"""Server fixtures: real `kvswap serve` subprocesses, shared per configuration."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.server.harness import ServerProcess

if TYPE_CHECKING:
    from tests.server.browser import Browser

# A small, fast default: 4 slots of 1024 tokens, one stream each, 2 threads.
SMALL_ARGS = ("-c", "4096", "-np", "4", "-t", "2", "-tb", "2", "-ub", "128", "--metrics")


@pytest.fixture(scope="session")
def server_factory(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Callable[..., ServerProcess]]:
    servers: dict[tuple[str, ...], ServerProcess] = {}

    def get(
        *args: str,
        save_path: bool = False,
        fresh: bool = False,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
    ) -> ServerProcess:
        full = list(args)
        if save_path:
            slots = tmp_path_factory.mktemp("slots")
            full += ["--slot-save-path", str(slots)]
        key = tuple(args) + (("save",) if save_path else ())
        if fresh or key not in servers:
            log = tmp_path_factory.mktemp("log") / "server.log"
            server = ServerProcess(full, log, env, cwd)
            if fresh:
                servers[(*key, str(id(server)))] = server
            else:
                servers[key] = server
            return server
        return servers[key]

    yield get
    for server in servers.values():
        server.stop()


@pytest.fixture()
def start(tmp_path: Path) -> Iterator[Callable[..., ServerProcess]]:
    """Servers of one test, each started afresh (`save`: a `--slot-save-path` folder, made if
    missing) and stopped when the test ends."""
    started: list[ServerProcess] = []

    def get(*args: str, save: Path | None = None) -> ServerProcess:
        if save is not None:
            save.mkdir(exist_ok=True)
        full = [*args] + (["--slot-save-path", str(save)] if save is not None else [])
        server = ServerProcess(full, tmp_path / f"server{len(started)}.log")
        started.append(server)
        return server

    yield get
    for server in started:
        server.stop()


@pytest.fixture(scope="session")
def small_server(server_factory: Callable[..., ServerProcess]) -> ServerProcess:
    return server_factory(*SMALL_ARGS, save_path=True)


@pytest.fixture()
def save_dir(small_server: ServerProcess) -> Path:
    return Path(small_server.args[small_server.args.index("--slot-save-path") + 1])


@pytest.fixture(scope="session")
def agent_server(server_factory: Callable[..., ServerProcess]) -> ServerProcess:
    """SmolLM2 for the agent API tests: 2 slots, one thread (two threads contend on 2 cores)."""
    from tests.server.agent_util import SMALL

    return server_factory(*SMALL)


@pytest.fixture(scope="session")
def shots(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[Path]:
    """The folder of the web page tests' screenshots, printed at the end of the run."""
    folder = tmp_path_factory.mktemp("webui-screenshots")
    yield folder
    plugins = request.config.pluginmanager
    reporter = plugins.get_plugin("terminalreporter")
    capture = plugins.get_plugin("capturemanager")
    if reporter is not None and capture is not None:
        with capture.global_and_fixture_disabled():
            n_shots = len(list(folder.glob("*.png")))
            reporter.write_line(f"\nweb page screenshots ({n_shots}): {folder}")


@pytest.fixture()
def browser(shots: Path, request: pytest.FixtureRequest) -> Iterator[Browser]:
    """A headless Chromium for one test; its screenshots are named after the test."""
    from tests.server.browser import open_browser  # selenium, only for the web page's tests

    with open_browser(shots, request.node.name.removeprefix("test_")) as b:
        yield b
