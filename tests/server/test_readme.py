"""Every command of the README runs as written, on a fresh checkout (what CI has).

The README's `sh` and `python` blocks are read in order and run in a new folder that holds only
`.venv` (a fresh clone's, as `scripts/setup.sh` made it): each `sh` line with bash, each `python`
block with the venv's Python. A `kvswap serve` line starts a server (on a free port instead of
8080, which the lines after it are pointed at, and with one thread for this small machine) and
waits for /health, as a `kvswap cluster up` line does on its HAProxy port; every other line and
block must exit 0, and an answer must not be an error. The two lines CI runs itself are not run
here: `scripts/setup.sh` (CI ran it first) and `scripts/test.sh` (the suite this test belongs to).

Every server the README starts lets one mind grow to its whole pool (one KV pool, `-kvu`). The
"Using it" server is the one a user copies to chat with minds, so its geometry must hold a
long conversation: a 2,500-token chat through it succeeds, and its next turn prefills only the
new tokens.
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

from tests.server.harness import REPO, free_block, free_port

pytestmark = [pytest.mark.model, pytest.mark.timeout(600)]

SETUP = "bash scripts/setup.sh && "
SUITE = "bash scripts/test.sh"
SERVER_LINE = re.compile(r"kvswap (serve|cluster up)(?!.*--help)")


def readme_blocks() -> list[tuple[str, str]]:
    """(language, text) of the README's `sh` and `python` blocks, in order."""
    text = (REPO / "README.md").read_text()
    return re.findall(r"```(sh|python)\n(.*?)```", text, re.S)


def sh_lines(block: str) -> list[str]:
    """The command lines of an `sh` block, comments cut."""
    lines = (re.sub(r"\s{2,}#.*$", "", line).strip() for line in block.splitlines())
    return [line for line in lines if line]


def using_it_server() -> str:
    """The README's "Using it" server line: the first one that keeps minds on disk."""
    return next(
        line
        for lang, block in readme_blocks()
        if lang == "sh"
        for line in sh_lines(block)
        if SERVER_LINE.search(line) and "--slot-save-path" in line
    )


class Shell:
    """Runs README lines in one folder; at most one server in the background."""

    def __init__(self, cwd: Path) -> None:
        self.cwd = cwd
        self.port = 8080
        self.server: subprocess.Popen[bytes] | None = None
        self.n_run = 0
        self.geometries: list[tuple[str, dict[str, object]]] = []  # each server's, as started

    def run(self, line: str) -> None:
        if line.startswith(SETUP):
            line = line.removeprefix(SETUP)
        if line == SUITE:
            return
        if SERVER_LINE.search(line):
            self.serve(line)
            return
        self.check(["bash", "-c", self.here(line)], line)

    def python(self, block: str) -> None:
        self.check([str(REPO / ".venv" / "bin" / "python"), "-c", self.here(block)], block)

    def here(self, text: str) -> str:
        return text.replace("localhost:8080", f"localhost:{self.port}")

    def check(self, argv: list[str], what: str) -> None:
        run = subprocess.run(argv, cwd=self.cwd, capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, (what, run.stdout[-2000:], run.stderr[-2000:])
        assert '"error"' not in run.stdout, (what, run.stdout[-2000:])
        self.n_run += 1

    def serve(self, line: str) -> None:
        self.stop()
        self.port = free_port()
        # `kvswap cluster up --port 8080`: HAProxy's port moves, and its replicas and Redis take
        # the ports after it, so the whole block must be free
        if "--port 8080" in line:
            replicas = re.search(r"--replicas (\d+)", line)
            self.port = free_block((int(replicas.group(1)) if replicas else 1) + 2)
            line = line.replace("--port 8080", f"--port {self.port}")
        else:
            line = f"{line} --port {self.port}"
        self.server = subprocess.Popen(
            ["bash", "-c", f"{line} -t 1"],
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
        props = httpx.get(f"http://127.0.0.1:{self.port}/props").json()
        self.geometries.append((line, props["context_geometry"]))
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
    blocks = readme_blocks()
    n_python = sum(lang == "python" for lang, _ in blocks)
    n_lines = sum(len(sh_lines(block)) for lang, block in blocks if lang == "sh")
    assert n_lines > 20 and n_python >= 2  # the blocks were found
    for lang, block in blocks:
        if lang == "python":
            shell.python(block)
            continue
        for line in sh_lines(block):
            shell.run(line)
    assert shell.n_run == n_lines + n_python - 1  # all but the suite itself
    for made in ("tiny-lfm2.gguf", "tiny-llama.gguf", "tiny-lora.gguf", "tiny-draft.gguf"):
        assert (shell.cwd / made).stat().st_size > 0, made
    assert (shell.cwd / "slots" / "alice.bin").stat().st_size > 0  # the page block's spill
    # Every server a user copies lets one mind grow to its whole pool: the cluster example's
    # `-np 4` without `-kvu` gave each replica's slots a quarter of -c (the newcomer's second
    # hour, finding 3).
    assert len(shell.geometries) >= 3, shell.geometries  # plain, "Using it", the cluster
    for line, geometry in shell.geometries:
        assert geometry["n_ctx_slot"] == geometry["n_ctx"] == 8192, (line, geometry)


def long_chat(n_turns: int) -> list[dict[str, str]]:
    """A conversation of about 83 tokens (SmolLM2) per turn pair, ending with a user turn."""
    messages = []
    for i in range(n_turns):
        messages.append(
            {
                "role": "user",
                "content": f"Day {i}: I walked to the harbour, counted {i * 7} boats, "
                "bought bread, and wrote the tide times in my notebook. "
                "Please remember every detail of this day for later.",
            }
        )
        messages.append(
            {
                "role": "assistant",
                "content": f"Noted for day {i}: the harbour walk, {i * 7} boats, the bread "
                "and the tide times in your notebook. I will remember them.",
            }
        )
    messages.append({"role": "user", "content": "How many boats did I count on day 3?"})
    return messages


def test_a_long_chat_fits_the_using_it_geometry(shell: Shell) -> None:
    """The README's minds server holds a 2,500-token mind, and its next turn reuses it all."""
    (shell.cwd / "slots").mkdir()
    shell.serve(using_it_server().removeprefix("mkdir -p slots && "))
    client = httpx.Client(base_url=f"http://127.0.0.1:{shell.port}", timeout=300)
    messages = long_chat(30)
    body = {"messages": messages, "max_tokens": 8, "temperature": 0}
    first = client.post("/v1/chat/completions", json=body, headers={"X-Mind-Id": "diary"})
    assert first.status_code == 200, first.text
    n_prompt = first.json()["usage"]["prompt_tokens"]
    assert 2400 <= n_prompt <= 2700, n_prompt
    answer = first.json()["choices"][0]["message"]["content"]
    messages += [
        {"role": "assistant", "content": answer},
        {"role": "user", "content": "And on day 4?"},
    ]
    second = client.post(
        "/v1/chat/completions", json={**body, "messages": messages}, headers={"X-Mind-Id": "diary"}
    )
    assert second.status_code == 200, second.text
    timings = second.json()["timings"]
    assert timings["cache_n"] >= n_prompt and timings["prompt_n"] < 64, timings
