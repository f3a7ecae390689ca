"""Hypothesis strategies for HTTP requests built from an app's OpenAPI description.

Generic over the document: every operation (method, path) it lists gets cases made of its path
and query parameters and its JSON request body, drawn from the published JSON schemas (`$ref`,
`anyOf`, `type`, bounds, `items`, `properties`, `required`, `enum`), mixed with values that break
the schema (any JSON, raw bytes, text where a number is expected). Routes added later are fuzzed
once they appear in the document. `hints` add chosen values for named fields (a slot verb, a
page name, an escaping filename) so that deep paths are reached, `caps` narrow a field's
numeric range where the full range would only measure the machine (a 1e9-token KV pool), and
`headers` are drawn per case from their listed values (None: the header is not sent), e.g. an
API key or a mind name.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from hypothesis import strategies as st

Schema = Mapping[str, Any]

MAX_DEPTH = 5
# Text without lone surrogates (a client cannot encode those as UTF-8 JSON).
TEXT = st.text(st.characters(exclude_categories=("Cs",)), max_size=24)
WILD_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | TEXT
)
WILD_JSON = st.recursive(
    WILD_SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
    max_leaves=10,
)


@dataclass(frozen=True)
class Operation:
    method: str
    path: str  # as in the document: /slots/{id_slot}
    params: tuple[Schema, ...]
    body: Schema | None  # the JSON body's schema; None when the operation takes none


@dataclass(frozen=True)
class Case:
    method: str
    url: str  # path with parameters filled in and the query string
    content: bytes | None
    headers: tuple[tuple[str, str], ...] = ()

    def describe(self) -> str:
        body = f" {self.content[:300]!r}" if self.content else ""
        return f"{self.method} {self.url}{body} headers {dict(self.headers)}"


@dataclass(frozen=True)
class Fuzzer:
    document: Schema
    hints: Mapping[str, tuple[Any, ...]] = field(default_factory=dict)
    caps: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    headers: Mapping[str, tuple[str | None, ...]] = field(default_factory=dict)

    def operations(self) -> list[Operation]:
        out = []
        for path, ops in self.document.get("paths", {}).items():
            for method, op in ops.items():
                content = op.get("requestBody", {}).get("content", {})
                body = content.get("application/json", {}).get("schema") if content else None
                out.append(Operation(method.upper(), path, tuple(op.get("parameters", ())), body))
        return out

    def cases(self, op: Operation) -> st.SearchStrategy[Case]:
        return st.builds(
            self._case,
            st.just(op),
            st.fixed_dictionaries({p["name"]: self._param(p) for p in op.params}),
            self._body(op),
            st.fixed_dictionaries({h: st.sampled_from(v) for h, v in self.headers.items()}),
        )

    def _case(
        self,
        op: Operation,
        values: dict[str, Any],
        content: bytes | None,
        headers: dict[str, str | None],
    ) -> Case:
        path = op.path
        query = []
        for p in op.params:
            value = values[p["name"]]
            if value is _ABSENT:
                continue
            text = json.dumps(value) if not isinstance(value, str) else value
            if p["in"] == "path":
                path = path.replace("{" + p["name"] + "}", quote(text, safe="") or "0")
            elif p["in"] == "query":
                query.append(f"{quote(p['name'])}={quote(text, safe='')}")
        sent = tuple((h, v) for h, v in sorted(headers.items()) if v is not None)
        return Case(op.method, path + ("?" + "&".join(query) if query else ""), content, sent)

    def _param(self, param: Schema) -> st.SearchStrategy[Any]:
        value = self.value(param.get("schema", {}), param["name"])
        wild = WILD_SCALARS.filter(lambda v: v is not None)
        if param["in"] == "path":
            return st.one_of(value, value, wild)
        return st.one_of(value, value, wild, st.just(_ABSENT))

    def _body(self, op: Operation) -> st.SearchStrategy[bytes | None]:
        raw = st.binary(max_size=64)
        if op.body is None:
            return st.one_of(st.none(), st.none(), raw)
        typed = self.value(op.body, "").map(lambda v: json.dumps(v).encode())
        wild = WILD_JSON.map(lambda v: json.dumps(v).encode())
        return st.one_of(typed, typed, typed, typed, wild, raw)

    def value(self, schema: Schema, name: str, depth: int = 0) -> st.SearchStrategy[Any]:
        """Values mostly valid under `schema`, with the hints for `name` mixed in."""
        base = self._from_schema(schema, name, depth)
        if name in self.hints:
            return st.one_of(st.sampled_from(self.hints[name]), base)
        return base

    def _from_schema(self, schema: Schema, name: str, depth: int) -> st.SearchStrategy[Any]:
        if depth > MAX_DEPTH:
            return WILD_SCALARS
        if "$ref" in schema:
            return self._from_schema(self._resolve(schema["$ref"]), name, depth + 1)
        for key in ("anyOf", "oneOf"):
            if key in schema:
                return st.one_of([self._from_schema(s, name, depth + 1) for s in schema[key]])
        if "allOf" in schema:
            return self._from_schema(schema["allOf"][0], name, depth + 1)
        if "enum" in schema:
            return st.sampled_from(schema["enum"])
        if "const" in schema:
            return st.just(schema["const"])
        kind = schema.get("type")
        if isinstance(kind, list):
            return st.one_of([self._from_schema({**schema, "type": k}, name, depth) for k in kind])
        if kind == "integer":
            return self._integers(schema, name)
        if kind == "number":
            lo, hi = self._bounds(schema, name)
            return st.floats(lo, hi, allow_nan=False, allow_infinity=False)
        if kind == "string":
            return TEXT | st.text(max_size=300)
        if kind == "boolean":
            return st.booleans()
        if kind == "null":
            return st.none()
        if kind == "array":
            items = self._from_schema(schema.get("items", {}), name, depth + 1)
            return st.lists(items, min_size=schema.get("minItems", 0), max_size=4)
        if kind == "object" or "properties" in schema:
            return self._object(schema, depth)
        return WILD_JSON

    def _object(self, schema: Schema, depth: int) -> st.SearchStrategy[Any]:
        props = schema.get("properties", {})
        required = set(schema.get("required", ()))
        strategies = {k: self.value(v, k, depth + 1) for k, v in props.items()}
        obj = st.fixed_dictionaries(
            {k: s for k, s in strategies.items() if k in required},
            optional={k: s for k, s in strategies.items() if k not in required},
        )
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict) and not props:
            return st.dictionaries(TEXT, self._from_schema(extra, "", depth + 1), max_size=3)
        return obj

    def _bounds(self, schema: Schema, name: str) -> tuple[float | None, float | None]:
        lo = schema.get("minimum")
        hi = schema.get("maximum")
        if name in self.caps:
            cap_lo, cap_hi = self.caps[name]
            lo = cap_lo if lo is None else max(lo, cap_lo)
            hi = cap_hi if hi is None else min(hi, cap_hi)
        return lo, hi

    def _integers(self, schema: Schema, name: str) -> st.SearchStrategy[int]:
        lo, hi = self._bounds(schema, name)
        lo_i = int(lo) if lo is not None else -(2**64)
        hi_i = int(hi) if hi is not None else 2**64
        edges = [v for v in (lo_i, lo_i + 1, 0, 1, hi_i - 1, hi_i) if lo_i <= v <= hi_i]
        return st.one_of(st.sampled_from(edges), st.integers(lo_i, hi_i))

    def _resolve(self, ref: str) -> Schema:
        node: Any = self.document
        for part in ref.lstrip("#/").split("/"):
            node = node[part]
        return node


class _Absent:
    def __repr__(self) -> str:
        return "<absent>"


_ABSENT = _Absent()
