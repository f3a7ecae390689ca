"""Every answer of a mind's turn says how its mind was served, on every API family, and a
request that does not extend its mind's history says that it diverged.

A real `kvswap serve` (SmolLM2, two slots, one thread, a save path); each API family's turns
sent whole and streamed as a client sends them, and read as a client reads them: the headers
(`X-Kvswap-Mind`, `X-Kvswap-Tier-Before`, `X-Kvswap-Switch-Ms`, and `X-Kvswap-Diverged-At`,
`X-Kvswap-Dropped-Tokens` for a divergence) and the `mind` block beside the answer's `timings`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import openai
import pytest

from tests.server.harness import ServerProcess, chat_prompt

pytestmark = [pytest.mark.model, pytest.mark.timeout(600)]

ARGS = ("-c", "4096", "-np", "2", "-t", "1", "-tb", "1", "--metrics")
Turns = list[tuple[str, str]]


def _messages(turns: Turns) -> list[dict[str, str]]:
    return [{"role": role, "content": content} for role, content in turns]


# Each family: the body of a conversation, and the answer's text in its shape.
FAMILIES: dict[str, tuple[Callable[[Turns], dict[str, Any]], Callable[[Any], str]]] = {
    "/completion": (
        lambda t: {"prompt": chat_prompt(*t), "n_predict": 4},
        lambda a: a["content"],
    ),
    "/v1/completions": (
        lambda t: {"prompt": chat_prompt(*t), "max_tokens": 4},
        lambda a: a["choices"][0]["text"],
    ),
    "/v1/chat/completions": (
        lambda t: {"messages": _messages(t), "max_tokens": 4},
        lambda a: a["choices"][0]["message"]["content"],
    ),
    "/v1/responses": (
        lambda t: {"input": _messages(t), "max_output_tokens": 4},
        lambda a: a["output"][0]["content"][0]["text"],
    ),
    "/v1/messages": (
        lambda t: {"messages": _messages(t), "max_tokens": 4},
        lambda a: a["content"][0]["text"],
    ),
}


@pytest.fixture(scope="module")
def server(server_factory: Callable[..., ServerProcess]) -> ServerProcess:
    return server_factory(*ARGS, save_path=True)


def _turn(server: ServerProcess, path: str, mind: str, turns: Turns) -> tuple[dict, dict]:
    """A whole answer: (its headers, its JSON)."""
    body = {**FAMILIES[path][0](turns), "temperature": 0}
    resp = server.post(path, body, headers={"X-Mind-Id": mind})
    assert resp.status_code == 200, (path, resp.text)
    return dict(resp.headers), resp.json()


def _streamed(server: ServerProcess, path: str, mind: str, turns: Turns) -> tuple[dict, dict]:
    """A streamed answer: (its headers, the `mind` block of its events)."""
    body = {**FAMILIES[path][0](turns), "temperature": 0, "stream": True}
    blocks = []
    headers = {"X-Mind-Id": mind}
    with server.client.stream("POST", path, json=body, headers=headers) as resp:
        assert resp.status_code == 200, resp.read()
        for line in resp.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                event = json.loads(line[len("data: ") :])
                blocks += [o["mind"] for o in (event, event.get("response") or {}) if "mind" in o]
        assert len(blocks) == 1, (path, blocks)  # once, with the answer's last timings
        return dict(resp.headers), blocks[0]


def _metric(server: ServerProcess, name: str) -> float:
    return server.metrics()[f"llamacpp:{name}"]


@pytest.mark.parametrize("path", sorted(FAMILIES))
def test_every_answer_says_how_its_mind_was_served(server: ServerProcess, path: str) -> None:
    """Decision: the mind, the tier its state came from and the switch's time are in every
    family's headers and body; an answer said none of it (`/v1/responses` had no `timings`
    at all), so a user could not see a switch cost a memcpy (the newcomer's second hour,
    finding 13)."""
    mind = f"served-{path.strip('/').replace('/', '-')}"
    turns: Turns = [("user", "Name a colour.")]
    headers, first = _turn(server, path, mind, turns)
    # llama-server's timings on every family but Anthropic's, whose answers carry none (the
    # pinned suite's test_compat_anthropic checks that)
    assert ("timings" in first) == (path != "/v1/messages"), first
    block = first["mind"]
    assert block == {
        "name": mind,
        "tier_before": "new",
        "switch_ms": block["switch_ms"],
        "n_tokens_before": 0,
        "diverged_at": None,
        "n_dropped": 0,
    }
    assert headers["x-kvswap-mind"] == mind and headers["x-kvswap-tier-before"] == "new"
    assert float(headers["x-kvswap-switch-ms"]) >= 0
    assert "x-kvswap-diverged-at" not in headers

    turns += [("assistant", FAMILIES[path][1](first)), ("user", "And another?")]
    headers, second = _turn(server, path, mind, turns)
    assert second["mind"]["tier_before"] == "slot" and second["mind"]["switch_ms"] == 0
    assert second["mind"]["n_tokens_before"] > 0 and second["mind"]["diverged_at"] is None
    assert headers["x-kvswap-tier-before"] == "slot"

    moved = server.post(f"/minds/{mind}?action=page_out")
    assert moved.json()["tier"] == "ram", moved.text
    turns += [("assistant", FAMILIES[path][1](second)), ("user", "One more?")]
    headers, third = _turn(server, path, mind, turns)
    assert third["mind"]["tier_before"] == "ram" and third["mind"]["switch_ms"] > 0
    assert third["mind"]["diverged_at"] is None, third["mind"]
    assert headers["x-kvswap-tier-before"] == "ram"
    assert float(headers["x-kvswap-switch-ms"]) == pytest.approx(third["mind"]["switch_ms"])

    assert server.post(f"/minds/{mind}?action=spill").json()["tier"] == "disk"
    turns += [("assistant", FAMILIES[path][1](third)), ("user", "The last one?")]
    headers, block = _streamed(server, path, mind, turns)  # a stream's headers say it too
    assert block["tier_before"] == "disk" and block["switch_ms"] > 0, block
    assert block["diverged_at"] is None, block
    assert headers["x-kvswap-tier-before"] == "disk"


@pytest.mark.parametrize("path", sorted(FAMILIES))
def test_a_request_that_diverges_from_its_mind_says_so(server: ServerProcess, path: str) -> None:
    """A request that does not extend its mind's history overwrites the rest of it; that was
    silent: the web page reset a 147-token mind to 95 tokens with nothing in the answer, the
    headers, the log or /metrics (the newcomer's second hour, finding 4). Now the answer
    says where the prompt diverged and how many of the mind's tokens were dropped."""
    mind = f"diverged-{path.strip('/').replace('/', '-')}"
    turns: Turns = [("user", "I am Gina. I keep bees and grow plums by the river.")]
    _, first = _turn(server, path, mind, turns)
    turns += [("assistant", FAMILIES[path][1](first)), ("user", "What do I grow?")]
    _, second = _turn(server, path, mind, turns)
    n_before = second["mind"]["n_tokens_before"]
    assert second["mind"]["diverged_at"] is None
    n_diverged = _metric(server, "mind_diverged_total")
    n_dropped = _metric(server, "mind_dropped_tokens_total")

    headers, other = _turn(server, path, mind, [("user", "Hi")])  # another conversation
    block = other["mind"]
    assert block["tier_before"] == "slot"
    assert block["n_tokens_before"] > n_before  # the second turn's prompt and answer
    assert 0 < block["diverged_at"] < n_before  # the chat's prefix (the system prompt) kept
    assert block["n_dropped"] == block["n_tokens_before"] - block["diverged_at"]
    assert headers["x-kvswap-diverged-at"] == str(block["diverged_at"])
    assert headers["x-kvswap-dropped-tokens"] == str(block["n_dropped"])
    assert _metric(server, "mind_diverged_total") == n_diverged + 1
    assert _metric(server, "mind_dropped_tokens_total") == n_dropped + block["n_dropped"]
    assert f"diverged from its history at token {block['diverged_at']}:" in server.log()


def test_the_openai_client_reads_the_headers_and_anonymous_answers_have_none(
    server: ServerProcess,
) -> None:
    """What a user of the official client sees: the headers through `with_raw_response`, the
    block among the answer's extra fields; a request naming no mind says nothing of one."""
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0)
    ask = [{"role": "user", "content": "Hi"}]
    raw = client.chat.completions.with_raw_response.create(
        model="any", messages=ask, max_tokens=2, extra_headers={"X-Mind-Id": "sdk"}
    )
    assert raw.headers["X-Kvswap-Mind"] == "sdk"
    assert raw.parse().model_extra["mind"]["tier_before"] == "new"  # type: ignore[index]
    anonymous = client.chat.completions.with_raw_response.create(
        model="any", messages=ask, max_tokens=2
    )
    assert "X-Kvswap-Mind" not in anonymous.headers
    assert "mind" not in (anonymous.parse().model_extra or {})
