"""The next turn of a stored conversation: which tokens its prompt is, without re-tokenizing
what the model generated.

A stored response is a position in its mind: the tokens the mind held after it (its prompt,
then every token it generated, the last end-of-generation token included) and the rendered
prompt text those tokens stand for (its length and digest). The next turn's prompt is, when the
chat template allows it, those very tokens followed by the tokens of the *glue*: whatever the
template renders after the answer (its closing markers) and for the new items (their turns,
the generation prompt). The glue is derived by rendering, never by tokenizing the history:

    full    = render(instructions, history + new items, generation prompt)
    history = render(instructions, history, no generation prompt)
    full  = prompt_before_answer + answer_text + tail + glue_for_new_items
            |---- len, digest ---|-- detokenized generated tokens --|
                                 |-------- history[len(prompt):] --------|

`continue_chain` checks, in order, that the full render still starts with the text the stored
tokens stand for (same instructions, tools and template settings), that the template renders
the history the same way once new items follow it, and that it renders the answer as the text
the model generated; then the prompt is the stored tokens plus the tokens of the rest. Where a
check fails the template (or the request) breaks incremental continuation, and the prompt is
the full render tokenized (`RENDERED`, with the reason): the engine still reuses the longest
common prefix with the mind's KV. One exception to the third check: an answer the history
renders otherwise than the model wrote it (kvswap's own tool-call JSON for a template with no
tool syntax, whose spacing the model chose under the grammar), but that ends with the turn's
end token the rendered answer also closes with, keeps the model's tokens (`KEPT`): the mind's
tokens are the truth, and the glue is whatever the template renders after that end token. An
answer ended by another end token (an end of text where the template closes the turn with an
end of turn) keeps its tokens but that last one, which the KV never held, and the glue starts
with the template's end token.
Pure: rendering and tokenizing are the caller's functions.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

import numpy as np
import numpy.typing as npt

Tokens = npt.NDArray[np.int32]
Tokenize = Callable[[str, bool], Tokens]  # text, whether BOS is added as the model asks -> tokens
Detokenize = Callable[[Tokens], str]  # tokens -> text, special tokens rendered


class ContinueMode(StrEnum):
    """How a turn's prompt was made."""

    NEW = "new"  # the first turn of a chain: its render, tokenized
    INCREMENTAL = "incremental"  # the mind's tokens, then the glue's tokens
    KEPT = "kept"  # the same, the last answer kept as generated where rendered otherwise
    RENDERED = "rendered"  # the whole render tokenized (the engine reuses the common prefix)
    TRUNCATED = "truncated"  # rendered after dropping the oldest items (`truncation: auto`)


def text_digest(text: str) -> str:
    """The digest a position keeps of the rendered prompt its tokens stand for."""
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


@dataclass(frozen=True)
class Position:
    """Where a stored response left its mind."""

    n_tokens: int  # the mind's tokens after the response (prompt + generated)
    n_prompt: int  # where its generated tokens begin
    prompt_chars: int  # the length of the rendered prompt text its prompt tokens stand for
    prompt_digest: str  # ... and that text's digest (`text_digest`)


@dataclass(frozen=True)
class Continuation:
    """The prompt of a turn, and how it was made."""

    tokens: Tokens
    mode: ContinueMode
    reason: str = ""  # why the render was tokenized whole ("" when incremental or new)
    n_glue: int = 0  # the tokens appended to the mind's own (incremental)


def continue_chain(
    tokens: Tokens,
    position: Position,
    *,
    full: str,
    history: str,
    tokenize: Tokenize,
    detokenize: Detokenize,
    ends_turn: Callable[[int], bool] | None = None,
) -> Continuation:
    """The next turn's prompt after `position`, whose tokens are `tokens` (see the module
    docstring): `full` renders the history and the new items with the generation prompt,
    `history` the history alone without it; `ends_turn(token)`: a control token that ends a
    turn (the answer may then be kept as generated, `KEPT`)."""
    assert len(tokens) == position.n_tokens, "the position's own tokens"
    n_chars = position.prompt_chars
    reason = ""
    if text_digest(full[:n_chars]) != position.prompt_digest:
        reason = "the conversation before the last answer renders differently now"
    elif not full.startswith(history):
        reason = "the template renders the history differently once new items follow it"
    if reason:
        return rendered(full, tokenize, ContinueMode.RENDERED, reason)
    answer = detokenize(tokens[position.n_prompt :])
    mode = ContinueMode.INCREMENTAL
    rest = full[n_chars + len(answer) :]
    if not history.startswith(answer, n_chars):
        mode = ContinueMode.KEPT
        kept = _after_kept_answer(tokens, position, history, full, tokenize, detokenize, ends_turn)
        if kept is None:
            return rendered(
                full,
                tokenize,
                ContinueMode.RENDERED,
                "the template renders the last answer differently from the generated tokens",
            )
        n_kept, rest = kept
        tokens = tokens[:n_kept]
    glue = tokenize(rest, False)
    if len(tokens) and not _joins_cleanly(tokens[-1], rest, glue, tokenize, detokenize):
        return rendered(
            full,
            tokenize,
            ContinueMode.RENDERED,
            "the answer's last token and the next text tokenize together",
        )
    reason = _KEPT_REASON if mode is ContinueMode.KEPT else ""
    return Continuation(np.concatenate([tokens, glue]).astype(np.int32), mode, reason, len(glue))


_KEPT_REASON = (
    "the template renders the last answer otherwise than the model wrote it (kvswap's tool "
    "JSON, its spacing): the model's own tokens are kept"
)


def _after_kept_answer(
    tokens: Tokens,
    position: Position,
    history: str,
    full: str,
    tokenize: Tokenize,
    detokenize: Detokenize,
    ends_turn: Callable[[int], bool] | None,
) -> tuple[int, str] | None:
    """How many of the mind's tokens the prompt keeps, and what follows them in `full`, when
    the answer, rendered otherwise than generated, ended with a turn's end token: the text
    after the last occurrence of that token in the rendered answer. A model that ended with
    another end token than the one the template closes the answer with (an end of text where
    the template writes an end of turn) keeps its answer without its own, which its KV never
    held (the last sampled token is not decoded), and the prompt closes the answer as the
    template does. None when no end can be found."""
    if ends_turn is None or position.n_prompt >= len(tokens) or not ends_turn(int(tokens[-1])):
        return None
    n_chars = position.prompt_chars
    end_text = detokenize(tokens[-1:])
    at = history.rfind(end_text, n_chars) if end_text else -1
    if at >= 0:
        return len(tokens), full[at + len(end_text) :]
    closing = [t for t in tokenize(history[n_chars:], False).tolist() if ends_turn(t)]
    close_text = detokenize(np.asarray(closing[-1:], dtype=np.int32)) if closing else ""
    at = history.rfind(close_text, n_chars) if close_text else -1
    if at < 0 or position.n_prompt >= len(tokens) - 1:
        return None
    return len(tokens) - 1, full[at:]


def _joins_cleanly(
    last: np.int32, rest: str, glue: Tokens, tokenize: Tokenize, detokenize: Detokenize
) -> bool:
    """Whether the text after the answer starts a token of its own: the answer's last token's
    text followed by it tokenizes into something that spells that text and ends exactly where
    the glue's own tokens begin (a token the model wrote that the tokenizer would cut
    otherwise is no merge across the boundary)."""
    if not rest:
        return True
    text = detokenize(np.asarray([last], dtype=np.int32))
    joined = tokenize(text + rest, False)
    n_head = len(joined) - len(glue)
    return (
        n_head >= 1
        and bool(np.array_equal(joined[n_head:], glue))
        and detokenize(joined[:n_head]) == text
    )


def continue_prompt(
    tokens: Tokens, position: Position, *, full: str, tokenize: Tokenize, detokenize: Detokenize
) -> Tokens | None:
    """The prompt tokens of `position` (without its answer) followed by the tokens of the rest
    of `full`, when `full` still starts with the text those tokens stand for; None otherwise.
    For a request that does not continue the answer (the client changed it, or sent the same
    conversation again): the prompt keeps the mind's tokens for everything before the answer
    (earlier answers kept as the model wrote them), and only the rest is tokenized."""
    n_chars = position.prompt_chars
    if position.n_prompt < 1 or text_digest(full[:n_chars]) != position.prompt_digest:
        return None
    head = tokens[: position.n_prompt]
    rest = full[n_chars:]
    glue = tokenize(rest, False)
    if not _joins_cleanly(head[-1], rest, glue, tokenize, detokenize):
        return None
    return np.concatenate([head, glue]).astype(np.int32)


def rendered(full: str, tokenize: Tokenize, mode: ContinueMode, reason: str = "") -> Continuation:
    """A prompt made by tokenizing the whole render."""
    return Continuation(tokenize(full, True).astype(np.int32), mode, reason)
