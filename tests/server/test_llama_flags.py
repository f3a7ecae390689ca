"""Flags of llama-server that kvswap once ignored: HTTPS (`--ssl-key-file`, `--ssl-cert-file`)
serves TLS as llama-server built with SSL, and plain HTTP is then refused; one file alone refuses
to start (never plain HTTP by mistake); `--chat-template-kwargs` are the template's defaults.
And llama-server's request log line, once per request."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.server.harness import REPO, ServerProcess

pytestmark = [pytest.mark.model, pytest.mark.timeout(180)]

TLS = REPO / "tests" / "fixtures" / "tls"
ARGS = ("-c", "512", "-np", "1", "-t", "1", "-tb", "1")


def test_the_server_speaks_https_with_both_files(tmp_path: Path) -> None:
    server = ServerProcess(
        [*ARGS, "--ssl-key-file", str(TLS / "key.pem"), "--ssl-cert-file", str(TLS / "cert.pem")],
        tmp_path / "server.log",
    )
    try:
        assert server.url.startswith("https://")
        out = server.post("/completion", {"prompt": "Hello", "n_predict": 2})
        assert out.status_code == 200 and out.json()["tokens_predicted"] == 2
        with pytest.raises(httpx.TransportError):
            httpx.get(f"http://127.0.0.1:{server.port}/health", timeout=10)
        assert f"listening on https://127.0.0.1:{server.port}" in server.log()
        assert "ignored" not in server.log()
    finally:
        server.stop()


def test_one_tls_file_alone_refuses_to_start() -> None:
    run = subprocess.run(
        [sys.executable, "-m", "kvswap", "serve", "--ssl-cert-file", str(TLS / "cert.pem")],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert run.returncode != 0
    assert "--ssl-cert-file needs its pair" in run.stderr


# A template that shows one kwarg, so the render says which value won.
KWARG_TEMPLATE = (
    "{{ 'tone=' ~ (tone if tone is defined else 'none') }}"
    "{% for m in messages %}|{{ m.content }}{% endfor %}"
)


def test_chat_template_kwargs_are_defaults_under_the_requests_own(tmp_path: Path) -> None:
    server = ServerProcess(
        [*ARGS, "--chat-template", KWARG_TEMPLATE, "--chat-template-kwargs", '{"tone": "calm"}'],
        tmp_path / "server.log",
    )
    try:
        body = {"messages": [{"role": "user", "content": "hi"}]}
        default = server.post("/apply-template", body)
        assert default.status_code == 200, default.text
        assert default.json()["prompt"] == "tone=calm|hi"
        own = server.post("/apply-template", {**body, "chat_template_kwargs": {"tone": "bold"}})
        assert own.json()["prompt"] == "tone=bold|hi"
        assert "ignored" not in server.log()
        # The web page polls /slots and /pages every second: a tab left open logged two lines
        # a second (the newcomer's second hour, finding 8).
        for path in ("/slots", "/pages", "/props", "/metrics") * 3:
            assert server.client.get(path).status_code in (200, 501), path
        # One line per request at the default verbosity, in llama-server's words; the routes
        # clients poll (/health, polled until ready, and the page's) are not logged.
        lines = [line for line in server.log().splitlines() if "done request:" in line]
        assert len(lines) == 2, lines
        assert all(
            line.endswith("done request: POST /apply-template 127.0.0.1 200") for line in lines
        )
    finally:
        server.stop()


def test_a_missing_model_file_is_one_clear_line(tmp_path: Path) -> None:
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "kvswap",
            "serve",
            "-m",
            str(tmp_path / "model.gguf"),
            "--port",
            "0",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert run.returncode == 1
    assert "Traceback" not in run.stderr
    lines = [line for line in run.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, lines  # caught before anything loads: the flag and the path named
    assert "-m/--model" in lines[0] and str(tmp_path / "model.gguf") in lines[0], lines
