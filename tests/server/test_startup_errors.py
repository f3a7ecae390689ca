"""Start-up mistakes give one clear line, no traceback, a non-zero exit; listening is real.

Each case runs `kvswap serve` as a real subprocess, as a user would: a missing model, a
directory or a non-GGUF file as the model, a bad flag value, a port another process listens
on, a save path nothing can be written in. The good cases check that "server is listening"
names sockets that answer: `--port 0` logs the real port, and several `--host` addresses are
all served.
"""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.server.harness import REPO, free_port

pytestmark = [pytest.mark.timeout(120)]


def _serve(*args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "kvswap", "serve", "-t", "1", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=90, cwd=REPO)


def _one_error_line(proc: subprocess.CompletedProcess[str], *needles: str) -> str:
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    assert "listening" not in proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def test_a_missing_model_names_the_flag_and_the_path(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-model.gguf"
    line = _one_error_line(_serve("-m", str(missing)), "-m/--model", str(missing))
    assert "No such file" in line


def test_a_directory_or_a_non_gguf_file_is_not_a_model(tmp_path: Path) -> None:
    _one_error_line(_serve("-m", str(tmp_path)), "-m/--model", "directory")
    text = tmp_path / "notes.gguf"
    text.write_text("not a model\n")
    _one_error_line(_serve("-m", str(text)), "-m/--model", str(text), "not a GGUF file")


def test_a_missing_draft_model_names_its_flag(tmp_path: Path) -> None:
    from kvswap.tiny.cache import tiny_model_path

    model = str(tiny_model_path("llama"))
    draft = tmp_path / "draft.gguf"
    proc = _serve("-m", model, "-md", str(draft), "--spec-type", "draft-simple")
    _one_error_line(proc, "-md/--model-draft", str(draft))


def test_a_bad_flag_value_names_the_flag() -> None:
    _one_error_line(_serve("-c", "lots"), '"-c"', "lots")
    _one_error_line(_serve("--port", "99999"), '"--port"')


def test_a_save_path_nothing_can_write_in_is_refused() -> None:
    # /sys refuses new files even to root (mode bits would not: CI runs as root).
    _one_error_line(_serve("--slot-save-path", "/sys"), "--slot-save-path", "/sys")


def test_a_port_in_use_is_one_line_and_nothing_loads() -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        proc = _serve("--port", str(port))
    line = _one_error_line(proc, f"--port {port}", "address already in use")
    assert "127.0.0.1" in line
    assert "model" not in proc.stdout + proc.stderr  # refused before any load began


def _wait_listening(proc: subprocess.Popen[str], log: Path, timeout_s: float = 90) -> str:
    """The 'server is listening on ...' line of the log (polled until the deadline)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = re.search(r"server is listening on (.+)", log.read_text(errors="replace"))
        if found:
            return found.group(1).strip()
        assert proc.poll() is None, log.read_text(errors="replace")
        time.sleep(0.05)
    raise TimeoutError(log.read_text(errors="replace"))


def _run_until_listening(tmp_path: Path, *args: str) -> tuple[subprocess.Popen[str], str]:
    from kvswap.tiny.cache import tiny_model_path

    log = tmp_path / "server.log"
    cmd = [sys.executable, "-m", "kvswap", "serve", "-m", str(tiny_model_path("llama"))]
    cmd += ["-c", "256", "-np", "1", "-t", "1", *args]
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, text=True, cwd=REPO)
    return proc, _wait_listening(proc, log)


def test_port_0_logs_the_port_it_really_listens_on(tmp_path: Path) -> None:
    proc, urls = _run_until_listening(tmp_path, "--port", "0")
    try:
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+", urls), urls
        assert not urls.endswith(":0")
        assert httpx.get(f"{urls}/health", timeout=10).status_code == 200
    finally:
        proc.terminate()
        proc.wait(30)


def test_every_host_address_is_served(tmp_path: Path) -> None:
    port = free_port()
    proc, urls = _run_until_listening(
        tmp_path, "--host", "127.0.0.1,127.0.0.2", "--port", str(port)
    )
    try:
        assert urls == f"http://127.0.0.1:{port}, http://127.0.0.2:{port}"
        for host in ("127.0.0.1", "127.0.0.2"):
            res = httpx.post(
                f"http://{host}:{port}/completion",
                json={"prompt": "Hello", "n_predict": 2},
                timeout=30,
            )
            assert res.status_code == 200, res.text
    finally:
        proc.terminate()
        proc.wait(30)
