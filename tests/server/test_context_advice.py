"""A conversation too long for its slot is refused with the flags that would fit it, on every API.

The server is the README's former "Using it" command, `-c 8192 -np 4` (no `-kvu`): four fixed
windows of 2,048 tokens, which refused a newcomer's 2,531-token chat with llama-server's bare
"try increasing it". The refusal keeps llama-server's sentence and type and adds what to change.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.server.harness import ServerProcess
from tests.server.test_readme import long_chat

pytestmark = [pytest.mark.model, pytest.mark.timeout(120)]


@pytest.fixture(scope="module")
def split_pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    log = tmp_path_factory.mktemp("log") / "server.log"
    server = ServerProcess(["-c", "8192", "-np", "4", "-t", "1"], log)
    yield server
    server.stop()


def _routes(messages: list[dict[str, str]]) -> list[tuple[str, dict[str, object]]]:
    text = "\n".join(m["content"] for m in messages)
    return [
        ("/v1/chat/completions", {"messages": messages, "max_tokens": 4}),
        ("/completion", {"prompt": text, "n_predict": 4}),
        ("/v1/messages", {"model": "any", "max_tokens": 4, "messages": messages}),
        ("/v1/responses", {"model": "any", "input": messages, "max_output_tokens": 4}),
    ]


def test_a_long_chat_is_told_to_unify_the_pool(split_pool: ServerProcess) -> None:
    for path, body in _routes(long_chat(30)):
        resp = split_pool.post(path, body, headers={"X-Mind-Id": "diary"})
        assert resp.status_code == 400, (path, resp.text)
        error = resp.json()["error"]
        if path != "/v1/messages":  # Anthropic's clients read their own error types
            assert error["type"] == "exceed_context_size_error", (path, error)
        message = error["message"]
        assert "exceeds the available context size (2048 tokens), try increasing it" in message
        assert "-np 4 without -kvu splits the pool (-c 8192) into 4 fixed windows" in message, path
        assert "start with -kvu" in message and '"n_parallel": 1' in message, path
