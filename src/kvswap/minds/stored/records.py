"""The stored conversations' records as they cross the store's boundary, and their typed errors.

A stored response (`ResponseRecord`) is a position in a mind (`continuation.Position`) plus what the
API shows of it; a turn's write (`TurnWrite`) is everything one turn adds, written in one
transaction before its answer goes out; a conversation (`ConversationRecord`) is an item list
with a mind of its own. Items are the Responses API's items as JSON objects, each with its
`id`. Pure values; the errors carry OpenAI's wording, the HTTP status and the field at fault.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from kvswap.core.errors import CONTEXT_LENGTH_EXCEEDED, ErrorKind, KvswapError
from kvswap.minds.continuation import Position

Item = dict[str, Any]
Tokens = npt.NDArray[np.int32]

# OpenAI's named error codes an answer carries in `code` instead of the HTTP status (clients
# match on them: a Codex-style client retries a turn whole on `previous_response_not_found`),
# with the status each comes with.
OPENAI_CODES: dict[str, int] = {"previous_response_not_found": 400, CONTEXT_LENGTH_EXCEEDED: 400}


@dataclass(frozen=True)
class ResponseRecord:
    """A stored response: where it left its mind, its chain and what GET shows."""

    id: str
    namespace: str
    mind: str
    parent: str | None  # previous_response_id: that response's history comes first
    conversation: str | None  # the conversation it belongs to (its history is that list)
    conv_seq: int  # in a conversation: the items before its own input (their `seq` bound)
    segment: int  # the last segment of its tokens
    position: Position
    n_dropped: int  # items of its history left out of its prompt (`truncation: auto`)
    input: list[Item]  # this request's input items, with their ids
    output: list[Item]
    body: dict[str, Any]  # the response object
    created_at: float
    hidden: bool = False  # deleted or expired: kept only while a descendant's history needs it


@dataclass(frozen=True)
class Segment:
    """Where a turn's new tokens go: after `n_from` tokens of `parent`'s chain (None: none)."""

    parent: int | None
    n_from: int
    tokens: Tokens


@dataclass(frozen=True)
class TurnWrite:
    """What one stored turn writes, in one transaction."""

    namespace: str
    mind: str
    owned: bool  # the store made the mind (it drops the mind's state with its last reference)
    response: ResponseRecord  # its `segment` is filled in by the store
    segment: Segment
    events: list[dict[str, Any]] = field(default_factory=list)  # the stream, for replays


@dataclass(frozen=True)
class Chain:
    """A response's chain as the next turn needs it: the mind's tokens up to the response,
    and the items of its history (the window the prompt renders, after `n_dropped`)."""

    response: ResponseRecord
    tokens: Tokens
    items: list[Item]
    segments: list[tuple[int, int]]  # (segment id, n_from), root first
    is_head: bool  # the response is its mind's newest position


@dataclass(frozen=True)
class ConversationRecord:
    id: str
    namespace: str
    mind: str
    metadata: dict[str, str]
    created_at: float
    head: str | None  # its last stored turn (the position of its mind)
    covered_seq: int  # items with a smaller `seq` are in the head's tokens
    intact: bool  # no item the head's tokens cover was deleted since


@dataclass(frozen=True)
class ItemPage:
    """A cursor page of items (`input_items`, a conversation's items)."""

    data: list[Item]
    has_more: bool

    def json(self) -> dict[str, Any]:
        ids = [str(item.get("id", "")) for item in self.data]
        return {
            "object": "list",
            "data": self.data,
            "first_id": ids[0] if ids else None,
            "last_id": ids[-1] if ids else None,
            "has_more": self.has_more,
        }


def page_of(items: list[Item], *, after: str | None, limit: int, order: str) -> ItemPage:
    """OpenAI's cursor paging over `items` (oldest first): `order` "asc" or "desc", the items
    after the one with id `after` in that order, at most `limit`."""
    ordered = items if order == "asc" else items[::-1]
    if after is not None:
        ids = [item.get("id") for item in ordered]
        if after not in ids:
            raise KvswapError(
                ErrorKind.INVALID_REQUEST, f"No item with id '{after}' in this list.", param="after"
            )
        ordered = ordered[ids.index(after) + 1 :]
    return ItemPage(ordered[:limit], len(ordered) > limit)


class ResponseNotFound(KvswapError):
    """No stored response of the caller's has this id (another key's is not found either)."""

    def __init__(self, response_id: str) -> None:
        super().__init__(
            ErrorKind.NOT_FOUND, f"Response with id '{response_id}' not found.", param=None
        )


class PreviousResponseNotFound(KvswapError):
    """`previous_response_id` names no stored response of the caller's: OpenAI's 400 and code."""

    def __init__(self, response_id: str) -> None:
        super().__init__(
            ErrorKind.INVALID_REQUEST,
            f"Previous response with id '{response_id}' not found.",
            param="previous_response_id",
            code="previous_response_not_found",
        )


class ConversationNotFound(KvswapError):
    def __init__(self, conversation_id: str, param: str | None = None) -> None:
        super().__init__(
            ErrorKind.NOT_FOUND,
            f"Conversation with id '{conversation_id}' not found.",
            param=param,
        )


class ItemNotFound(KvswapError):
    def __init__(self, item_id: str) -> None:
        super().__init__(ErrorKind.NOT_FOUND, f"Item with id '{item_id}' not found.", param=None)
