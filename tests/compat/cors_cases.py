"""Browser-style CORS requests, and llama-server's answers to them measured once.

Owns the cases (server flags x requests) and `observe()`, which sends them with the standard
library and keeps what a browser acts on: the status, every `Access-Control-*` header (an empty
value included), and for a preflight its content type and body. `cors-llama-server.json` beside
this file holds the pinned llama-server's answers, measured with

    .venv/bin/python -m tests.compat.cors_cases /work/llama-build/bin/llama-server

(on the tiny llama of `kvswap.tiny`); `tests/server/test_cors.py` asks kvswap the same and
compares. CI has no llama-server binary, so the answers are committed.
"""

from __future__ import annotations

import http.client
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from kvswap.cluster.procs import free_port

ANSWERS = Path(__file__).resolve().parent / "cors-llama-server.json"
API_KEY = "sk-cors-test"

# Server flags per case, appended to the model and port flags.
CONFIGS: dict[str, list[str]] = {
    "default": [],
    "localhost": ["--cors-origins", "localhost"],
    "listed-no-credentials": [
        "--cors-origins",
        "https://a.example,https://b.example",
        "--no-cors-credentials",
    ],
    "star-no-credentials": ["--no-cors-credentials"],
    "tools-mean-localhost": ["--tools", "get_info"],
    "tools-explicit-origins": ["--tools", "get_info", "--cors-origins", "*"],
    "methods-headers": [
        "--cors-methods",
        "GET, POST",
        "--cors-headers",
        "Authorization, X-Mind-Id",
    ],
    "api-key": ["--api-key", API_KEY],
}

ORIGINS: list[str | None] = [
    "https://app.example.com",
    "http://localhost:3000",
    "http://127.0.0.1",
    "http://[::1]:8080",
    "http://localhost.evil.com",
    "localhost",
    None,
]

# (method, path, origin); preflights carry what a browser sends before a JSON POST with a key.
REQUESTS: list[tuple[str, str, str | None]] = [
    *(("OPTIONS", "/v1/chat/completions", origin) for origin in ORIGINS),
    ("GET", "/health", "https://app.example.com"),
    ("GET", "/v1/models", "https://app.example.com"),
    ("GET", "/v1/models", "http://localhost:3000"),
    ("GET", "/no-such-route", "https://app.example.com"),
]


def observe(host: str, port: int) -> list[dict[str, Any]]:
    """Send every request of REQUESTS; what a browser reads from each answer, in order."""
    seen = []
    for method, path, origin in REQUESTS:
        headers = {} if origin is None else {"Origin": origin}
        if method == "OPTIONS":
            headers["Access-Control-Request-Method"] = "POST"
            headers["Access-Control-Request-Headers"] = "authorization, content-type"
        conn = http.client.HTTPConnection(host, port, timeout=30)
        try:
            conn.request(method, path, headers=headers)
            resp = conn.getresponse()
            body = resp.read()
        finally:
            conn.close()
        answer: dict[str, Any] = {
            "request": [method, path, origin],
            "status": resp.status,
            "cors": {
                k.lower(): v
                for k, v in resp.getheaders()
                if k.lower().startswith("access-control-")
            },
        }
        if method == "OPTIONS":
            answer["content_type"] = resp.getheader("Content-Type")
            answer["body"] = body.decode("utf-8")
        seen.append(answer)
    return seen


def wait_healthy(port: int, proc: subprocess.Popen[bytes], timeout_s: float = 60) -> None:
    """Poll /health until 200 (the model loaded); fails if the server exits first."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", "/health")
            if conn.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.05)
    raise TimeoutError("server not healthy")


def measure(binary: str, model: str) -> dict[str, Any]:
    answers: dict[str, Any] = {}
    for name, flags in CONFIGS.items():
        port = free_port()
        cmd = [binary, "-m", model, "--port", str(port), "-c", "256", "-np", "1", "-t", "1"]
        proc = subprocess.Popen(
            [*cmd, *flags], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        try:
            wait_healthy(port, proc)
            answers[name] = observe("127.0.0.1", port)
        finally:
            proc.terminate()
            proc.wait(30)
    return answers


def main(argv: list[str]) -> int:
    from kvswap.tiny.cache import tiny_model_path

    if len(argv) != 1:
        print("usage: python -m tests.compat.cors_cases LLAMA_SERVER_BINARY", file=sys.stderr)
        return 2
    answers = measure(argv[0], str(tiny_model_path("llama")))
    doc = {
        "measured_with": f"python -m tests.compat.cors_cases {argv[0]}",
        "server": "the pinned llama-server (llama.cpp of the llama-cpp-python 0.3.36 sdist)",
        "answers": answers,
    }
    ANSWERS.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {sum(len(v) for v in answers.values())} answers to {ANSWERS}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
