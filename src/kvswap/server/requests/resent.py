"""A mind's next chat turn when the client re-sends the whole conversation: the prompt
continues the mind's own tokens, so the turn prefills only its new input.

The client echoes the last answer back as an assistant message, and the chat template renders
it otherwise than the model wrote it (`minds.histories`). When the request's messages start
with those of the mind's last turn (`LastTurn`) followed by an assistant message, its prompt is
`minds.continuation.continue_chain` over the mind's tokens, as a stored response's next turn:
the mind's tokens, then the tokens of what the template renders after the answer. That holds
only while the conversation before the answer renders exactly as it did (the digest of the
prompt text) and the echoed answer is the one the model gave: where the template renders the
answer otherwise than generated (`KEPT`), the echoed message must say what the model's text
parses to (the same text and tool calls, the calls read with the body's tools whatever this
request's tool choice; reasoning aside, which clients drop or hide), so that an answer the
client edited is rendered as edited. A request that does not continue the answer
(the client changed it, or re-sent the same conversation) but whose conversation before it
renders as it did keeps the mind's prompt tokens (earlier answers as the model wrote them) and
tokenizes only the rest (`continue_prompt`). Otherwise the prompt is the whole render
tokenized, and the engine reuses the longest common prefix with the mind.

Pure CPU (rendering, tokenizing, parsing): called where a chat request is prepared, off the
event loop.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from kvswap.chat.message import ChatMsg
from kvswap.core.errors import KvswapError
from kvswap.core.types import TurnMark
from kvswap.minds.continuation import (
    ContinueMode,
    continue_chain,
    continue_prompt,
    text_digest,
)
from kvswap.minds.histories import LastTurn
from kvswap.server.requests.serving import Serving

RenderHistory = Callable[[Any], str]


def tokenizers(state: Serving) -> dict[str, Any]:
    """`continue_chain`'s tokenize and detokenize on the server's vocabulary."""
    vocab = state.vocab
    return {
        "tokenize": lambda text, add: state.tokenize(text, add, True),
        "detokenize": lambda tokens: vocab.detokenize(tokens, special=True),
    }


def ends_turn(state: Serving) -> Callable[[int], bool]:
    """A control token that ends a turn: end-of-generation, with no text of its own."""
    vocab = state.vocab
    return lambda token: vocab.is_eog(token) and not vocab.piece(token)


SIDE_SHARE = 0.5  # a session's side request: shorter and sharing less than this of the last


def side_request(prompt: list[int], opening: str, last: LastTurn | None) -> bool:
    """Whether a request named by a session key alone is another conversation on the same key
    (Claude Code's title generation, a subagent, a quota check): its system prompt differs from
    the mind's last turn's (`opening`: its `system_digest`), or, with the same one, it is
    shorter than `SIDE_SHARE` of the mind's last prompt and shares less than that with it. It
    then runs on a mind of its own, named by its opening (`side_digest`,
    `minds.names.side_mind`; `server.streaming.Turn.hold_side`), or without a mind in a
    cluster, and leaves the session's mind whole: run on it, it would drop the session's
    history past the little they share. A conversation under the same system prompt as long
    as the session's (an edited or re-sent history) is the session's own, and re-seats its
    mind at the common prefix."""
    if last is None or last.position.n_prompt == 0:
        return False
    if last.opening != opening:
        return True
    if len(prompt) >= SIDE_SHARE * last.position.n_prompt:
        return False
    n = min(len(prompt), last.position.n_prompt)
    head = np.asarray(prompt[:n], dtype=np.int32)
    diff = np.flatnonzero(head != last.tokens[:n])
    shared = int(diff[0]) if len(diff) else n
    return shared < SIDE_SHARE * last.position.n_prompt


def system_digest(messages: Sequence[Any]) -> str:
    """A digest of a conversation's system prompt: each message's role and text before its
    first user message (markup that moves from turn to turn, cache breakpoints, is not part of
    it)."""
    return _digest(messages, through_user=False)


def side_digest(messages: Sequence[Any]) -> str:
    """What names a side request's own mind: a digest of its conversation's opening, each
    message's role and text through its first user message (a subagent's instructions and
    task, a title request's text). Its later turns open the same way and come back to the
    same mind."""
    return _digest(messages, through_user=True)


def _digest(messages: Sequence[Any], *, through_user: bool) -> str:
    digest = hashlib.sha256()
    for message in messages:
        if message.role == "user" and not through_user:
            break
        digest.update(json.dumps([message.role, _text(message.content)]).encode())
        if message.role == "user":
            break
    return digest.hexdigest()


def turn_mark(body: Any, prompt: str, opening: str) -> TurnMark | None:
    """What a mind's chat turn records for the next one (`opening`: the body's `system_digest`);
    None for a request whose last message is the assistant's (a continued answer, no new
    turn)."""
    messages = body.messages
    if messages and messages[-1].role == "assistant":
        return None
    return TurnMark(len(messages), len(prompt), text_digest(prompt), opening)


def continued(
    state: Serving,
    body: Any,
    prompt: str,
    last: LastTurn | None,
    render_history: RenderHistory,
    answers_of: Callable[[str], Sequence[ChatMsg]],
) -> list[int] | None:
    """The turn's prompt tokens continuing mind's `last` turn, or None when the request does
    not continue it (see the module docstring). `prompt`: the request's rendered prompt;
    `render_history(body)`: a body's messages rendered as history; `answers_of(text)`: the
    model's text parsed as the answers of a request with this one's tools were (its tool choice
    may have been another: an answer that called a tool, echoed under `tool_choice: none`)."""
    if last is None:
        return None
    answered = _answer_continued(state, body, prompt, last, render_history, answers_of)
    if answered is not None:
        return answered
    kept = continue_prompt(last.tokens, last.position, full=prompt, **tokenizers(state))
    return [int(t) for t in kept] if kept is not None else None


def _answer_continued(
    state: Serving,
    body: Any,
    prompt: str,
    last: LastTurn,
    render_history: RenderHistory,
    answers_of: Callable[[str], Sequence[ChatMsg]],
) -> list[int] | None:
    """The mind's tokens with its answer, then the glue, when the body echoes that answer."""
    messages = body.messages
    n = last.n_messages
    if len(messages) <= n + 1 or messages[n].role != "assistant":
        return None  # not the last turn's answer and something new after it
    try:
        history = render_history(body.model_copy(update={"messages": messages[: n + 1]}))
    except KvswapError:
        return None
    cont = continue_chain(
        last.tokens,
        last.position,
        full=prompt,
        history=history,
        ends_turn=ends_turn(state),
        **tokenizers(state),
    )
    if cont.mode is ContinueMode.KEPT:
        if not any(_same_answer(a, messages[n]) for a in answers_of(last.content)):
            return None
    elif cont.mode is not ContinueMode.INCREMENTAL:
        return None
    return [int(t) for t in np.asarray(cont.tokens)]


def _same_answer(generated: ChatMsg, echoed: Any) -> bool:
    """The echoed assistant message says what the model's answer parsed to: its text and its
    tool calls (names and arguments as JSON values)."""
    return _text(echoed.content).strip() == generated.content.strip() and _calls(
        [(c.function.name, c.function.arguments) for c in echoed.tool_calls or []]
    ) == _calls([(c.name, c.arguments) for c in generated.tool_calls])


def _text(content: Any) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    return "".join(getattr(part, "text", None) or "" for part in content)


def _calls(calls: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    out = []
    for name, arguments in calls:
        try:
            value = json.loads(arguments) if isinstance(arguments, str) else arguments
        except ValueError:
            value = arguments
        out.append((name, value))
    return out
