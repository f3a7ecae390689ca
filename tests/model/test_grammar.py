"""Grammars on the real libllama: schema grammars accept exactly valid JSON (SmolLM2's
vocabulary), bad grammars are refused with a reason, and a sampler chain with a grammar
generates valid output on a real context (the grammar never sees prompt tokens)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import jsonschema
import numpy as np
import pytest

from kvswap.backend.batch import Batch
from kvswap.backend.context import Context, ContextParams
from kvswap.backend.grammar import GrammarError, check_grammar
from kvswap.backend.model import Model
from kvswap.backend.sampler import SamplerChain
from kvswap.core.sampling import SamplingParams
from kvswap.grammar import json_schema_grammar
from kvswap.grammar.gbnf import RuleSet, literal, text_until
from tests.model.grammar_util import grammar_accepts

pytestmark = [pytest.mark.model, pytest.mark.timeout(120)]

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 130},
        "role": {"enum": ["admin", "user", None]},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
        "address": {"$ref": "#/$defs/address"},
    },
    "required": ["name", "age"],
    "$defs": {
        "address": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
            },
            "required": ["city"],
        }
    },
}

CASES: list[tuple[dict[str, Any], list[str], list[str]]] = [
    (
        PERSON,
        [
            '{"name": "Ann", "age": 30}',
            '{"name":"Bo","age":0,"role":null,"tags":["a","b"],"address":{"city":"X","zip":"01234"}}',
            '{\n  "name": "Cy",\n  "age": 130,\n  "role": "admin"\n}',
        ],
        [
            '{"age": 30, "name": "Ann"}',  # order: required keys first, as declared
            '{"name": "Ann", "age": 131}',
            '{"name": "", "age": 1}',
            '{"name": "Ann", "age": 1, "tags": ["a", "b", "c", "d"]}',
            '{"name": "Ann", "age": 1, "address": {"city": "X", "zip": "1234"}}',
            '{"name": "Ann", "age": 1, "extra": 1}',
            '{"name": "A\nB", "age": 1}',
        ],
    ),
    (
        {"type": "array", "items": {"type": "number"}, "minItems": 1},
        ["[1]", "[-2.5e10, 0.0, 3]"],
        ["[]", "[01]", '["1"]', "[1,]"],
    ),
    (
        {"anyOf": [{"type": "boolean"}, {"type": "string", "format": "date"}]},
        ["true", '"2024-02-29"'],
        ['"2024-13-01"', "null"],
    ),
    (
        {
            "type": "object",
            "additionalProperties": {"type": "integer"},
            "properties": {"a": {"type": "string"}},
        },
        ['{"a": "x", "b": 1, "c": 2}', '{"b": 1}', "{}"],
        ['{"b": "x"}', '{"a": 1}'],
    ),
    (
        {"type": "object", "properties": {"next": {"$ref": "#"}, "v": {"type": "integer"}}},
        ['{"next": {"next": {}}, "v": 1}', '{"v": 1}'],
        ['{"next": 1}', '{"v": 1, "next": {}}'],  # optional keys come in declared order
    ),
]


@pytest.mark.parametrize(("schema", "good", "bad"), CASES)
def test_schema_grammar_accepts_valid_and_refuses_invalid(
    smollm2: Model, schema: dict, good: list[str], bad: list[str]
) -> None:
    gbnf = json_schema_grammar(schema)
    check_grammar(smollm2.vocab, gbnf)
    for text in good:
        jsonschema.validate(json.loads(text), schema)
        assert grammar_accepts(smollm2.vocab, gbnf, text), text
    for text in bad:
        assert not grammar_accepts(smollm2.vocab, gbnf, text), text


def test_text_until_stops_at_the_word(smollm2: Model) -> None:
    rules = RuleSet()
    rules.set("root", f"{text_until(rules, '</think>', 'r')} {literal('ok')}")
    gbnf = rules.render()
    assert grammar_accepts(smollm2.vocab, gbnf, "a < b </thin </think>ok")
    assert not grammar_accepts(smollm2.vocab, gbnf, "a </think> b </think>ok")


@pytest.mark.parametrize(
    ("gbnf", "needle"),
    [("root ::= foo", "undefined rule 'foo'"), ('x ::= "a"', "root"), ("root ::= [a-", None)],
)
def test_bad_grammars_are_refused(smollm2: Model, gbnf: str, needle: str | None) -> None:
    with pytest.raises(GrammarError, match=needle):
        check_grammar(smollm2.vocab, gbnf)


@pytest.fixture()
def ctx(smollm2: Model) -> Iterator[Context]:
    context = Context(
        smollm2,
        ContextParams(
            n_ctx=512,
            n_seq_max=1,
            n_batch=512,
            n_ubatch=512,
            kv_unified=True,
            n_threads=1,  # one thread per context: two contend on a shared 2-core machine
            n_threads_batch=1,
        ),
    )
    yield context
    context.close()


def generate(ctx: Context, model: Model, chain: SamplerChain, prompt: str, n: int) -> list[int]:
    batch = Batch(512)
    try:
        toks = model.vocab.tokenize(prompt, add_special=True, parse_special=True)
        for tok in toks:
            chain.accept(int(tok))  # prompt history: reaches the chain, never the grammar
        idx = batch.add_span(toks, 0, 0, True)
        assert ctx.decode(batch) == 0
        out: list[int] = []
        pos = len(toks)
        for _ in range(n):
            tok = chain.sample(ctx, idx)
            if model.vocab.is_eog(tok):
                break
            out.append(tok)
            batch.clear()
            idx = batch.add_span(np.array([tok], dtype=np.int32), pos, 0, True)
            pos += 1
            assert ctx.decode(batch) == 0
        return out
    finally:
        batch.close()


def test_sampler_chain_with_a_grammar_generates_valid_json(ctx: Context, smollm2: Model) -> None:
    params = SamplingParams(temperature=0.9, seed=42, grammar=json_schema_grammar(PERSON))
    chain = SamplerChain(smollm2.vocab, params, 512)
    try:
        out = generate(ctx, smollm2, chain, "<|im_start|>user\nA person as JSON<|im_end|>\n", 300)
    finally:
        chain.close()
    jsonschema.validate(json.loads(smollm2.vocab.detokenize(out)), PERSON)


def test_post_sampling_candidates_at_temperature_zero(ctx: Context, smollm2: Model) -> None:
    params = SamplingParams(temperature=0.0, record_candidates=True)
    chain = SamplerChain(smollm2.vocab, params, 512)
    try:
        out = generate(ctx, smollm2, chain, "The capital of France is", 1)
        probs = chain.post_sampling_probs(out[0], 5)
    finally:
        chain.close()
    assert probs is not None and probs.prob == 1.0
    assert [t.token for t in probs.top] == [out[0]]
