"""One choice's chat output parser: generated text in, the assistant message and its deltas out.

As llama-server's `task_result_state::update_chat_msg`, the whole text so far is parsed again
at each step (answers are short; parsing is linear) and compared with the previous snapshot,
so a stream sends exactly the deltas that build the final message: a reasoning block
(`Reasoning`), then content and tool calls (a `ToolFormat`). Tool calls get their ids here,
once, so every snapshot and the final message agree. Pure.
"""

from __future__ import annotations

import logging
import secrets
import string
from collections.abc import Callable
from dataclasses import dataclass

from kvswap.chat.message import ChatMsg, DiffError, MsgDiff, ToolCall, compute_diffs
from kvswap.chat.reasoning import Reasoning
from kvswap.chat.toolformats import ToolFormat

log = logging.getLogger("kvswap.chat")

_ALNUM = string.ascii_letters + string.digits


def new_tool_call_id() -> str:
    """llama-server's `gen_tool_call_id`: 32 random letters and digits."""
    return "".join(secrets.choice(_ALNUM) for _ in range(32))


@dataclass(frozen=True)
class ParseSpec:
    """How to read one request's output."""

    tool_format: ToolFormat | None = None  # None: no tool calls are parsed
    reasoning: Reasoning | None = None  # None: no reasoning block is split off
    reasoning_in_content: bool = False  # deepseek-legacy: keep the block's text in content


class ChatParser:
    """Parses one choice's growing output (see the module docstring)."""

    def __init__(self, spec: ParseSpec, new_id: Callable[[], str] = new_tool_call_id) -> None:
        self.spec = spec
        self._new_id = new_id
        self._ids: list[str] = []
        self.text = ""
        self.msg = ChatMsg()
        self._stuck = False

    def feed(self, delta: str) -> list[MsgDiff]:
        """Add generated text; returns the deltas it releases."""
        self.text += delta
        return self._update(final=False)

    def finish(self) -> list[MsgDiff]:
        """The end of the output: the last deltas (the message is then final)."""
        return self._update(final=True)

    def parse_all(self, text: str) -> ChatMsg:
        """The final message of a whole, non-streamed output."""
        self.text = text
        self._update(final=True)
        return self.msg

    def _update(self, final: bool) -> list[MsgDiff]:
        if self._stuck:
            return []
        new = self._parse(self.text, final)
        try:
            diffs = compute_diffs(self.msg, new)
        except DiffError as err:
            # The output stopped parsing as it had so far (only possible without a grammar):
            # keep what was sent rather than contradict it.
            log.warning("chat output no longer parses consistently: %s", err)
            self._stuck = True
            return []
        self.msg = new
        return diffs

    def _parse(self, text: str, final: bool) -> ChatMsg:
        spec = self.spec
        reasoning = ""
        rest = text
        if spec.reasoning is not None:
            reasoning, offset = spec.reasoning.split(text, final)
            if offset > 0:
                rest = text[offset:].lstrip()
            if spec.reasoning_in_content:
                rest = text  # non-streamed deepseek-legacy (streamed, it parses no reasoning)
        if spec.tool_format is None:
            return ChatMsg(content=rest, reasoning_content=reasoning)
        content, calls = spec.tool_format.parse(rest, final)
        while len(self._ids) < len(calls):
            self._ids.append(self._new_id())
        return ChatMsg(
            content=content,
            reasoning_content=reasoning,
            tool_calls=tuple(
                ToolCall(c.name, c.arguments, self._ids[i]) for i, c in enumerate(calls)
            ),
        )
