"""A browser on another origin gets exactly llama-server's CORS answers from kvswap.

Each case of `tests/compat/cors_cases.py` (server flags: the defaults, `--cors-origins
localhost`, a listed origin without credentials, `--tools` limiting CORS to localhost, custom
methods and headers, an API key) starts a real `kvswap serve` and sends the same preflights
and requests that were sent to the pinned llama-server binary; the status, every
`Access-Control-*` header and the preflight's content type and body must equal the answers
committed from that binary (`tests/compat/cors-llama-server.json`).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.compat.cors_cases import ANSWERS, CONFIGS, observe
from tests.server.harness import ServerProcess

pytestmark = [pytest.mark.model, pytest.mark.timeout(120)]


@pytest.fixture(scope="module")
def llama_server_answers() -> dict[str, list[dict[str, object]]]:
    doc = json.loads(ANSWERS.read_text(encoding="utf-8"))
    answers: dict[str, list[dict[str, object]]] = doc["answers"]
    assert sorted(answers) == sorted(CONFIGS), "re-measure cors-llama-server.json"
    return answers


@pytest.mark.parametrize("case", sorted(CONFIGS))
def test_cors_answers_equal_llama_servers(
    case: str,
    llama_server_answers: dict[str, list[dict[str, object]]],
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
    theirs = llama_server_answers[case]
    assert len(ours) == len(theirs)
    for mine, expected in zip(ours, theirs, strict=True):
        assert mine == expected, f"{case}: {mine['request']}"
