"""A long stored chain on SmolLM2: twenty turns, each request carrying only
`previous_response_id` and one new message, growing past 6,000 tokens. Every turn prefills at
most its new input + 64 tokens, continues on the mind's own tokens, and its greedy text equals
the same conversation sent whole to the same server."""

from __future__ import annotations

from typing import Any

import pytest

from tests.server.agent_util import oai
from tests.server.harness import ServerProcess

pytestmark = [pytest.mark.model, pytest.mark.slow, pytest.mark.timeout(1800)]

N_TURNS = 20
N_ANSWER = 32  # tokens per answer
# Two slots of 8,192 tokens, each its own KV stream: a turn's numerics never depend on what
# the other slot holds (in one pool they do, docs/DESIGN.md), so whole sends compare exactly.
CHAIN_ARGS = ("-c", "16384", "-np", "2", "-t", "1", "-tb", "1", "--metrics")
TOPICS = (
    "rivers", "bridges", "clocks", "gardens", "ships", "trains", "bakeries", "lighthouses",
    "libraries", "mountains", "markets", "harbours", "orchards", "castles", "museums",
    "islands", "forests", "deserts", "canals", "observatories",
)  # fmt: skip


def message(turn: int) -> str:
    """A new user message of about 280 tokens, different every turn."""
    topic = TOPICS[turn % len(TOPICS)]
    facts = " ".join(
        f"Fact {turn}.{i}: the {topic} of town number {turn * 13 + i} were first recorded "
        f"in the year {1600 + turn * 7 + i}, and {i + 2} of them still stand today."
        for i in range(8)
    )
    return f"Here are my notes about {topic}. {facts} Summarise the notes in one sentence."


def n_tokens(server: ServerProcess, text: str) -> int:
    resp = server.post("/tokenize", {"content": text, "add_special": False})
    return len(resp.json()["tokens"])


@pytest.fixture(scope="module")
def chain_server(server_factory: Any) -> ServerProcess:
    return server_factory(*CHAIN_ARGS)


def test_twenty_turn_chain_prefills_only_new_input_and_matches_whole_sends(
    chain_server: ServerProcess,
) -> None:
    """Defects caught: a chained turn that re-renders and re-prefills its history (each turn
    must prefill at most its new message + 64 tokens), a continuation whose tokens differ from
    the conversation's own render (the greedy text of every turn must equal the same
    conversation sent whole, prompt length included), a chain that loses its mind."""
    client = oai(chain_server)
    args: dict[str, Any] = {"model": "m", "max_output_tokens": N_ANSWER, "temperature": 0}
    previous = None
    chained: list[tuple[str, int]] = []
    for turn in range(N_TURNS):
        text = message(turn)
        resp = client.responses.create(
            input=[{"role": "user", "content": text}], previous_response_id=previous, **args
        )
        usage = resp.usage
        assert usage is not None and resp.model_extra is not None
        prefilled = usage.input_tokens - usage.input_tokens_details.cached_tokens
        assert prefilled <= n_tokens(chain_server, text) + 64, (turn, usage)
        if previous is not None:
            assert resp.model_extra["continuation"]["mode"] == "incremental", resp.model_extra
        chained.append((resp.output_text, usage.input_tokens))
        previous = resp.id
    assert chained[-1][1] > 6000, "the chain grew past 6k tokens"
    # The same conversation sent whole, turn by turn (nothing stored, no mind), batched as the
    # chain was: the first prompt prefilled from scratch (the anonymous cache holds a copy of
    # it, whose reuse would decode its last token alone: another batch, docs/FINDINGS.md).
    messages: list[dict[str, str]] = []
    for turn, (text, n_input) in enumerate(chained):
        messages.append({"role": "user", "content": message(turn)})
        scratch = {"cache_prompt": False} if turn == 0 else {}
        whole = client.responses.create(input=messages, store=False, extra_body=scratch, **args)
        assert whole.usage is not None and whole.usage.input_tokens == n_input, turn
        assert whole.output_text == text, turn
        messages.append({"role": "assistant", "content": text})
    metrics = chain_server.metrics()
    assert metrics["llamacpp:responses_incremental_total"] >= N_TURNS - 1
