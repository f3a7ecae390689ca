"""Forks and deletes of a stored chain on SmolLM2: continuing from a response that is not its
mind's newest branches into a new mind (its state copied from the old mind's page), the
original untouched; each branch answers as an unforked run of its own history; deleting a
response in the middle breaks neither; deleting every reference to a mind frees its state."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from tests.server.agent_util import oai
from tests.server.harness import ServerProcess

pytestmark = [pytest.mark.model, pytest.mark.slow, pytest.mark.timeout(900)]

ARGS: dict[str, Any] = {"model": "m", "max_output_tokens": 16, "temperature": 0}


def _say(client: openai.OpenAI, text: str, previous: str | None) -> Any:
    return client.responses.create(
        input=[{"role": "user", "content": text}], previous_response_id=previous, **ARGS
    )


def _whole(client: openai.OpenAI, turns: list[tuple[str, str]], text: str) -> str:
    """The answer to `text` after `turns` (user, assistant), the conversation sent whole."""
    messages: list[Any] = []
    for user, assistant in turns:
        messages += [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]
    messages.append({"role": "user", "content": text})
    return client.responses.create(input=messages, store=False, **ARGS).output_text


def _minds(server: ServerProcess) -> set[str]:
    return {m["mind"] for m in server.client.get("/pages").json()["minds"]}


@pytest.fixture(scope="module")
def fork_server(server_factory: Any) -> ServerProcess:
    return server_factory("-c", "8192", "-np", "2", "-t", "1", "-tb", "1", "--metrics")


def test_fork_at_turn_five_of_ten_and_delete(fork_server: ServerProcess) -> None:
    """Defects caught: a continuation of an older response that cuts the newer turns off the
    mind (the original must still continue from its own newest turn), a fork that re-prefills
    its shared history (its first turn must reuse the copied page), a branch whose text
    differs from its own history sent whole, a deleted middle response that breaks its
    descendants, a mind whose state outlives every reference to it."""
    client = oai(fork_server)
    ids, turns = [], []
    previous = None
    for k in range(10):
        text = f"Turn {k}: tell me one word about the number {k}."
        resp = _say(client, text, previous)
        ids.append(resp.id)
        turns.append((text, resp.output_text))
        previous = resp.id
    mind = resp.model_extra["continuation"]["mind"]
    # A fork from turn 5 (index 4): a new mind, starting from the old mind's copied state.
    fork_text = "Instead, tell me about the colour blue."
    fork = _say(client, fork_text, ids[4])
    assert fork.model_extra["continuation"]["mind"] != mind
    assert fork.model_extra["continuation"]["mode"] == "incremental"
    fork_usage = fork.usage
    assert fork_usage is not None and fork_usage.input_tokens_details.cached_tokens > 0
    prefilled = fork_usage.input_tokens - fork_usage.input_tokens_details.cached_tokens
    assert prefilled <= 64 + 20, fork_usage
    assert fork.output_text == _whole(client, turns[:5], fork_text)
    fork_turns = [*turns[:5], (fork_text, fork.output_text)]
    # The original continues from its own newest turn, on its own mind.
    main_text = "And the number ten?"
    main = _say(client, main_text, ids[-1])
    assert main.model_extra["continuation"]["mind"] == mind
    assert main.model_extra["continuation"]["mode"] == "incremental"
    assert main.output_text == _whole(client, turns, main_text)
    turns.append((main_text, main.output_text))
    ids.append(main.id)
    # Delete turn 3 (index 2): both branches still continue.
    client.responses.delete(ids[2])
    on = _say(client, "Go on.", ids[-1])
    assert on.model_extra["continuation"]["mind"] == mind and on.status in (
        "completed",
        "incomplete",
    )
    ids.append(on.id)
    more = _say(client, "Go on too.", fork.id)
    assert more.output_text == _whole(client, fork_turns, "Go on too.")
    # Delete every reference to the original mind: its state leaves /pages.
    assert mind in _minds(fork_server)
    listed = client.responses.input_items.list(ids[-1])
    assert listed.data
    for rid in ids:
        if rid != ids[2]:
            client.responses.delete(rid)
    assert mind not in _minds(fork_server)
    assert fork.model_extra["continuation"]["mind"] in _minds(fork_server)
    assert _say(client, "Still there?", more.id).status in ("completed", "incomplete")
