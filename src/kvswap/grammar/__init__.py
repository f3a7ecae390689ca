"""Grammars for constrained output, as GBNF text for libllama's grammar sampler.

`gbnf` (literals, character classes, a rule set with unique names, "any text up to a word"),
`ranges` (decimal integers within bounds), `regex` (JSON-schema `pattern` to GBNF), `schema`
(JSON schema to GBNF). Pure text: nothing here imports libllama; `kvswap.backend.grammar` checks
that libllama accepts a grammar.
"""

from kvswap.grammar.schema import SchemaError, json_schema_grammar

__all__ = ["SchemaError", "json_schema_grammar"]
