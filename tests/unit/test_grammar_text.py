"""Pure grammar text: integer ranges, literals, patterns, undefined rules, schema errors.

Grammars are checked against libllama's own grammar sampler in tests/model/test_grammar.py;
here the pieces are checked as text (an integer range, having no recursion, is also a regex).
"""

from __future__ import annotations

import re

import pytest

from kvswap.grammar import SchemaError, json_schema_grammar
from kvswap.grammar.gbnf import RuleSet, char_class, literal, regex_escape, undefined_rules
from kvswap.grammar.ranges import int_range
from kvswap.grammar.regex import pattern_expr
from kvswap.grammar.schema import _not_strings


def as_regex(expr: str) -> re.Pattern[str]:
    """A recursion-free GBNF expression of literals, classes and counts as a Python regex."""
    out = re.sub(r'"((?:[^"\\]|\\.)*)"', lambda m: re.escape(m.group(1)), expr)
    return re.compile(out.replace(" ", ""))


@pytest.mark.parametrize(
    ("lo", "hi"),
    [(0, 0), (0, 9), (0, 120), (5, 37), (-15, 3), (-300, -7), (99, 1001), (-1, 1), (1, 10)],
)
def test_int_range_matches_exactly_the_integers_in_range(lo: int, hi: int) -> None:
    rx = as_regex(int_range(lo, hi))
    for n in range(lo - 150, hi + 150):
        assert bool(rx.fullmatch(str(n))) == (lo <= n <= hi), n
    for text in ("007", "-0", "", "+1"):
        assert not rx.fullmatch(text)


@pytest.mark.parametrize(("lo", "hi"), [(None, 50), (17, None), (-20, None), (None, -3)])
def test_half_open_int_ranges(lo: int | None, hi: int | None) -> None:
    rx = as_regex(int_range(lo, hi))
    for n in range(-500, 500):
        inside = (lo is None or n >= lo) and (hi is None or n <= hi)
        assert bool(rx.fullmatch(str(n))) == inside, n
    assert bool(rx.fullmatch("12345678901")) == (hi is None)


def test_empty_int_range_is_refused() -> None:
    with pytest.raises(ValueError):
        int_range(5, 4)


def test_literals_and_classes_escape_what_gbnf_needs() -> None:
    assert literal('a"b\\c\nd\te\x01') == '"a\\"b\\\\c\\nd\\te\\x01"'
    assert char_class("a-]^") == "[a\\x2D\\]\\x5E]"
    assert char_class("ab", negate=True) == "[^ab]"


def test_rule_set_names_are_unique_and_root_first() -> None:
    rules = RuleSet()
    assert rules.add("x y", '"1"') == "x-y"
    assert rules.add("x y", '"1"') == "x-y"  # same body: same rule
    assert rules.add("x y", '"2"') == "x-y1"
    rules.set("root", "x-y")
    assert rules.render().splitlines()[0] == "root ::= x-y"


def test_undefined_rules_names_what_is_missing() -> None:
    assert undefined_rules("root ::= foo") == ["foo"]
    assert undefined_rules('x ::= "a"') == ["root"]
    assert undefined_rules('root ::= [a-z]{1,3} "b c" | bar # no baz\nbar ::= "\\"q"') == []
    assert undefined_rules(json_schema_grammar({"type": "array", "items": {"$ref": "#"}})) == []


def test_regex_escape_for_trigger_words() -> None:
    assert regex_escape("<tool_call>") == "<tool_call>"
    assert regex_escape("[TOOL_CALLS]") == "\\[TOOL_CALLS\\]"
    assert regex_escape("a.b*c") == "a\\.b\\*c"


def test_pattern_writes_json_escapes_for_quotes_and_backslashes() -> None:
    expr = pattern_expr('^a"\\\\b$')
    assert '"\\\\\\""' in expr  # the quote appears as \" inside the JSON string
    with pytest.raises(ValueError):
        pattern_expr("(a)\\1")  # backreferences are not regular


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "frob"},
        {"enum": []},
        {"type": "object", "properties": []},
        {"$ref": "https://example.com/s.json"},
        {"$ref": "#/$defs/missing"},
        {"type": "array", "minItems": -1},
        {"type": "integer", "minimum": 5, "maximum": 1},
        {"type": "string", "pattern": "(unclosed"},
        False,
        "a string",
    ],
)
def test_invalid_schemas_raise_schema_error(schema: object) -> None:
    with pytest.raises(SchemaError):
        json_schema_grammar(schema)


def test_not_strings_excludes_exactly_the_listed_keys() -> None:
    expr = _not_strings(["ab", "a"], "char")
    assert expr.startswith('"\\"" (') and expr.endswith(') "\\""')
