"""JSON schema to GBNF, so that libllama's grammar sampler only lets valid JSON through.

Covers what llama-server's `json-schema-to-grammar.cpp` covers, written from the JSON-schema
rules: `type` (one or a list), `enum`, `const`, `anyOf`/`oneOf`, `allOf` (merged), local `$ref`
(recursion included), objects (`properties`, `required`, `additionalProperties`; with
properties and no `additionalProperties`, only the listed keys), arrays (`items`, `prefixItems`,
`minItems`, `maxItems`), strings (`minLength`, `maxLength`, `pattern`, `format` date, time,
date-time, uuid), integers with `minimum`/`maximum` (exclusive ones too), numbers (a
`minimum` >= 0 drops the sign), booleans, null. Strings never hold raw control characters, so
the text always parses with a strict JSON parser. Beyond llama-server: a `required` key that
`properties` does not describe is still produced (any value), so the output validates.

Not enforced (as llama-server): `uniqueItems`, number bounds other than the sign, `not`,
conditionals, string formats other than those above. An invalid schema raises `SchemaError`.
Pure; `SchemaConverter` also lets the chat formats embed several schemas in one grammar.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from kvswap.grammar.gbnf import RuleSet, char_class, literal
from kvswap.grammar.ranges import int_range
from kvswap.grammar.regex import pattern_expr

SPACE = '| " " | "\\n" [ \\t]{0,20}'

_PRIMITIVES: dict[str, tuple[str, tuple[str, ...]]] = {
    "boolean": ('("true" | "false")', ()),
    "null": ('"null"', ()),
    "decimal-part": ("[0-9]{1,16}", ()),
    "integral-part": ("[0] | [1-9] [0-9]{0,15}", ()),
    "number": (
        '("-"? integral-part) ("." decimal-part)? ([eE] [-+]? integral-part)?',
        ("integral-part", "decimal-part"),
    ),
    "unsigned-number": (
        'integral-part ("." decimal-part)? ([eE] [-+]? integral-part)?',
        ("integral-part", "decimal-part"),
    ),
    "integer": ('("-"? integral-part)', ("integral-part",)),
    "char": ('[^"\\\\\\x7F\\x00-\\x1F] | [\\\\] (["\\\\/bfnrt] | "u" [0-9a-fA-F]{4})', ()),
    "string": ('"\\"" char* "\\""', ("char",)),
    "value": (
        "object | array | string | number | boolean | null",
        ("object", "array", "string", "number", "boolean", "null"),
    ),
    "object": (
        '"{" space ( string space ":" space value ("," space string space ":" space value)* )? '
        'space "}"',
        ("string", "value"),
    ),
    "array": ('"[" space ( value ("," space value)* )? space "]"', ("value",)),
    "uuid": (
        '"\\"" [0-9a-fA-F]{8} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} '
        '"-" [0-9a-fA-F]{12} "\\""',
        (),
    ),
    "date": (
        '[0-9]{4} "-" ( "0" [1-9] | "1" [0-2] ) "-" ( "0" [1-9] | [1-2] [0-9] | "3" [0-1] )',
        (),
    ),
    "time": (
        '([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9] ":" [0-5] [0-9] ( "." [0-9]{3} )? '
        '( "Z" | ( "+" | "-" ) ( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] )',
        (),
    ),
    "date-time": ('date "T" time', ("date", "time")),
    "date-string": ('"\\"" date "\\""', ("date",)),
    "time-string": ('"\\"" time "\\""', ("time",)),
    "date-time-string": ('"\\"" date-time "\\""', ("date-time",)),
}
_TYPES = ("object", "array", "string", "integer", "number", "boolean", "null")


class SchemaError(ValueError):
    """A JSON schema that is invalid, or that kvswap cannot turn into a grammar."""


def _const(value: object) -> str:
    return literal(json.dumps(value, ensure_ascii=False, separators=(",", ":")))


def _count(schema: dict[str, Any], key: str, default: int | None) -> int | None:
    value = schema.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise SchemaError(f"{key} must be a non-negative integer")
    return value


def _repeat(item: str, lo: int, hi: int | None, sep: str = "") -> str:
    """`item` lo..hi times (hi None: unbounded), with `sep` between items."""
    if hi is not None and hi < lo:
        raise SchemaError(f"maximum count {hi} is below minimum {lo}")
    if hi == 0:
        return ""
    if not sep:
        if hi is None:
            return f"{item}{{{lo},}}" if lo > 1 else f"{item}{'*' if lo == 0 else '+'}"
        return f"{item}{{{lo},{hi}}}" if lo != hi else f"{item}{{{lo}}}"
    rest = _repeat(f"({sep} {item})", max(0, lo - 1), None if hi is None else hi - 1)
    both = f"{item} {rest}".strip()
    return f"({both})?" if lo == 0 else both


class SchemaConverter:
    """Turns schemas into rules of one `RuleSet`; each `add` call is its own `$ref` document."""

    def __init__(self, rules: RuleSet | None = None) -> None:
        self.rules = rules if rules is not None else RuleSet()
        self.rules.set("space", SPACE)
        self._doc: Any = None
        self._refs: dict[tuple[int, str], str] = {}

    def add(self, schema: object, name: str) -> str:
        """Add rules for `schema` (its `$ref`s resolve inside it); returns its rule name."""
        saved, self._doc = self._doc, schema
        try:
            return self._visit(schema, name)
        finally:
            self._doc = saved

    def primitive(self, name: str) -> str:
        body, deps = _PRIMITIVES[name]
        if not self.rules.has(name):
            self.rules.set(name, body)
            for dep in deps:
                self.primitive(dep)
        return name

    # -- visiting ---------------------------------------------------------------------------

    def _visit(self, schema: object, name: str) -> str:
        return self.rules.add(name, self._expr(schema, name))

    def _expr(self, schema: object, name: str) -> str:
        """A GBNF expression for `schema` (sub-rules are added as needed)."""
        if schema is True:
            return self.primitive("value")
        if schema is False:
            raise SchemaError(f"{name}: the schema false admits no value")
        if not isinstance(schema, dict):
            raise SchemaError(f"{name}: a schema must be an object or a boolean")
        if "$ref" in schema:
            return self._ref(schema["$ref"])
        for key in ("anyOf", "oneOf"):
            if key in schema:
                alts = schema[key]
                if not isinstance(alts, list) or not alts:
                    raise SchemaError(f"{name}: {key} must be a non-empty array")
                base = {k: v for k, v in schema.items() if k != key}
                return " | ".join(
                    self._visit(_merge(base, alt) if base else alt, f"{name}-{i}")
                    for i, alt in enumerate(alts)
                )
        if "allOf" in schema:
            parts = schema["allOf"]
            if not isinstance(parts, list) or not parts:
                raise SchemaError(f"{name}: allOf must be a non-empty array")
            merged = {k: v for k, v in schema.items() if k != "allOf"}
            for part in parts:
                merged = _merge(merged, self._deref(part))
            return self._expr(merged, name)
        kind = schema.get("type")
        if isinstance(kind, list):
            if not kind:
                raise SchemaError(f"{name}: type must not be empty")
            return " | ".join(
                self._visit({**schema, "type": t}, f"{name}-{t}")
                for t in kind
                if isinstance(t, str)
            )
        if "const" in schema:
            return _const(schema["const"])
        if "enum" in schema:
            values = schema["enum"]
            if not isinstance(values, list) or not values:
                raise SchemaError(f"{name}: enum must be a non-empty array")
            return "(" + " | ".join(_const(v) for v in values) + ")"
        if kind is not None and kind not in _TYPES:
            raise SchemaError(f"{name}: unrecognized type {kind!r}")
        kind = kind or _infer_type(schema)
        if kind is None:
            return self.primitive("value")
        return getattr(self, f"_{kind}")(schema, name)

    def _ref(self, ref: object) -> str:
        if not isinstance(ref, str) or not ref.startswith("#"):
            raise SchemaError(f"unsupported $ref {ref!r}: only references inside the schema")
        key = (id(self._doc), ref)
        if key not in self._refs:
            target = self._resolve(ref)
            rule = self.rules.reserve("ref-" + (ref.rsplit("/", 1)[-1] or "root"))
            self._refs[key] = rule  # set first: a cycle back to this $ref stops here
            self.rules.set(rule, self._expr(target, rule))
        return self._refs[key]

    def _resolve(self, ref: str) -> Any:
        node = self._doc
        for raw in ref[1:].split("/")[1:] if ref != "#" else []:
            part = raw.replace("~1", "/").replace("~0", "~")
            if isinstance(node, dict) and part in node:
                node = node[part]
            elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            else:
                raise SchemaError(f"cannot resolve $ref {ref!r}")
        return node

    def _deref(self, schema: object) -> Any:
        seen = 0
        while isinstance(schema, dict) and "$ref" in schema and seen < 32:
            ref = schema["$ref"]
            if not isinstance(ref, str) or not ref.startswith("#"):
                raise SchemaError(f"unsupported $ref {ref!r}")
            schema = self._resolve(ref)
            seen += 1
        return schema

    # -- types ------------------------------------------------------------------------------

    def _object(self, schema: dict[str, Any], name: str) -> str:
        props = schema.get("properties", {})
        if not isinstance(props, dict):
            raise SchemaError(f"{name}: properties must be an object")
        required = schema.get("required", [])
        if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
            raise SchemaError(f"{name}: required must be an array of strings")
        extra = schema.get("additionalProperties", "properties" not in schema)
        if not isinstance(extra, bool | dict):
            raise SchemaError(f"{name}: additionalProperties must be a boolean or a schema")
        props = {**props, **{r: True for r in required if r not in props}}
        if not props and extra is True:
            return self.primitive("object")
        kvs: dict[str, str] = {}
        for key, sub in props.items():
            value = self._visit(sub, f"{name}-{key}")
            kvs[key] = self.rules.add(f"{name}-{key}-kv", f'{_const(key)} space ":" space {value}')
        req = [k for k in props if k in required]
        opt = [k for k in props if k not in required]
        if extra is not False:
            value = self._visit(extra, f"{name}-additional-value")
            key_rule = self.primitive("string")
            if props:
                key_rule = self.rules.add(
                    f"{name}-additional-k", _not_strings(list(props), self.primitive("char"))
                )
            kvs["*"] = self.rules.add(
                f"{name}-additional-kv", f'{key_rule} space ":" space {value}'
            )
            opt.append("*")
        if not req and not opt:
            return '"{" space "}"'
        body = ' "," space '.join(kvs[k] for k in req)
        if opt:
            chains = " | ".join(self._optional_chain(kvs, opt[i:], name) for i in range(len(opt)))
            body += f' ( "," space ( {chains} ) )?' if req else f" ( {chains} )?"
        return f'"{{" space {body} space "}}"'

    def _optional_chain(self, kvs: dict[str, str], keys: list[str], name: str) -> str:
        """Optional keys in order, starting with keys[0] (present); each later one optional."""
        first = kvs[keys[0]]
        out = f'{first} ( "," space {first} )*' if keys[0] == "*" else first
        if len(keys) > 1:
            rest = " ".join(f'( "," space {kvs[k]} ){"*" if k == "*" else "?"}' for k in keys[1:])
            out += " " + self.rules.add(f"{name}-{keys[0].strip('*') or 'additional'}-rest", rest)
        return out

    def _array(self, schema: dict[str, Any], name: str) -> str:
        items = schema.get("items", schema.get("prefixItems"))
        if isinstance(items, list):
            parts = [self._visit(item, f"{name}-tuple-{i}") for i, item in enumerate(items)]
            return '"[" space ' + ' "," space '.join(parts) + ' space "]"'
        lo = _count(schema, "minItems", 0) or 0
        hi = _count(schema, "maxItems", None)
        if items is None and lo == 0 and hi is None:
            return self.primitive("array")
        item = self._visit(True if items is None else items, f"{name}-item")
        items_expr = _repeat(item, lo, hi, sep='"," space')
        return f'"[" space {items_expr} space "]"'

    def _string(self, schema: dict[str, Any], name: str) -> str:
        if "pattern" in schema:
            if not isinstance(schema["pattern"], str):
                raise SchemaError(f"{name}: pattern must be a string")
            try:
                return f'"\\"" ({pattern_expr(schema["pattern"])}) "\\""'
            except ValueError as err:
                raise SchemaError(f"{name}: {err}") from err
        fmt = schema.get("format")
        if isinstance(fmt, str) and re.fullmatch("uuid[1-5]?", fmt):
            return self.primitive("uuid")
        if fmt in ("date", "time", "date-time"):
            return self.primitive(f"{fmt}-string")
        lo = _count(schema, "minLength", 0) or 0
        hi = _count(schema, "maxLength", None)
        if lo == 0 and hi is None:
            return self.primitive("string")
        return f'"\\"" {_repeat(self.primitive("char"), lo, hi)} "\\""'

    def _integer(self, schema: dict[str, Any], name: str) -> str:
        lo = _bound(schema, "minimum", "exclusiveMinimum", up=True)
        hi = _bound(schema, "maximum", "exclusiveMaximum", up=False)
        if lo is None and hi is None:
            return self.primitive("integer")
        try:
            return f"({int_range(lo, hi)})"
        except ValueError as err:
            raise SchemaError(f"{name}: {err}") from err

    def _number(self, schema: dict[str, Any], name: str) -> str:
        minimum = schema.get("minimum", schema.get("exclusiveMinimum"))
        if isinstance(minimum, int | float) and not isinstance(minimum, bool) and minimum >= 0:
            return self.primitive("unsigned-number")
        return self.primitive("number")

    def _boolean(self, schema: dict[str, Any], name: str) -> str:
        return self.primitive("boolean")

    def _null(self, schema: dict[str, Any], name: str) -> str:
        return self.primitive("null")


def _infer_type(schema: dict[str, Any]) -> str | None:
    """The type a schema without `type` describes, from its keywords (as llama-server)."""
    if "properties" in schema or schema.get("additionalProperties", True) is not True:
        return "object"
    if "items" in schema or "prefixItems" in schema:
        return "array"
    if any(k in schema for k in ("pattern", "minLength", "maxLength", "format")):
        return "string"
    return None


def _bound(schema: dict[str, Any], inclusive: str, exclusive: str, *, up: bool) -> int | None:
    value = schema.get(inclusive)
    offset = 0
    if value is None and not isinstance(schema.get(exclusive), bool):
        value = schema.get(exclusive)
        offset = 1 if up else -1
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise SchemaError(f"{inclusive} must be a number")
    if isinstance(value, float):
        # A fractional bound rounds inwards; an exclusive integral one moves by one.
        if not value.is_integer():
            return math.ceil(value) if up else math.floor(value)
        value = int(value)
    return value + offset


def _merge(a: dict[str, Any], b: object) -> dict[str, Any]:
    """`allOf` parts (and a schema's own keys around `anyOf`) merged into one schema."""
    if b is True:
        return dict(a)
    if not isinstance(b, dict):
        raise SchemaError("allOf/anyOf parts must be schemas")
    out = {**a, **b}
    if "properties" in a and "properties" in b:
        out["properties"] = {**a["properties"], **b["properties"]}
    if "required" in a and "required" in b:
        out["required"] = list(dict.fromkeys([*a["required"], *b["required"]]))
    return out


def _not_strings(keys: list[str], char: str) -> str:
    """A JSON string that is none of `keys` (for additional properties beside listed ones).

    A trie over the keys: at each node, either leave the trie with a character no key has
    next, or end the string where no key ends.
    """
    trie: dict[str, Any] = {}
    for key in keys:
        node = trie
        for ch in json.dumps(key, ensure_ascii=False)[1:-1]:
            node = node.setdefault(ch, {})
        node[""] = {}

    excluded = '"\\' + "".join(chr(i) for i in range(0x20)) + "\x7f"

    def visit(node: dict[str, Any]) -> str:
        nexts = [ch for ch in node if ch]
        alts = [f"{literal(ch)} ({visit(node[ch])})" for ch in nexts]
        # Leave the trie with a character no key continues with (escapes never diverge).
        leave = char_class("".join(nexts) + excluded, negate=True)
        alts.append(f"{leave} {char}*")
        if "" not in node:
            alts.append('""')  # the string may end here: no key ends at this node
        return " | ".join(alts)

    return f'"\\"" ({visit(trie)}) "\\""'


def json_schema_grammar(schema: object) -> str:
    """The GBNF grammar (root first) of the JSON texts `schema` admits."""
    conv = SchemaConverter()
    root = conv.add(schema, "root")
    if root != "root":
        conv.rules.set("root", root)
    return conv.rules.render()
