"""What the stored conversations keep, and what they let go: run inside a write transaction.

- `expire`: responses past their time to live (`--state-ttl-seconds`, default 30 days, as
  OpenAI) are hidden, as a DELETE hides one;
- `collect`: a hidden response is kept only while a visible one's history runs through it (so
  deleting or expiring a response in the middle of a chain never breaks its descendants), a
  token segment only while a kept response's tokens run through it; a mind with no visible
  response left, and no conversation on it, is let go and returned (`Released`: the caller
  drops the state of those the store made, so the last reference to a mind frees it);
- `within_budget`: past `--state-bytes`, the least recently used chains go first, whole (their
  responses hidden, a conversation deleted with its items), until the records fit.

Conversations have no time to live (as OpenAI's); the byte budget covers them. Pure SQL over
the connection it is given; the clock is the caller's.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass

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
"""


@dataclass(frozen=True)
class Released:
    """A mind no stored record references any more."""

    namespace: str
    name: str
    owned: bool  # the store made it: its state is dropped too


def expire(conn: sqlite3.Connection, now: float) -> None:
    conn.execute("UPDATE responses SET hidden = 1 WHERE hidden = 0 AND expires_at <= ?", (now,))


def collect(conn: sqlite3.Connection) -> list[Released]:
    """Drop what nothing visible needs (see the module docstring); the minds let go."""
    conn.execute(_KEPT_RESPONSES)
    conn.execute(_KEPT_SEGMENTS)
    released = [Released(ns, name, bool(owned)) for ns, name, owned in conn.execute(_ORPHANS)]
    conn.executemany(
        "DELETE FROM minds WHERE ns = ? AND name = ?", [(r.namespace, r.name) for r in released]
    )
    return released


def total_bytes(conn: sqlite3.Connection) -> int:
    return int(conn.execute(_TOTAL_BYTES).fetchone()[0])


def within_budget(
    conn: sqlite3.Connection, budget_bytes: int | None, keep: tuple[str, str] | None = None
) -> list[Released]:
    """Drop the least recently used chains until the records fit `budget_bytes` (`keep`: the
    mind just written, never dropped for its own turn); the minds let go."""
    released: list[Released] = []
    if budget_bytes is None:
        return released
    while total_bytes(conn) > budget_bytes:
        victim = _least_recent(conn, keep)
        if victim is None:
            break
        ns, name = victim
        conn.execute("UPDATE responses SET hidden = 1 WHERE ns = ? AND mind = ?", (ns, name))
        for (conv,) in conn.execute(
            "SELECT id FROM conversations WHERE ns = ? AND mind = ?", (ns, name)
        ).fetchall():
            conn.execute("DELETE FROM conv_items WHERE conversation = ?", (conv,))
            conn.execute("DELETE FROM conversations WHERE id = ?", (conv,))
        released += collect(conn)
    return released


def _least_recent(conn: sqlite3.Connection, keep: tuple[str, str] | None) -> tuple[str, str] | None:
    rows = conn.execute(
        """
        SELECT ns, name FROM (
            SELECT ns, name, used_at FROM minds
            UNION ALL SELECT ns, mind, used_at FROM conversations
        ) ORDER BY used_at LIMIT 3
        """
    ).fetchall()
    for ns, name in rows:
        if (ns, name) != keep:
            return str(ns), str(name)
    return None
