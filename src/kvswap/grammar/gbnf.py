"""GBNF building blocks: quoted literals, character classes, and a set of named rules.

`RuleSet` hands out unique rule names (an existing rule with the same body is reused) and
renders the grammar with `root` first. `text_until` writes the rule for "any text that does not
contain a word, then the word" (a KMP automaton, one rule per matched prefix). Pure.
"""

from __future__ import annotations

import re

_INVALID_NAME = re.compile(r"[^a-zA-Z0-9-]+")


def _escape_char(ch: str, specials: str) -> str:
    # libllama's GBNF escapes: \x \u \U \t \r \n \\ \" \[ \]; anything else is written in hex.
    if ch == "\\" or ch in specials:
        return "\\" + ch if ch in '\\"[]' else f"\\x{ord(ch):02X}"
    if ch == "\n":
        return "\\n"
    if ch == "\r":
        return "\\r"
    if ch == "\t":
        return "\\t"
    code = ord(ch)
    if code < 0x20 or code == 0x7F:
        return f"\\x{code:02X}"
    return ch


def literal(text: str) -> str:
    """A GBNF string literal matching `text` exactly."""
    return '"' + "".join(_escape_char(ch, '"') for ch in text) + '"'


def char_class(chars: str, *, negate: bool = False) -> str:
    """A GBNF character class of the given characters (`[^...]` when `negate`)."""
    body = "".join(_escape_char(ch, '"]^-[') for ch in dict.fromkeys(chars))
    return f"[{'^' if negate else ''}{body}]"


class RuleSet:
    """Named GBNF rules; names are made unique, identical bodies share one name."""

    def __init__(self) -> None:
        self._rules: dict[str, str] = {}

    def add(self, name: str, body: str) -> str:
        """Add `name ::= body`; returns the name actually used."""
        base = _INVALID_NAME.sub("-", name).strip("-") or "rule"
        key = base
        i = 0
        while key in self._rules and self._rules[key] != body:
            i += 1
            key = f"{base}{i}"
        self._rules[key] = body
        return key

    def reserve(self, name: str) -> str:
        """A fresh name for a rule whose body is set later (`set`), e.g. a recursive `$ref`."""
        base = _INVALID_NAME.sub("-", name).strip("-") or "rule"
        key, i = base, 0
        while key in self._rules:
            i += 1
            key = f"{base}{i}"
        self._rules[key] = ""
        return key

    def has(self, name: str) -> bool:
        return name in self._rules

    def set(self, name: str, body: str) -> None:
        """Define (or redefine) a rule under exactly `name` (for fixed names such as `root`)."""
        self._rules[name] = body

    def render(self) -> str:
        rules = sorted(self._rules.items(), key=lambda kv: (kv[0] != "root", kv[0]))
        return "".join(f"{name} ::= {body}\n" for name, body in rules)


def text_until(rules: RuleSet, word: str, name: str) -> str:
    """A rule for any text that does not contain `word`, followed by `word`.

    The states of a KMP automaton over `word` become rules: `name-i` has matched the first `i`
    characters; a character either extends the match, falls back to a shorter prefix, or (if
    it is not in `word`) returns to state 0.
    """
    assert word, "text_until needs a non-empty word"
    n = len(word)
    fail = [0] * (n + 1)  # fail[i]: longest proper border of word[:i]
    k = 0
    for i in range(1, n):
        while k and word[i] != word[k]:
            k = fail[k]
        if word[i] == word[k]:
            k += 1
        fail[i + 1] = k

    def step(state: int, ch: str) -> int:
        while state and word[state] != ch:
            state = fail[state]
        return state + 1 if word[state] == ch else 0

    alphabet = "".join(dict.fromkeys(word))
    names = [f"{name}-{i}" for i in range(n)]
    for state in range(n):
        alts = []
        for ch in alphabet:
            nxt = step(state, ch)
            alts.append(literal(ch) if nxt == n else f"{literal(ch)} {names[nxt]}")
        alts.append(f"{char_class(alphabet, negate=True)} {names[0]}")
        rules.set(names[state], " | ".join(alts))
    return names[0]


_REGEX_SPECIAL = re.compile(r"[.^$|()*+?\[\]{}\\]")


def regex_escape(word: str) -> str:
    """A trigger word as a libllama (ECMAScript) regex, as llama-server's `regex_escape`."""
    return _REGEX_SPECIAL.sub(lambda m: "\\" + m.group(0), word)


_NAME = re.compile(r"[a-zA-Z0-9_-]+")


def undefined_rules(gbnf: str) -> list[str]:
    """Rule names a grammar uses but never defines, `root` first when it is missing.

    A light scan (comments, literals, classes and `<[token]>` skipped), so an HTTP error can
    name the rule; libllama stays the judge of the syntax.
    """
    defined: set[str] = set()
    used: list[str] = []
    i, n = 0, len(gbnf)
    closers = {'"': '"', "[": "]"}
    while i < n:
        ch = gbnf[i]
        if ch == "#":
            nl = gbnf.find("\n", i)
            i = n if nl < 0 else nl
        elif ch in closers or gbnf.startswith("<[", i):
            close = "]>" if ch == "<" else closers[ch]
            i += 2 if ch == "<" else 1
            while i < n and not gbnf.startswith(close, i):
                i += 2 if gbnf[i] == "\\" else 1
            i += len(close)
        elif ch == "{":
            i = gbnf.find("}", i) + 1 or n  # a repetition count, not a name
        elif m := _NAME.match(gbnf, i):
            name = m.group(0)
            i = m.end()
            j = i
            while j < n and gbnf[j] in " \t":
                j += 1
            if gbnf.startswith("::=", j):
                defined.add(name)
            else:
                used.append(name)
        else:
            i += 1
    missing = [] if "root" in defined else ["root"]
    missing += [u for u in dict.fromkeys(used) if u not in defined and u != "root"]
    return missing
