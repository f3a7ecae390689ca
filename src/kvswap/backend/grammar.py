"""libllama's grammar sampler: building one, and checking a grammar before a request runs.

`new_grammar_sampler` builds a `llama_sampler` for a GBNF grammar (lazy when trigger words are
given: free text until a word appears, constrained from that word on, as llama-server's
`grammar_lazy`). `check_grammar` builds and frees one so an invalid grammar is a typed 400 at
the HTTP layer instead of a failed request on the engine thread; it only reads the vocabulary,
so any thread may call it. libllama writes parse details to stderr; the reason it logs is
captured from the `kvswap.libllama` logger and put in the error.
"""

from __future__ import annotations

import ctypes
import logging
import threading
from collections.abc import Sequence
from typing import Any

from kvswap.backend.bindings import llama_cpp
from kvswap.backend.vocab import Vocab
from kvswap.grammar.gbnf import undefined_rules

_LOGGER = logging.getLogger("kvswap.libllama")


class GrammarError(ValueError):
    """libllama refused a grammar (syntax, an undefined rule, left recursion, no root)."""


def _build(
    vocab: Vocab, gbnf: str, trigger_patterns: Sequence[str], trigger_tokens: Sequence[int]
) -> Any:
    text = gbnf.encode("utf-8")
    if not trigger_patterns and not trigger_tokens:
        return llama_cpp.llama_sampler_init_grammar(vocab.ptr, text, b"root")
    patterns = [p.encode("utf-8") for p in trigger_patterns]
    c_patterns = (ctypes.c_char_p * max(1, len(patterns)))(*patterns)
    c_tokens = (llama_cpp.llama_token * max(1, len(trigger_tokens)))(*trigger_tokens)
    return llama_cpp.llama_sampler_init_grammar_lazy_patterns(
        vocab.ptr, text, b"root", c_patterns, len(patterns), c_tokens, len(trigger_tokens)
    )


def new_grammar_sampler(
    vocab: Vocab,
    gbnf: str,
    trigger_patterns: Sequence[str] = (),
    trigger_tokens: Sequence[int] = (),
) -> Any:
    """A grammar sampler the caller frees (`llama_sampler_free`); GrammarError if refused.

    Trigger patterns are libllama (ECMAScript) regexes; with any trigger the grammar is lazy.
    """
    ptr = _build(vocab, gbnf, trigger_patterns, trigger_tokens)
    if not ptr:
        raise GrammarError("invalid grammar")
    return ptr


class _Capture(logging.Filter):
    """Collects the libllama log lines emitted by one thread."""

    def __init__(self) -> None:
        super().__init__()
        self.thread = threading.get_ident()
        self.lines: list[str] = []

    def filter(self, record: logging.LogRecord) -> bool:
        if record.thread == self.thread and record.levelno >= logging.ERROR:
            self.lines.append(record.getMessage())
        return True


def check_grammar(
    vocab: Vocab,
    gbnf: str,
    trigger_patterns: Sequence[str] = (),
    trigger_tokens: Sequence[int] = (),
) -> None:
    """Raise GrammarError (with libllama's reason) unless libllama accepts `gbnf`."""
    if not gbnf.strip():
        raise GrammarError("the grammar is empty")
    # Grammar sampling keeps its text valid UTF-8 with this table: build it here, off the
    # engine thread, the first time a grammar comes.
    vocab.utf8_table()
    capture = _Capture()
    _LOGGER.addFilter(capture)
    try:
        ptr = _build(vocab, gbnf, trigger_patterns, trigger_tokens)
    finally:
        _LOGGER.removeFilter(capture)
    if not ptr:
        reason = "; ".join(line.strip() for line in capture.lines) or "failed to parse grammar"
        missing = undefined_rules(gbnf)
        if missing:
            reason += f" (undefined rule {missing[0]!r})"
        raise GrammarError(f"invalid grammar: {reason}")
    llama_cpp.llama_sampler_free(ptr)
