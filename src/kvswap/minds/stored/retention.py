"""What the stored conversations keep, and what they let go: run inside a write transaction.

- `expire`: responses past their time to live (`--state-ttl-seconds`, default 30 days, as
  OpenAI) are hidden, as a DELETE hides one, and background responses that ended without one
  (cancelled, failed) are deleted as old; `interrupted` marks those a previous process left
  running failed ("interrupted by a server restart"), so they expire too;
- `collect`: a hidden response is kept only while a visible one's history runs through it (so
  deleting or expiring a response in the middle of a chain never breaks its descendants), a
  token segment only while a kept response's tokens run through it; a mind with no visible
  response left, and no conversation on it, is let go and returned (`Released`: the caller
  drops the state of those the store made, so the last reference to a mind frees it);
- `within_budget`: past `--state-bytes`, chains go whole (their responses hidden, a
  conversation deleted with its items) until the records fit. The budget is shared fairly
  between tenants (API keys): each tenant holding records has an equal share of it
  (`share_bytes`), and what goes is the tenant's furthest over its share: its oldest ended
  background response, else its least recently used chain, so one key's flood evicts its own records and leaves the records of a key
  within its share whole (a tenant may use more than its share while the budget has room);
- `check_fits`: a conversation's write (its creation, items added) that would make it alone
  larger than its tenant's share is refused before it is made (`RecordsTooLarge`, naming
  `--state-bytes`): it could never be kept but by evicting the rest.

The bytes counted are every record's: responses (bodies, items, events), token segments,
conversation items and background responses (`pending`); `/pages` shows a tenant its own
(`tenant_bytes`) and its share. Conversations have no time to live (as OpenAI's); the byte
budget covers them. Pure SQL over the connection it is given; the clock is the caller's.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass

from kvswap.core.errors import ErrorKind, KvswapError

_KEPT_RESPONSES = """
WITH RECURSIVE kept(id) AS (
    SELECT id FROM responses WHERE hidden = 0
    UNION SELECT head FROM conversations WHERE head IS NOT NULL
    UNION SELECT r.parent FROM responses r JOIN kept ON r.id = kept.id WHERE r.parent IS NOT NULL
)
DELETE FROM responses WHERE hidden = 1 AND id NOT IN (SELECT id FROM kept WHERE id IS NOT NULL)
"""

_KEPT_SEGMENTS = """
WITH RECURSIVE kept(id) AS (
    SELECT segment FROM responses
    UNION SELECT s.parent FROM segments s JOIN kept ON s.id = kept.id WHERE s.parent IS NOT NULL
)
DELETE FROM segments WHERE id NOT IN (SELECT id FROM kept WHERE id IS NOT NULL)
"""

_ORPHANS = """
SELECT m.ns, m.name, m.owned FROM minds m
WHERE NOT EXISTS (
    SELECT 1 FROM responses r WHERE r.ns = m.ns AND r.mind = m.name AND r.hidden = 0)
AND NOT EXISTS (SELECT 1 FROM conversations c WHERE c.ns = m.ns AND c.mind = m.name)
"""

_TOTAL_BYTES = """
SELECT (SELECT COALESCE(SUM(n_bytes), 0) FROM responses)
     + (SELECT COALESCE(SUM(length(tokens)), 0) FROM segments)
     + (SELECT COALESCE(SUM(length(body)), 0) FROM conv_items)
     + (SELECT COALESCE(SUM(length(body) + length(events)), 0) FROM pending)
"""

# Each tenant's bytes: its responses, the segments their chains run through (a chain never
# crosses tenants), its conversations' items and its background responses.
_TENANT_BYTES = """
WITH RECURSIVE held(ns, id) AS (
    SELECT ns, segment FROM responses
    UNION SELECT held.ns, s.parent FROM segments s JOIN held ON s.id = held.id
        WHERE s.parent IS NOT NULL
)
SELECT ns, SUM(n) FROM (
    SELECT ns, n_bytes AS n FROM responses
    UNION ALL SELECT held.ns, length(s.tokens) FROM held JOIN segments s ON s.id = held.id
    UNION ALL SELECT c.ns, length(i.body) FROM conv_items i
        JOIN conversations c ON c.id = i.conversation
    UNION ALL SELECT ns, length(body) + length(events) FROM pending
) GROUP BY ns
"""


_ENDED = "json_extract(body, '$.status') IN ('cancelled', 'failed', 'completed', 'incomplete')"


@dataclass(frozen=True)
class Released:
    """A mind no stored record references any more."""

    namespace: str
    name: str
    owned: bool  # the store made it: its state is dropped too


def expire(conn: sqlite3.Connection, now: float, ttl_s: float) -> None:
    """Hide the responses past their time to live; delete the background responses that ended
    without one (cancelled, failed) `ttl_s` after they were made."""
    conn.execute("UPDATE responses SET hidden = 1 WHERE hidden = 0 AND expires_at <= ?", (now,))
    conn.execute(f"DELETE FROM pending WHERE {_ENDED} AND created_at <= ?", (now - ttl_s,))


def interrupted(conn: sqlite3.Connection) -> int:
    """Background responses a previous process left running: failed, so they expire and the
    GET says why. How many."""
    error = json.dumps({"code": "server_error", "message": "interrupted by a server restart"})
    return conn.execute(
        f"UPDATE pending SET body = json_set(body, '$.status', 'failed', '$.error', json(?)) "
        f"WHERE NOT {_ENDED}",
        (error,),
    ).rowcount


def collect(conn: sqlite3.Connection) -> list[Released]:
    """Drop what nothing visible needs (see the module docstring); the minds let go."""
    conn.execute(_KEPT_RESPONSES)
    conn.execute(_KEPT_SEGMENTS)
    released = [Released(ns, name, bool(owned)) for ns, name, owned in conn.execute(_ORPHANS)]
    conn.executemany(
        "DELETE FROM minds WHERE ns = ? AND name = ?", [(r.namespace, r.name) for r in released]
    )
    return released


class RecordsTooLarge(KvswapError):
    """A conversation's write that would make it larger than its tenant's share."""

    def __init__(self, n_bytes: int, share_bytes: int, budget_bytes: int, param: str) -> None:
        super().__init__(
            ErrorKind.INVALID_REQUEST,
            f"the conversation would hold {n_bytes} bytes, more than this API key's share of "
            f"the stored records ({share_bytes} of --state-bytes {budget_bytes}, shared by the "
            "keys that store records); store less, or raise --state-bytes",
            param=param,
        )


def total_bytes(conn: sqlite3.Connection) -> int:
    return int(conn.execute(_TOTAL_BYTES).fetchone()[0])


def tenant_bytes(conn: sqlite3.Connection) -> dict[str, int]:
    """Every tenant's bytes of records (those holding none are absent)."""
    return {str(ns): int(n) for ns, n in conn.execute(_TENANT_BYTES) if n}


def share_bytes(conn: sqlite3.Connection, budget_bytes: int, ns: str) -> int:
    """Tenant `ns`'s share of the budget: an equal part among the tenants holding records,
    `ns` counted."""
    return budget_bytes // len(tenant_bytes(conn).keys() | {ns})


def check_fits(
    conn: sqlite3.Connection,
    budget_bytes: int | None,
    ns: str,
    conv_id: str | None,
    new: list[str],
    param: str,
) -> None:
    """Refuse (`RecordsTooLarge`) items `new` (their stored JSON) when they would make
    conversation `conv_id` (None: a new one) larger than its tenant's share."""
    if budget_bytes is None:
        return
    held = 0
    if conv_id is not None:
        row = conn.execute(
            "SELECT COALESCE(SUM(length(i.body)), 0) FROM conv_items i "
            "JOIN conversations c ON c.id = i.conversation WHERE c.id = ? AND c.ns = ?",
            (conv_id, ns),
        ).fetchone()
        held = int(row[0])
    n_bytes = held + sum(len(body) for body in new)
    share = share_bytes(conn, budget_bytes, ns)
    if n_bytes > share:
        raise RecordsTooLarge(n_bytes, share, budget_bytes, param)


def within_budget(
    conn: sqlite3.Connection, budget_bytes: int | None, keep: tuple[str, str] | None = None
) -> list[Released]:
    """Drop chains until the records fit `budget_bytes`, the least recently used of the tenant
    furthest over its share first (`keep`: the mind just written, never dropped for its own
    turn); the minds let go."""
    released: list[Released] = []
    if budget_bytes is None:
        return released
    while total_bytes(conn) > budget_bytes:
        victim = _victim(conn, budget_bytes, keep)
        if victim is None:
            break
        if victim is _NOTHING:  # an ended background response went
            continue
        ns, name = victim
        conn.execute("UPDATE responses SET hidden = 1 WHERE ns = ? AND mind = ?", (ns, name))
        for (conv,) in conn.execute(
            "SELECT id FROM conversations WHERE ns = ? AND mind = ?", (ns, name)
        ).fetchall():
            conn.execute("DELETE FROM conv_items WHERE conversation = ?", (conv,))
            conn.execute("DELETE FROM conversations WHERE id = ?", (conv,))
        released += collect(conn)
    return released


_NOTHING = ("", "")  # `_victim`: room was made without dropping a chain


def _victim(
    conn: sqlite3.Connection, budget_bytes: int, keep: tuple[str, str] | None
) -> tuple[str, str] | None:
    """The chain to drop next: the least recently used of the tenant furthest over its share."""
    held = tenant_bytes(conn)
    share = budget_bytes // max(1, len(held))
    over = sorted((ns for ns in held if held[ns] > share), key=lambda n: share - held[n])
    if not over:  # the shares' rounding: any chain
        return _least_recent(conn, keep, None)
    for ns in over:
        if _drop_oldest_ended(conn, ns):
            return _NOTHING
        found = _least_recent(conn, keep, ns)
        if found is not None:
            return found
    return None  # only `keep` is over: a tenant within its share never pays for it


def _drop_oldest_ended(conn: sqlite3.Connection, ns: str) -> bool:
    """Delete tenant `ns`'s oldest ended background response; False when it has none."""
    return (
        conn.execute(
            f"DELETE FROM pending WHERE id = (SELECT id FROM pending WHERE ns = ? AND {_ENDED} "
            "ORDER BY created_at LIMIT 1)",
            (ns,),
        ).rowcount
        > 0
    )


def _least_recent(
    conn: sqlite3.Connection, keep: tuple[str, str] | None, ns: str | None
) -> tuple[str, str] | None:
    """The least recently used chain (of tenant `ns`; None: of any) but `keep`."""
    rows = conn.execute(
        """
        SELECT ns, name FROM (
            SELECT ns, name, used_at FROM minds
            UNION ALL SELECT ns, mind, used_at FROM conversations
        ) WHERE ?1 IS NULL OR ns = ?1 ORDER BY used_at LIMIT 3
        """,
        (ns,),
    ).fetchall()
    for row_ns, name in rows:
        if (row_ns, name) != keep:
            return str(row_ns), str(name)
    return None
