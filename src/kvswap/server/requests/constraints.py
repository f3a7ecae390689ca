"""Constrained output for a request: which grammar, checked before anything runs.

Owns the meaning of `grammar`, `json_schema`, `response_format`, `grammar_lazy` and
`grammar_triggers` (llama-server's `server-schema.cpp` fields, and `oaicompat_chat_params_parse`
for `response_format`), the JSON-schema conversion (`kvswap.grammar`), and the typed 400s: an
invalid schema, a grammar libllama refuses (checked here with the vocabulary, off the engine
thread), both `grammar` and `json_schema`, a lazy grammar without triggers. The engine receives
the result in `SamplingParams` (`with_constraint`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from kvswap.backend.grammar import GrammarError, check_grammar
from kvswap.backend.vocab import Vocab
from kvswap.core.errors import ErrorKind, KvswapError
from kvswap.core.types import GenerationRequest
from kvswap.grammar import SchemaError, json_schema_grammar
from kvswap.grammar.gbnf import regex_escape
from kvswap.server.requests.schemas import GenerationFields, ResponseFormat


class GrammarSource(StrEnum):
    """Where a grammar came from (llama-server's `common_grammar_type`)."""

    USER = "user"  # the request's `grammar`
    OUTPUT_FORMAT = "output_format"  # `json_schema` or `response_format`
    TOOL_CALLS = "tool_calls"  # the chat format's tool-call grammar


@dataclass(frozen=True)
class Constraint:
    """A grammar and, when lazy, what triggers it."""

    grammar: str
    source: GrammarSource
    trigger_patterns: tuple[str, ...] = ()
    trigger_tokens: tuple[int, ...] = ()

    @property
    def lazy(self) -> bool:
        return bool(self.trigger_patterns or self.trigger_tokens)


# llama-server's common_grammar_trigger_type
_TRIGGER_TOKEN, _TRIGGER_WORD, _TRIGGER_PATTERN, _TRIGGER_PATTERN_FULL = range(4)


def _invalid(message: str) -> KvswapError:
    return KvswapError(ErrorKind.INVALID_REQUEST, message)


def schema_grammar(schema: Any, field: str = "json_schema") -> str:
    """The grammar of a JSON schema; a typed 400 naming `field` when it is invalid."""
    try:
        return json_schema_grammar(schema)
    except SchemaError as err:
        raise _invalid(f'"{field}": {err}') from err


def response_format_schema(fmt: ResponseFormat | None) -> dict[str, Any] | None:
    """The schema `response_format` asks for, as `oaicompat_chat_params_parse` reads it:
    `json_object` (optionally with `schema`) or `json_schema` (`json_schema.schema`); an
    absent or empty schema means any object. None for "text" or no format."""
    if fmt is None or fmt.type in (None, "", "text"):
        return None
    if fmt.type == "json_object":
        schema = fmt.schema_ or {}
    else:
        wrapper = fmt.json_schema or {}
        schema = wrapper.get("schema", {}) if isinstance(wrapper, dict) else {}
        if not isinstance(schema, dict):
            raise _invalid('"response_format": json_schema.schema must be an object')
    return schema or {"type": "object"}


def _triggers(raw: list[Any]) -> tuple[tuple[str, ...], tuple[int, ...]]:
    patterns: list[str] = []
    tokens: list[int] = []
    for i, item in enumerate(raw):
        if isinstance(item, str):
            patterns.append(regex_escape(item))
            continue
        kind = item.get("type") if isinstance(item, dict) else None
        value = item.get("value") if isinstance(item, dict) else None
        if kind == _TRIGGER_TOKEN and isinstance(item.get("token"), int):
            tokens.append(item["token"])
        elif kind in (_TRIGGER_WORD, _TRIGGER_PATTERN, _TRIGGER_PATTERN_FULL) and isinstance(
            value, str
        ):
            if kind == _TRIGGER_WORD:
                patterns.append(regex_escape(value))
            elif kind == _TRIGGER_PATTERN:
                patterns.append(value)
            else:
                patterns.append(
                    ("" if value.startswith("^") else "^")
                    + value
                    + ("" if value.endswith("$") else "$")
                )
        else:
            raise _invalid(f"grammar_triggers[{i}] must be {{type, value}} (token: {{token}})")
    return tuple(patterns), tuple(tokens)


def completion_constraint(
    body: GenerationFields, response_format: ResponseFormat | None = None
) -> Constraint | None:
    """The constraint of a /completion or /v1/completions body (None: unconstrained)."""
    schema = body.json_schema
    if schema is None:
        schema = response_format_schema(response_format)
    if schema is not None and body.grammar:
        raise _invalid("Cannot use both json_schema and grammar")
    if schema is not None:
        return Constraint(schema_grammar(schema), GrammarSource.OUTPUT_FORMAT)
    if not body.grammar:
        return None
    patterns: tuple[str, ...] = ()
    tokens: tuple[int, ...] = ()
    if body.grammar_lazy:
        patterns, tokens = _triggers(body.grammar_triggers or [])
        if not patterns and not tokens:
            raise _invalid("Error: no triggers set for lazy grammar!")
    return Constraint(body.grammar, GrammarSource.USER, patterns, tokens)


def check_constraint(vocab: Vocab, constraint: Constraint) -> None:
    """A typed 400 unless libllama accepts the grammar (and its triggers)."""
    try:
        check_grammar(
            vocab, constraint.grammar, constraint.trigger_patterns, constraint.trigger_tokens
        )
    except GrammarError as err:
        raise _invalid(f'"grammar": {err}') from err
    for tok in constraint.trigger_tokens:
        if not vocab.valid(tok):
            raise _invalid(f"grammar trigger token {tok} is not in the vocabulary")


def with_constraint(req: GenerationRequest, constraint: Constraint | None) -> GenerationRequest:
    """The request with its grammar in the sampling parameters."""
    if constraint is None:
        return req
    sampling = dataclasses.replace(
        req.sampling,
        grammar=constraint.grammar,
        grammar_trigger_patterns=constraint.trigger_patterns,
        grammar_trigger_tokens=constraint.trigger_tokens,
    )
    return dataclasses.replace(req, sampling=sampling)
