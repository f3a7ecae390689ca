"""Conversations in the database: an item list of the caller's, with a mind of its own.

Created with up to 20 items and up to 16 metadata pairs (OpenAI's limits, checked by the
caller); items appended by the API or by each response made in it (its input, then its
output); an item retrieved or deleted by id. A conversation's mind holds the tokens of its
last stored turn (`head`), which cover the items before `covered_seq`: deleting one of those
marks the conversation not `intact`, and its next turn renders the list anew (the engine still
reuses the longest common prefix). Reads are of the caller's namespace only. Called on I/O
threads, inside the database's transactions.
"""

from __future__ import annotations

import json
import sqlite3
from typing import Any

from kvswap.minds.stored.records import ConversationRecord, Item

_COLUMNS = "id, ns, mind, metadata, created_at, head, covered_seq, intact"


def get(conn: sqlite3.Connection, ns: str, conv_id: str) -> ConversationRecord | None:
    row = conn.execute(
        f"SELECT {_COLUMNS} FROM conversations WHERE id = ? AND ns = ?", (conv_id, ns)
    ).fetchone()
    if row is None:
        return None
    cid, cns, mind, metadata, created_at, head, covered, intact = row
    return ConversationRecord(
        cid, cns, mind, json.loads(metadata), created_at, head, covered, bool(intact)
    )


def create(
    conn: sqlite3.Connection, ns: str, conv_id: str, metadata: dict[str, str], now: float
) -> None:
    conn.execute(
        "INSERT INTO conversations (id, ns, mind, metadata, created_at, used_at) "
        "VALUES (?, ?, ?, ?, ?, ?)",
        (conv_id, ns, conv_id, json.dumps(metadata), now, now),
    )


def set_metadata(conn: sqlite3.Connection, conv_id: str, metadata: dict[str, str]) -> None:
    conn.execute(
        "UPDATE conversations SET metadata = ? WHERE id = ?", (json.dumps(metadata), conv_id)
    )


def delete(conn: sqlite3.Connection, conv_id: str) -> None:
    conn.execute("DELETE FROM conv_items WHERE conversation = ?", (conv_id,))
    conn.execute("DELETE FROM conversations WHERE id = ?", (conv_id,))


def append(conn: sqlite3.Connection, conv_id: str, items: list[Item]) -> int:
    """Append items (each with its `id`); the `seq` the first one got."""
    (first,) = conn.execute(
        "SELECT next_seq FROM conversations WHERE id = ?", (conv_id,)
    ).fetchone()
    conn.executemany(
        "INSERT INTO conv_items (conversation, seq, id, body) VALUES (?, ?, ?, ?)",
        [(conv_id, first + i, item["id"], json.dumps(item)) for i, item in enumerate(items)],
    )
    conn.execute(
        "UPDATE conversations SET next_seq = ? WHERE id = ?", (first + len(items), conv_id)
    )
    return int(first)


def items(conn: sqlite3.Connection, conv_id: str) -> list[tuple[int, Item]]:
    """Every item with its `seq`, oldest first."""
    rows = conn.execute(
        "SELECT seq, body FROM conv_items WHERE conversation = ? ORDER BY seq", (conv_id,)
    )
    return [(int(seq), json.loads(body)) for seq, body in rows]


def item(conn: sqlite3.Connection, conv_id: str, item_id: str) -> Item | None:
    row = conn.execute(
        "SELECT body FROM conv_items WHERE conversation = ? AND id = ? ORDER BY seq DESC",
        (conv_id, item_id),
    ).fetchone()
    return json.loads(row[0]) if row is not None else None


def delete_item(conn: sqlite3.Connection, conv: ConversationRecord, item_id: str) -> bool:
    """Delete an item; one the head's tokens cover leaves the conversation not intact."""
    rows = conn.execute(
        "SELECT seq FROM conv_items WHERE conversation = ? AND id = ?", (conv.id, item_id)
    ).fetchall()
    if not rows:
        return False
    conn.execute("DELETE FROM conv_items WHERE conversation = ? AND id = ?", (conv.id, item_id))
    if min(int(seq) for (seq,) in rows) < conv.covered_seq:
        conn.execute("UPDATE conversations SET intact = 0 WHERE id = ?", (conv.id,))
    return True


def turn_done(conn: sqlite3.Connection, conv_id: str, head: str, now: float) -> None:
    """A stored turn made in the conversation (its items appended): its new position."""
    conn.execute(
        "UPDATE conversations SET head = ?, covered_seq = next_seq, intact = 1, used_at = ? "
        "WHERE id = ?",
        (head, now, conv_id),
    )


def listed(conn: sqlite3.Connection, ns: str) -> list[dict[str, Any]]:
    """The caller's conversations, most recently used first (the web page's list)."""
    rows = conn.execute(
        """
        SELECT c.id, c.mind, c.created_at, c.used_at, c.metadata,
               (SELECT COUNT(*) FROM conv_items i WHERE i.conversation = c.id)
        FROM conversations c WHERE c.ns = ? ORDER BY c.used_at DESC
        """,
        (ns,),
    )
    return [
        {"id": cid, "mind": mind, "created_at": int(created), "used_at": used,
         "metadata": json.loads(meta), "n_items": n}
        for cid, mind, created, used, meta, n in rows
    ]  # fmt: skip
