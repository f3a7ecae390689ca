"""The next turn of a stored conversation (`kvswap.minds.continuation`), on a toy tokenizer: one
token per character, `<E>` one special token. The template's own behaviour (SmolLM2's, the
tiny models') is proven on real vocabularies in tests/model/test_chain_templates.py."""

from __future__ import annotations

import numpy as np

from kvswap.minds.continuation import (
    Continuation,
    ContinueMode,
    Position,
    continue_chain,
    continue_prompt,
    text_digest,
)

END = 1000  # "<E>"
END_OF_TEXT = 1001  # "<T>", another end of generation


def tokenize(text: str, add_special: bool = False) -> np.ndarray:
    out, i = [], 0
    while i < len(text):
        if text.startswith("<E>", i):
            out.append(END)
            i += 3
        elif text.startswith("<T>", i):
            out.append(END_OF_TEXT)
            i += 3
        else:
            out.append(ord(text[i]))
            i += 1
    return np.asarray(([1] if add_special else []) + out, dtype=np.int32)


def detokenize(tokens: np.ndarray) -> str:
    names = {END: "<E>", END_OF_TEXT: "<T>"}
    return "".join(names.get(t, chr(t)) for t in tokens.tolist() if t != 1)


def render(turns: list[tuple[str, str]], gen: bool, closing: str = "<E>\n") -> str:
    text = "".join(f"[{role}]{content}{closing}" for role, content in turns)
    return text + ("[assistant]" if gen else "")


def _after_first_turn(answer: str) -> tuple[np.ndarray, Position]:
    prompt_text = render([("user", "hi")], True)
    prompt = tokenize(prompt_text, True)
    generated = tokenize(answer)
    tokens = np.concatenate([prompt, generated]).astype(np.int32)
    return tokens, Position(len(tokens), len(prompt), len(prompt_text), text_digest(prompt_text))


def test_incremental_prompt_is_the_minds_tokens_then_the_glue() -> None:
    """Decision: the generated tokens are kept as they are (never re-tokenized), and only the
    template's glue for the new item is tokenized; here that equals the full render's tokens."""
    tokens, pos = _after_first_turn("hello<E>")
    turns = [("user", "hi"), ("assistant", "hello"), ("user", "again")]
    full, history = render(turns, True), render(turns[:2], False)
    cont = continue_chain(
        tokens, pos, full=full, history=history, tokenize=tokenize, detokenize=detokenize
    )
    assert cont.mode is ContinueMode.INCREMENTAL and cont.reason == ""
    assert cont.tokens[: len(tokens)].tolist() == tokens.tolist()
    assert cont.tokens.tolist() == tokenize(full, True).tolist()
    assert cont.n_glue == len(cont.tokens) - len(tokens)


def test_the_models_own_tokens_win_over_a_canonical_tokenization() -> None:
    """Defect caught: re-tokenizing generated text. A model that generated "h"+"i" as tokens
    the tokenizer would merge keeps those very tokens in the next prompt."""
    tokens, pos = _after_first_turn("ok<E>")
    tokens = tokens.copy()
    tokens[pos.n_prompt] = ord("o")  # stands for a token split the tokenizer never makes
    turns = [("user", "hi"), ("assistant", "ok"), ("user", "x")]
    cont = continue_chain(
        tokens,
        pos,
        full=render(turns, True),
        history=render(turns[:2], False),
        tokenize=tokenize,
        detokenize=detokenize,
    )
    assert cont.mode is ContinueMode.INCREMENTAL
    assert cont.tokens[: len(tokens)].tolist() == tokens.tolist()


def test_changed_instructions_render_anew() -> None:
    """Decision (OpenAI: instructions are not carried over): a turn whose system text differs
    from the one the mind's tokens hold is rendered whole, never spliced onto stale tokens."""
    tokens, pos = _after_first_turn("hello<E>")
    turns = [("system", "be brief"), ("user", "hi"), ("assistant", "hello"), ("user", "x")]
    cont = continue_chain(
        tokens,
        pos,
        full=render(turns, True),
        history=render(turns[:3], False),
        tokenize=tokenize,
        detokenize=detokenize,
    )
    assert cont.mode is ContinueMode.RENDERED and "renders differently" in cont.reason
    assert cont.tokens.tolist() == tokenize(render(turns, True), True).tolist()


def test_an_answer_the_template_renders_otherwise_renders_anew() -> None:
    """A template that rewrites the answer (here it drops what the model generated after a
    stop) cannot continue on the mind's tokens: the full render is used and the reason said."""
    tokens, pos = _after_first_turn("hello STOP<E>")
    turns = [("user", "hi"), ("assistant", "hello"), ("user", "x")]
    cont = continue_chain(
        tokens,
        pos,
        full=render(turns, True),
        history=render(turns[:2], False),
        tokenize=tokenize,
        detokenize=detokenize,
    )
    assert cont.mode is ContinueMode.RENDERED and "last answer" in cont.reason


def test_a_template_that_rewrites_history_renders_anew() -> None:
    """A template rendering earlier turns differently once a new turn follows (as thinking
    templates drop old reasoning) is detected by the history check."""
    tokens, pos = _after_first_turn("hello<E>")
    turns = [("user", "hi"), ("assistant", "hello"), ("user", "x")]
    history = render(turns[:2], False, closing="<E>\n\n")
    cont = continue_chain(
        tokens,
        pos,
        full=render(turns, True),
        history=history,
        tokenize=tokenize,
        detokenize=detokenize,
    )
    assert cont.mode is ContinueMode.RENDERED and "history" in cont.reason


def _kept_answer(answer: str) -> tuple[np.ndarray, Continuation]:
    """The mind's tokens after `answer`, which the history renders as "hello", and the next
    turn's continuation (both end tokens end a turn)."""
    tokens, pos = _after_first_turn(answer)
    turns = [("user", "hi"), ("assistant", "hello"), ("user", "x")]
    cont = continue_chain(
        tokens,
        pos,
        full=render(turns, True),
        history=render(turns[:2], False),
        tokenize=tokenize,
        detokenize=detokenize,
        ends_turn=lambda t: t in (END, END_OF_TEXT),
    )
    return tokens, cont


def test_an_answer_rendered_otherwise_but_ended_by_its_turn_token_is_kept() -> None:
    """Decision: the mind's tokens are the truth. An answer the history renders otherwise than
    the model wrote it (kvswap's tool JSON and its spacing) but that ended with the turn's end
    token keeps the model's tokens, and the glue starts after that token's rendering."""
    tokens, cont = _kept_answer('{"response": "hello"}<E>')
    assert cont.mode is ContinueMode.KEPT and "kept" in cont.reason
    assert cont.tokens.tolist() == tokens.tolist() + tokenize("\n[user]x<E>\n[assistant]").tolist()


def test_an_answer_ended_by_another_end_token_is_kept_and_closed_as_the_template_does() -> None:
    """A model that ended its answer with an end of text where the template closes a turn
    with an end of turn: the answer's tokens are kept, its own end token (never in the KV) is
    replaced by the template's. Defect caught: such an answer (a tiny model's tool call, in
    its own spacing) was rendered anew and prefilled again every turn."""
    tokens, cont = _kept_answer('{"response": "hello"}<T>')
    assert cont.mode is ContinueMode.KEPT
    glue = tokenize("<E>\n[user]x<E>\n[assistant]").tolist()
    assert cont.tokens.tolist() == tokens[:-1].tolist() + glue


def test_an_answer_the_client_changed_keeps_the_prompts_own_tokens() -> None:
    """`continue_prompt` (a session's client edited the last answer): the mind's prompt tokens
    are kept as they are (an earlier answer the model wrote stays in its own tokens, here a
    pair the tokenizer would write otherwise), and only the rest of the render is tokenized;
    a conversation that renders otherwise before the answer gets None."""
    prompt_text = render([("user", "hi")], True)
    prompt = tokenize(prompt_text, True)
    prompt[3] = 7777  # a token of an earlier answer, as generated: never re-tokenized
    tokens = np.concatenate([prompt, tokenize("hello<E>")]).astype(np.int32)
    pos = Position(len(tokens), len(prompt), len(prompt_text), text_digest(prompt_text))
    edited = render([("user", "hi"), ("assistant", "bye"), ("user", "again")], True)
    kept = continue_prompt(tokens, pos, full=edited, tokenize=tokenize, detokenize=detokenize)
    assert kept is not None
    assert kept.tolist() == prompt.tolist() + tokenize(edited[len(prompt_text) :]).tolist()
    other = render([("user", "ho"), ("assistant", "bye"), ("user", "again")], True)
    assert (
        continue_prompt(tokens, pos, full=other, tokenize=tokenize, detokenize=detokenize) is None
    )
