"""A browser on another origin gets exactly llama-server's CORS answers from kvswap.

Each case of `tests/compat/cors_cases.py` (server flags: the defaults, `--cors-origins
localhost`, a listed origin without credentials, `--tools` limiting CORS to localhost, custom
methods and headers, an API key) starts a real `kvswap serve` and sends the same preflights
and requests that were sent to the pinned llama-server binary; the status, every
`Access-Control-*` header and the preflight's content type and body must equal the answers
committed from that binary (`tests/compat/cors-llama-server.json`), but for one listed
difference: where llama-server sends an empty `Access-Control-Allow-Origin` to a request with
no `Origin` (no browser sent it), kvswap sends none (docs/COMPAT.md).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.compat.cors_cases import ANSWERS, CONFIGS, observe
from tests.server.harness import ServerProcess

pytestmark = [pytest.mark.model, pytest.mark.timeout(120)]

ALLOW_ORIGIN = "access-control-allow-origin"


@pytest.fixture(scope="module")
def llama_server_answers() -> dict[str, list[dict[str, Any]]]:
    doc = json.loads(ANSWERS.read_text(encoding="utf-8"))
    answers: dict[str, list[dict[str, Any]]] = doc["answers"]
    assert sorted(answers) == sorted(CONFIGS), "re-measure cors-llama-server.json"
    return answers


def _without_empty_origin(answer: dict[str, Any]) -> dict[str, Any]:
    """llama-server's answer as kvswap gives it: an empty Allow-Origin is not sent."""
    cors = {k: v for k, v in answer["cors"].items() if (k, v) != (ALLOW_ORIGIN, "")}
    return {**answer, "cors": cors}


@pytest.mark.parametrize("case", sorted(CONFIGS))
def test_cors_answers_equal_llama_servers(
    case: str,
    llama_server_answers: dict[str, list[dict[str, Any]]],
    tmp_path: Path,
) -> None:
    from kvswap.tiny.cache import tiny_model_path

    model = str(tiny_model_path("llama"))
    args = ["-m", model, "-c", "256", "-np", "1", "-t", "1", *CONFIGS[case]]
    server = ServerProcess(args, tmp_path / "server.log")
    try:
        ours = observe("127.0.0.1", server.port)
    finally:
        server.stop()
    theirs = [_without_empty_origin(answer) for answer in llama_server_answers[case]]
    assert len(ours) == len(theirs)
    for mine, expected in zip(ours, theirs, strict=True):
        assert mine == expected, f"{case}: {mine['request']}"


def test_a_request_without_an_origin_gets_no_allow_origin_header(tmp_path: Path) -> None:
    """A client that is no browser (curl, an SDK) sends no Origin: llama-server answers it an
    empty `Access-Control-Allow-Origin:`, a header with no meaning that every answer carried
    (the newcomer's second hour, finding 16). A browser's Origin is still echoed."""
    from kvswap.tiny.cache import tiny_model_path

    args = ["-m", str(tiny_model_path("llama")), "-c", "256", "-np", "1", "-t", "1"]
    server = ServerProcess(args, tmp_path / "server.log")
    try:
        for method, path in (("GET", "/health"), ("GET", "/props"), ("POST", "/tokenize")):
            plain = server.client.request(method, path, json={"content": "hi"})
            assert plain.status_code == 200, plain.text
            assert ALLOW_ORIGIN not in plain.headers, (path, plain.headers)
            origin = "https://app.example.com"
            browser = server.client.request(
                method, path, json={"content": "hi"}, headers={"Origin": origin}
            )
            assert browser.headers[ALLOW_ORIGIN] == origin
    finally:
        server.stop()
