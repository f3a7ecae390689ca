"""Per chat template, on the real vocabularies: a stored conversation continued from the
mind's own tokens plus the rendered glue (`minds.chain.continue_chain`) gives exactly the
tokens of the whole conversation rendered and tokenized, turn after turn, with a tool call and
its output in the chain; a template that renders earlier turns differently (a thinking
template dropping old reasoning) is detected and rendered whole, with the reason.

The conversation runs through kvswap's own item and message translation (Responses items ->
chat body -> plan_chat / render_history), as the server runs it; each "generated" answer is
the template's own rendering of it, up to and including the end-of-turn token, tokenized."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kvswap.backend.model import Model
from kvswap.config.flags import parse_serve_args
from kvswap.config.settings import ServerConfig
from kvswap.minds.continuation import ContinueMode, Position, continue_chain, text_digest
from kvswap.server.loader import load_chat_template
from kvswap.server.openai.items import stored_items
from kvswap.server.openai.schemas_responses import ResponsesRequest, to_chat_body
from kvswap.server.requests.chat import plan_chat, render_history
from kvswap.server.requests.schemas import ChatCompletionRequest, parse_body
from kvswap.tiny import tiny_model_path
from tests.server.agent_util import QWEN3_TEMPLATE, QWEN25_TEMPLATE, TEMPLATES

pytestmark = [pytest.mark.model, pytest.mark.timeout(300)]

TOOLS = [
    {
        "type": "function",
        "name": "get_weather",
        "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    }
]
# The conversation: (new input items, the assistant's answer items), turn by turn.
TURNS: list[tuple[list[dict[str, Any]], list[dict[str, Any]]]] = [
    (
        [{"role": "user", "content": "Hello, I am Carol."}],
        [{"type": "message", "role": "assistant", "content": "Hello Carol! How can I help?"}],
    ),
    (
        [{"role": "user", "content": "What is the weather in Paris?"}],
        [
            {
                "type": "function_call",
                "call_id": "call_1",
                "name": "get_weather",
                "arguments": json.dumps({"city": "Paris"}),
            }
        ],
    ),
    (
        [{"type": "function_call_output", "call_id": "call_1", "output": "Sunny, 21 C"}],
        [{"type": "message", "role": "assistant", "content": "It is sunny in Paris, 21 C."}],
    ),
    (
        [{"role": "user", "content": "Thanks. And what is my name?"}],
        [{"type": "message", "role": "assistant", "content": "Your name is Carol."}],
    ),
    ([{"role": "user", "content": "Bye!"}], []),
]


@dataclass
class Serving:
    """What preparing a chat body reads of the server (`requests.serving.Serving`)."""

    model: Model
    config: ServerConfig = field(default_factory=lambda: parse_serve_args([], {}))
    template: Any = None

    @property
    def vocab(self) -> Any:
        return self.model.vocab

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> Any:
        return self.model.vocab.tokenize(text, add_special, parse_special)


def _serving(model: Model, template_file: Path | None) -> Serving:
    args = ["--chat-template-file", str(template_file)] if template_file else []
    config = parse_serve_args(args, {})
    return Serving(model, config, load_chat_template(config, model))


def _chat(serving: Serving, items: list[dict[str, Any]]) -> ChatCompletionRequest:
    data = {"model": "m", "input": [], "tools": TOOLS, "instructions": "Be brief."}
    req = parse_body(ResponsesRequest, json.dumps(data).encode())
    return parse_body(ChatCompletionRequest, json.dumps(to_chat_body(data, req, items)).encode())


def _run(serving: Serving) -> list[tuple[ContinueMode, str]]:
    """Play TURNS; at each turn compare the continuation with the whole render tokenized.
    The modes and reasons of turns 2 on."""
    vocab = serving.vocab
    eos = vocab.piece(vocab.eos, special=True).decode()
    tokenize = lambda text, add: serving.tokenize(text, add, True)  # noqa: E731
    detokenize = lambda toks: vocab.detokenize(toks, special=True)  # noqa: E731
    history: list[dict[str, Any]] = []
    tokens: np.ndarray | None = None
    position: Position | None = None
    modes = []
    for new, answer in TURNS:
        items = history + stored_items(new)
        full = plan_chat(serving, _chat(serving, items)).prompt
        whole = tokenize(full, True)
        if tokens is not None and position is not None:
            before = render_history(serving, _chat(serving, history))
            cont = continue_chain(
                tokens, position, full=full, history=before, tokenize=tokenize,
                detokenize=detokenize,
            )  # fmt: skip
            modes.append((cont.mode, cont.reason))
            if cont.mode is ContinueMode.INCREMENTAL:
                assert cont.tokens.tolist() == whole.tolist(), "incremental != whole render"
            prompt = cont.tokens
        else:
            prompt = whole
        if not answer:
            break
        history = items + stored_items(answer)
        rendered_answer = render_history(serving, _chat(serving, history))[len(full) :]
        # What the model generates: the answer as the template renders it, to its end token.
        generated = rendered_answer[: rendered_answer.index(eos) + len(eos)]
        tokens = np.concatenate([prompt, tokenize(generated, False)]).astype(np.int32)
        position = Position(len(tokens), len(prompt), len(full), text_digest(full))
    return modes


@pytest.fixture(scope="module")
def tiny_chatml() -> Any:
    model = Model.load(tiny_model_path("llama", seed=3))
    yield model
    model.close()


@pytest.mark.parametrize("template", [None, QWEN25_TEMPLATE])
def test_smollm2_templates_continue_token_exactly(smollm2: Model, template: Path | None) -> None:
    """Decision: the next turn prefills only its new input. SmolLM2's own template (no tool
    syntax: tool calls as JSON) and a Hermes template (`<tool_call>`) continue on the mind's
    tokens for every turn, tool call and tool output included, with exactly the tokens of a
    full re-render."""
    modes = _run(_serving(smollm2, template))
    assert modes == [(ContinueMode.INCREMENTAL, "")] * (len(TURNS) - 1)


def test_tiny_model_template_continues_token_exactly(tiny_chatml: Model) -> None:
    """The tiny models' template (ChatML, their own vocabulary): the same proof."""
    modes = _run(_serving(tiny_chatml, None))
    assert modes == [(ContinueMode.INCREMENTAL, "")] * (len(TURNS) - 1)


@pytest.mark.parametrize("template", [QWEN3_TEMPLATE, TEMPLATES / "chatml-open-think.jinja"])
def test_thinking_templates_fall_back_to_a_whole_render(smollm2: Model, template: Path) -> None:
    """A template whose render of the history changes once a new turn follows (Qwen3 drops
    reasoning before the last user turn; an open-think generation prompt is not in the history)
    cannot continue incrementally: every such turn is rendered whole, with its reason, never
    spliced onto tokens the template would not produce."""
    modes = _run(_serving(smollm2, template))
    assert modes and all(m is not ContinueMode.INCREMENTAL for m, _ in modes), modes
    assert all(reason for _, reason in modes)
