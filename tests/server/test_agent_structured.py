"""Structured output: every answer parses and validates against its JSON schema (checked with
`jsonschema`), on every route that takes one, streamed and not, on SmolLM2 and on a tiny random
model (where only the grammar can make the output valid); GBNF grammars bind the same way."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import jsonschema
import pytest

from kvswap.tiny import tiny_model_path
from tests.server.agent_util import oai
from tests.server.harness import ServerProcess

pytestmark = [pytest.mark.model, pytest.mark.timeout(300)]

SCHEMAS: dict[str, dict[str, Any]] = {
    "nested": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 20},
            "address": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "maxLength": 20},
                    "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
                },
                "required": ["city", "zip"],
            },
        },
        "required": ["name", "address"],
    },
    "array": {
        "type": "array",
        "items": {"type": "integer", "minimum": -5, "maximum": 100},
        "minItems": 1,
        "maxItems": 4,
    },
    "enums": {
        "type": "object",
        "properties": {
            "color": {"enum": ["red", "green", "blue"]},
            "size": {"type": "string", "enum": ["S", "M", "L"]},
            "ok": {"type": "boolean"},
        },
        "required": ["color", "size", "ok"],
    },
    "required_and_optional": {
        "type": "object",
        "properties": {
            "id": {"type": "integer", "minimum": 1, "maximum": 999},
            "note": {"type": "string", "maxLength": 12},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 2},
            "when": {"type": "string", "format": "date"},
        },
        "required": ["id", "tags"],
        "additionalProperties": False,
    },
}
PROMPT = "Reply with one JSON value that fits the schema."


@pytest.fixture(scope="module")
def tiny_server(server_factory: Callable[..., ServerProcess]) -> ServerProcess:
    model = tiny_model_path("llama", seed=7, vocab="tiny")
    return server_factory("-m", str(model), "-c", "2048", "-np", "2", "-t", "1", "-tb", "1")


@pytest.fixture(params=["agent_server", "tiny_server"])
def server(request: pytest.FixtureRequest) -> ServerProcess:
    return request.getfixturevalue(request.param)


def check(text: str, schema: dict[str, Any]) -> None:
    jsonschema.validate(json.loads(text), schema)


@pytest.mark.parametrize("name", SCHEMAS)
def test_completion_json_schema(server: ServerProcess, name: str) -> None:
    schema = SCHEMAS[name]
    body = {
        "prompt": PROMPT,
        "json_schema": schema,
        "n_predict": 600,
        "temperature": 0.7,
        "seed": 3,
    }
    out = server.post("/completion", body).json()
    assert out["stop_type"] == "eos", out
    check(out["content"], schema)
    assert out["generation_settings"]["grammar"].startswith("root ::=")
    chunks = list(server.stream("/completion", {**body, "stream": True}))
    assert chunks[-1]["stop_type"] == "eos"
    check("".join(c["content"] for c in chunks), schema)


@pytest.mark.parametrize("name", SCHEMAS)
def test_chat_response_format_json_schema(server: ServerProcess, name: str) -> None:
    schema = SCHEMAS[name]
    client = oai(server)
    args: dict[str, Any] = {
        "model": "m",
        "messages": [{"role": "user", "content": PROMPT}],
        "response_format": {"type": "json_schema", "json_schema": {"name": name, "schema": schema}},
        "max_tokens": 600,
        "temperature": 0,
    }
    out = client.chat.completions.create(**args)
    assert out.choices[0].finish_reason == "stop"
    check(out.choices[0].message.content or "", schema)
    text = "".join(
        c.choices[0].delta.content or ""
        for c in client.chat.completions.create(**args, stream=True)
        if c.choices
    )
    check(text, schema)
    assert text == out.choices[0].message.content


def test_json_object_and_v1_completions(server: ServerProcess) -> None:
    client = oai(server)
    out = client.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "Any JSON object."}],
        response_format={"type": "json_object"},
        max_tokens=300,
        temperature=0,
        extra_body={"json_schema": None},
    )
    if out.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(out.choices[0].message.content or ""), dict)
    schema = SCHEMAS["enums"]
    legacy = client.completions.create(
        model="m",
        prompt=PROMPT,
        max_tokens=300,
        temperature=0,
        extra_body={"response_format": {"type": "json_schema", "json_schema": {"schema": schema}}},
    )
    assert legacy.choices[0].finish_reason == "stop"
    check(legacy.choices[0].text, schema)


def test_gbnf_grammar_binds_completion_and_chat(agent_server: ServerProcess) -> None:
    grammar = 'root ::= ("yes" | "no") ", because " [a-z ]{1,30} "."'
    out = agent_server.post(
        "/completion",
        {"prompt": "Is the sky blue?", "grammar": grammar, "n_predict": 64, "temperature": 0},
    ).json()
    assert re.fullmatch(r"(yes|no), because [a-z ]{1,30}\.", out["content"]), out["content"]
    chat = oai(agent_server).chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "Is the sky blue?"}],
        max_tokens=64,
        temperature=0,
        extra_body={"grammar": grammar},
    )
    assert re.fullmatch(r"(yes|no), because [a-z ]{1,30}\.", chat.choices[0].message.content or "")


def test_lazy_grammar_waits_for_its_trigger(agent_server: ServerProcess) -> None:
    # SmolLM2 answers "1. 1.1.1..." here; from the trigger "1" on, the grammar writes the rest.
    body = {
        "prompt": "<|im_start|>user\nCount to three.<|im_end|>\n<|im_start|>assistant\n",
        "grammar": 'root ::= "1" [. ]{0,3} "ANSWER=" [0-9]',
        "grammar_lazy": True,
        "grammar_triggers": [{"type": 1, "value": "1"}],
        "n_predict": 80,
        "temperature": 0,
    }
    out = agent_server.post("/completion", body).json()
    assert out["stop_type"] == "eos"
    assert re.fullmatch(r"[^1]*1[. ]{0,3}ANSWER=[0-9]", out["content"]), out["content"]
    settings = out["generation_settings"]
    assert settings["grammar_lazy"] is True
