"""The query of OpenAI's list and retrieve routes: `after`, `limit` (1-100, default 20),
`order` ("asc" or "desc", default "desc"), `stream` and `starting_after`; `include[]` is read
and ignored (kvswap has no extra fields to add). Typed 400s name the parameter. Pure."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from kvswap.core.errors import ErrorKind, KvswapError

DEFAULT_LIMIT = 20
MAX_LIMIT = 100


def _invalid(message: str, param: str) -> KvswapError:
    return KvswapError(ErrorKind.INVALID_REQUEST, message, param=param)


@dataclass(frozen=True)
class ListQuery:
    after: str | None
    limit: int
    order: str


def list_query(query: Mapping[str, str]) -> ListQuery:
    order = query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise _invalid(
            f"Invalid value for 'order': expected 'asc' or 'desc', got {order!r}.", "order"
        )
    raw = query.get("limit", str(DEFAULT_LIMIT))
    try:
        limit = int(raw)
    except ValueError:
        limit = 0
    if not 1 <= limit <= MAX_LIMIT:
        raise _invalid(
            f"Invalid value for 'limit': expected an integer from 1 to {MAX_LIMIT}, got {raw!r}.",
            "limit",
        )
    return ListQuery(query.get("after") or None, limit, order)


def flag(query: Mapping[str, str], name: str) -> bool:
    raw = query.get(name, "false").lower()
    if raw not in ("true", "false", "1", "0"):
        raise _invalid(f"Invalid value for '{name}': expected a boolean, got {raw!r}.", name)
    return raw in ("true", "1")


def starting_after(query: Mapping[str, str]) -> int:
    """The sequence number a replayed stream starts after (-1: from the first event)."""
    raw = query.get("starting_after")
    if raw is None:
        return -1
    try:
        n = int(raw)
    except ValueError:
        n = -2
    if n < 0:
        raise _invalid(
            f"Invalid value for 'starting_after': expected a sequence number, got {raw!r}.",
            "starting_after",
        )
    return n
