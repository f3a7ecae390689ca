"""Each mind's last turn as its client saw it: the tokens the mind held after it, where its
prompt ended, and the answer's text, so that a client re-sending the whole conversation
(Claude Code, Codex, any chat client under a session key or a named mind) continues the mind's
own tokens instead of re-prefilling its last answer (`server.requests.resent`).

A client echoes the model's answer back as a message, which the chat template renders
otherwise than the tokens the model produced (a tool call's syntax, spacing, the end-of-turn
marker): compared token by token, the history diverges where the answer starts, and every turn
would prefill its previous answer again. Stored responses keep their own positions
(`minds.stored`); this keeps the same `Position` for minds whose history the client holds.

Bounded: at most `budget_tokens` tokens in all (4 bytes each; 0: off), least recently used first out
(a mind whose entry went renders its next turn whole, and the engine still reuses the longest
common prefix). An entry outlives its mind's state harmlessly: a prompt continuing it is the
conversation the client sent, with the model's own tokens for the answer, whatever the mind
holds now. Thread-safe (one lock): read where a request is prepared (an I/O thread),
written on the event loop when a turn completes. No libllama.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from kvswap.core.keys import PageKey
from kvswap.core.types import Completion, TurnMark
from kvswap.minds.continuation import Position

DEFAULT_BUDGET_TOKENS = 16 << 20  # 64 MiB of token ids


@dataclass(frozen=True)
class LastTurn:
    """A mind's last turn (see the module docstring)."""

    tokens: npt.NDArray[np.int32]  # the mind's tokens after it: its prompt, then the answer's
    position: Position  # where the prompt ended, and the text its tokens stand for
    n_messages: int  # the chat messages of its request (the answer is the next one echoed)
    content: str  # the answer's text as generated (tool calls in the model's syntax)
    opening: str = ""  # its system prompt's digest: another one on the key is a side request

    def fields(self) -> dict[str, Any]:
        """What the turn is besides its tokens, as JSON takes it (`of_fields` reads it)."""
        pos = self.position
        return {
            "position": [pos.n_tokens, pos.n_prompt, pos.prompt_chars, pos.prompt_digest],
            "n_messages": self.n_messages,
            "content": self.content,
            "opening": self.opening,
        }

    @classmethod
    def of_fields(cls, tokens: npt.NDArray[np.int32], e: dict[str, Any]) -> LastTurn:
        """The turn `fields` wrote, over its `tokens`; ValueError, KeyError or TypeError for
        fields that do not read or do not fit the tokens."""
        n_tokens, n_prompt, prompt_chars, digest = e["position"]
        position = Position(int(n_tokens), int(n_prompt), int(prompt_chars), str(digest))
        if position.n_tokens != len(tokens) or not 0 <= position.n_prompt <= position.n_tokens:
            raise ValueError("a turn's position does not fit its tokens")
        return cls(tokens, position, int(e["n_messages"]), str(e["content"]), str(e["opening"]))


def last_turn(prompt: Sequence[int], done: Completion, mark: TurnMark) -> LastTurn:
    """The chat turn `mark` that ran `prompt` and answered `done`."""
    tokens = np.concatenate(
        [np.asarray(prompt, dtype=np.int32), np.asarray(done.tokens, dtype=np.int32)]
    )
    position = Position(len(tokens), len(prompt), mark.prompt_chars, mark.prompt_digest)
    return LastTurn(tokens, position, mark.n_messages, done.content, mark.opening)


class MindHistories:
    """See the module docstring."""

    def __init__(self, budget_tokens: int = DEFAULT_BUDGET_TOKENS) -> None:
        self.budget_tokens = budget_tokens
        self._lock = threading.Lock()
        self._turns: OrderedDict[PageKey, LastTurn] = OrderedDict()
        self._n_tokens = 0

    def get(self, key: PageKey) -> LastTurn | None:
        with self._lock:
            return self._turns.get(key)

    def record(self, key: PageKey, prompt: Sequence[int], done: Completion, mark: TurnMark) -> None:
        """Mind `key`'s chat turn (`mark`) ran `prompt` and answered `done`."""
        self.put(key, last_turn(prompt, done, mark))

    def items(self) -> list[tuple[PageKey, LastTurn]]:
        """Every mind's last turn, least recently recorded first."""
        with self._lock:
            return list(self._turns.items())

    def put(self, key: PageKey, turn: LastTurn) -> None:
        """Mind `key`'s last turn is `turn` (its earlier one replaced); the least recently
        used go while the entries hold more than the budget."""
        with self._lock:
            self._drop(key)
            if len(turn.tokens) > self.budget_tokens:
                return
            self._turns[key] = turn
            self._n_tokens += len(turn.tokens)
            while self._n_tokens > self.budget_tokens:
                self._drop(next(iter(self._turns)))

    def _drop(self, key: PageKey) -> None:
        old = self._turns.pop(key, None)
        if old is not None:
            self._n_tokens -= len(old.tokens)
