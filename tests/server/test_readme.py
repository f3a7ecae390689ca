"""Every command of the README runs as written, on a fresh checkout (what CI has).

The README's `sh` blocks are read in order and each line is run with bash in a new folder that
holds only `.venv` (a fresh clone's, as `scripts/setup.sh` made it): a `kvswap serve` line starts
a server (on a free port instead of 8080, which the `curl` lines after it are pointed at) and
waits for /health, as a `kvswap cluster up` line does on its HAProxy port; every other line must
exit 0, and an answer must not be an error. The two lines CI runs itself are not run here:
`scripts/setup.sh` (CI ran it first) and `scripts/test.sh` (the suite this test belongs to).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.server.harness import REPO, free_port

pytestmark = [pytest.mark.model, pytest.mark.timeout(600)]

SETUP = "bash scripts/setup.sh && "
SUITE = "bash scripts/test.sh"


def readme_commands() -> list[str]:
    """The command lines of the README's `sh` blocks, comments cut, in order."""
    text = (REPO / "README.md").read_text()
    lines = []
    for block in re.findall(r"```sh\n(.*?)```", text, re.S):
        for line in block.splitlines():
            line = re.sub(r"\s{2,}#.*$", "", line).strip()
            if line:
                lines.append(line)
    return lines


class Shell:
    """Runs README lines in one folder; at most one server in the background."""

    def __init__(self, cwd: Path) -> None:
        self.cwd = cwd
        self.port = 8080
        self.server: subprocess.Popen[bytes] | None = None
        self.n_run = 0

    def run(self, line: str) -> None:
        if line.startswith(SETUP):
            line = line.removeprefix(SETUP)
        if line == SUITE:
            return
        if re.search(r"kvswap (serve|cluster up)(?!.*--help)", line):
            self.serve(line)
            return
        line = line.replace("localhost:8080", f"localhost:{self.port}")
        run = subprocess.run(
            ["bash", "-c", line], cwd=self.cwd, capture_output=True, text=True, timeout=300
        )
        assert run.returncode == 0, (line, run.stdout[-2000:], run.stderr[-2000:])
        assert '"error"' not in run.stdout, (line, run.stdout[-2000:])
        self.n_run += 1

    def serve(self, line: str) -> None:
        self.stop()
        self.port = free_port()
        # `kvswap cluster up --port 8080`: HAProxy's port moves (its replicas take the next ones)
        if "--port 8080" in line:
            line = line.replace("--port 8080", f"--port {self.port}")
        else:
            line = f"{line} --port {self.port}"
        self.server = subprocess.Popen(
            ["bash", "-c", line],
            cwd=self.cwd,
            stdout=open(self.cwd / f"server-{self.port}.log", "wb"),  # noqa: SIM115
            stderr=subprocess.STDOUT,
            start_new_session=True,  # the bash and its server: one process group to stop
        )
        deadline = time.monotonic() + 180
        while True:
            assert self.server.poll() is None, (line, self.log())
            try:
                if httpx.get(f"http://127.0.0.1:{self.port}/health").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, (line, self.log())
            time.sleep(0.1)
        self.n_run += 1

    def log(self) -> str:
        return (self.cwd / f"server-{self.port}.log").read_text(errors="replace")[-3000:]

    def stop(self) -> None:
        if self.server is None:
            return
        os.killpg(self.server.pid, signal.SIGTERM)
        try:
            self.server.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(self.server.pid, signal.SIGKILL)
            self.server.wait()
        self.server = None


@pytest.fixture()
def shell(tmp_path: Path) -> Iterator[Shell]:
    (tmp_path / ".venv").symlink_to(REPO / ".venv")
    sh = Shell(tmp_path)
    yield sh
    sh.stop()


def test_every_readme_command_runs_as_written(shell: Shell) -> None:
    commands = readme_commands()
    assert len(commands) > 20  # the blocks were found
    for line in commands:
        shell.run(line)
    assert shell.n_run == len(commands) - 1  # all but the suite itself
    for made in ("tiny-lfm2.gguf", "tiny-llama.gguf", "tiny-lora.gguf", "tiny-draft.gguf"):
        assert (shell.cwd / made).stat().st_size > 0, made
    assert (shell.cwd / "slots" / "alice.bin").stat().st_size > 0  # the page block's spill
