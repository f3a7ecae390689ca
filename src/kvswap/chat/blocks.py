"""A message's diffs as a sequence of blocks that open, grow and close, one at a time.

The Anthropic and Responses streams send an answer as ordered blocks (thinking, text, each
tool call), each opened, filled with deltas and closed before the next opens. `BlockStream`
turns the diffs of a `ChatParser` into those events. llama-server's own streams keep blocks
open side by side and number them from the final message; here a block's position is the
order it opened, so a client's running snapshot always matches. Pure.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from kvswap.chat.message import MsgDiff


class BlockKind(StrEnum):
    REASONING = "reasoning"
    TEXT = "text"
    TOOL = "tool"


@dataclass(frozen=True)
class Block:
    kind: BlockKind
    position: int  # 0, 1, ... in the order blocks opened
    tool_index: int = -1
    tool_id: str = ""
    tool_name: str = ""


@dataclass(frozen=True)
class BlockEvent:
    op: str  # "open", "delta" or "close"
    block: Block
    delta: str = ""  # for "delta"
    text: str = ""  # for "close": the block's whole text (arguments for a tool)


class BlockStream:
    """Open/delta/close events for one answer (see the module docstring)."""

    def __init__(self) -> None:
        self._open: Block | None = None
        self._text = ""
        self._n_opened = 0
        self.blocks: list[tuple[Block, str]] = []  # closed blocks and their text

    def feed(self, diffs: list[MsgDiff]) -> list[BlockEvent]:
        events: list[BlockEvent] = []
        for d in diffs:
            if d.reasoning_delta:
                events += self._grow(BlockKind.REASONING, d.reasoning_delta, d)
            if d.content_delta:
                events += self._grow(BlockKind.TEXT, d.content_delta, d)
            if d.tool_index >= 0:
                events += self._grow(BlockKind.TOOL, d.arguments_delta, d)
        return events

    def close(self) -> list[BlockEvent]:
        """Close the open block, if any (at the end of the answer)."""
        if self._open is None:
            return []
        block, text = self._open, self._text
        self.blocks.append((block, text))
        self._open, self._text = None, ""
        return [BlockEvent("close", block, text=text)]

    def _grow(self, kind: BlockKind, delta: str, d: MsgDiff) -> list[BlockEvent]:
        events: list[BlockEvent] = []
        cur = self._open
        same = cur is not None and cur.kind is kind
        if kind is BlockKind.TOOL:
            same = same and cur is not None and cur.tool_index == d.tool_index
        if not same:
            events += self.close()
            cur = Block(kind, self._n_opened, d.tool_index, d.tool_id, d.tool_name)
            self._n_opened += 1
            self._open = cur
            events.append(BlockEvent("open", cur))
        assert cur is not None
        if delta:
            self._text += delta
            events.append(BlockEvent("delta", cur, delta=delta))
        return events
