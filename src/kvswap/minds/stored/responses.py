"""Stored responses in the database: a turn's write, a chain read back for the next turn, a
response shown, hidden, and its input items listed; background responses while they run.

A response's tokens are a chain of immutable segments (`segment_after`: a turn adds one, after
the longest prefix it shares with the chain it continues), so a fork or a turn rendered anew
shares every token before its divergence with the chain it came from and copies none. A
response's history is its ancestors' input and output items, oldest first (a conversation's
response starts from that conversation's items). Every read is of the caller's namespace
(another key's id is not found) and of visible responses only. Called on I/O threads.
"""

from __future__ import annotations

import json
import sqlite3
from typing import Any

import numpy as np

from kvswap.minds.continuation import Position
from kvswap.minds.stored.records import Chain, Item, ResponseRecord, Segment, Tokens, TurnWrite

_COLUMNS = (
    "id, ns, mind, parent, conversation, conv_seq, segment, n_tokens, n_prompt, prompt_chars, "
    "prompt_digest, n_dropped, input, output, body, created_at, hidden"
)

_SEGMENTS_UP = """
WITH RECURSIVE up(id, parent, n_from, tokens, depth) AS (
    SELECT id, parent, n_from, tokens, 0 FROM segments WHERE id = ?
    UNION ALL SELECT s.id, s.parent, s.n_from, s.tokens, up.depth + 1
    FROM segments s JOIN up ON s.id = up.parent
)
SELECT id, n_from, tokens FROM up ORDER BY depth DESC
"""

_ANCESTORS = f"""
WITH RECURSIVE up(rid, depth) AS (
    SELECT ?, 0
    UNION ALL SELECT r.parent, up.depth + 1 FROM responses r JOIN up ON r.id = up.rid
    WHERE r.parent IS NOT NULL
)
SELECT {_COLUMNS} FROM responses JOIN up ON responses.id = up.rid ORDER BY up.depth DESC
"""


def _record(row: tuple[Any, ...]) -> ResponseRecord:
    (rid, ns, mind, parent, conv, conv_seq, segment, n_tokens, n_prompt, chars, digest,
     n_dropped, inp, out, body, created_at, hidden) = row  # fmt: skip
    return ResponseRecord(
        id=rid,
        namespace=ns,
        mind=mind,
        parent=parent,
        conversation=conv,
        conv_seq=conv_seq,
        segment=segment,
        position=Position(n_tokens, n_prompt, chars, digest),
        n_dropped=n_dropped,
        input=json.loads(inp),
        output=json.loads(out),
        body=json.loads(body),
        created_at=created_at,
        hidden=bool(hidden),
    )


def visible(conn: sqlite3.Connection, ns: str, rid: str, now: float) -> ResponseRecord | None:
    row = conn.execute(
        f"SELECT {_COLUMNS} FROM responses WHERE id = ? AND ns = ? AND hidden = 0 "
        "AND expires_at > ?",
        (rid, ns, now),
    ).fetchone()
    return _record(row) if row is not None else None


def kept(conn: sqlite3.Connection, rid: str) -> ResponseRecord | None:
    """A response kept for what references it, visible or not."""
    row = conn.execute(f"SELECT {_COLUMNS} FROM responses WHERE id = ?", (rid,)).fetchone()
    return _record(row) if row is not None else None


def tokens_of(conn: sqlite3.Connection, segment: int) -> tuple[Tokens, list[tuple[int, int]]]:
    """A segment's chain of tokens, and its segments (id, n_from) from the root."""
    tokens = np.zeros(0, dtype=np.int32)
    chain = []
    for seg_id, n_from, blob in conn.execute(_SEGMENTS_UP, (segment,)):
        tokens = np.concatenate([tokens[:n_from], np.frombuffer(blob, dtype=np.int32)])
        chain.append((int(seg_id), int(n_from)))
    return tokens, chain


def history(conn: sqlite3.Connection, record: ResponseRecord) -> list[Item]:
    """Every item of a response's history, its own input and output included, oldest first."""
    ancestors = [_record(row) for row in conn.execute(_ANCESTORS, (record.id,))]
    items: list[Item] = []
    root = ancestors[0] if ancestors else record
    if root.conversation is not None:
        rows = conn.execute(
            "SELECT body FROM conv_items WHERE conversation = ? AND seq < ? ORDER BY seq",
            (root.conversation, root.conv_seq),
        )
        items += [json.loads(body) for (body,) in rows]
    for rec in ancestors:
        items += rec.input + rec.output
    return items


def chain(conn: sqlite3.Connection, ns: str, rid: str, now: float) -> Chain | None:
    """The chain a turn continues after response `rid` (None: no such visible response)."""
    record = visible(conn, ns, rid, now)
    if record is None:
        return None
    return chain_of(conn, record)


def chain_of(conn: sqlite3.Connection, record: ResponseRecord) -> Chain:
    tokens, segments = tokens_of(conn, record.segment)
    head = conn.execute(
        "SELECT head FROM minds WHERE ns = ? AND name = ?", (record.namespace, record.mind)
    ).fetchone()
    return Chain(
        record,
        tokens[: record.position.n_tokens],
        history(conn, record),
        segments,
        head is not None and head[0] == record.id,
    )


def segment_after(base: Chain | None, tokens: Tokens) -> Segment:
    """Where a turn's tokens go: after the longest prefix they share with `base`'s chain, on
    the deepest segment that holds that prefix."""
    if base is None or not base.segments:
        return Segment(None, 0, tokens)
    n = min(len(base.tokens), len(tokens))
    differ = np.flatnonzero(base.tokens[:n] != tokens[:n])
    n_same = int(differ[0]) if len(differ) else n
    if n_same == 0:
        return Segment(None, 0, tokens)
    parent = [seg for seg, n_from in base.segments if n_from <= n_same][-1]
    return Segment(parent, n_same, tokens[n_same:])


def write_turn(conn: sqlite3.Connection, turn: TurnWrite, now: float, ttl_s: float) -> None:
    """Insert the turn's segment and response, and make it its mind's newest position."""
    seg = turn.segment
    cur = conn.execute(
        "INSERT INTO segments (parent, n_from, tokens) VALUES (?, ?, ?)",
        (seg.parent, seg.n_from, np.ascontiguousarray(seg.tokens, dtype=np.int32).tobytes()),
    )
    rec = turn.response
    texts = [json.dumps(x) for x in (rec.input, rec.output, rec.body)]
    events = json.dumps(turn.events) if turn.events else None
    n_bytes = sum(len(t) for t in texts) + len(events or "")
    pos = rec.position
    conn.execute(
        f"INSERT INTO responses ({_COLUMNS}, events, expires_at, n_bytes) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 0, ?, ?, ?)",
        (rec.id, turn.namespace, turn.mind, rec.parent, rec.conversation, rec.conv_seq,
         cur.lastrowid, pos.n_tokens, pos.n_prompt, pos.prompt_chars, pos.prompt_digest,
         rec.n_dropped, *texts, rec.created_at, events, now + ttl_s, n_bytes),
    )  # fmt: skip
    conn.execute(
        "INSERT INTO minds (ns, name, head, owned, used_at) VALUES (?, ?, ?, ?, ?) "
        "ON CONFLICT (ns, name) DO UPDATE SET head = excluded.head, used_at = excluded.used_at",
        (turn.namespace, turn.mind, rec.id, int(turn.owned), now),
    )
    conn.execute("DELETE FROM pending WHERE id = ?", (rec.id,))


def events_of(conn: sqlite3.Connection, ns: str, rid: str, now: float) -> list[dict[str, Any]]:
    """A response's recorded stream (a background response's events so far)."""
    row = conn.execute(
        "SELECT events FROM responses WHERE id = ? AND ns = ? AND hidden = 0 AND expires_at > ?",
        (rid, ns, now),
    ).fetchone()
    if row is None:
        row = conn.execute(
            "SELECT events FROM pending WHERE id = ? AND ns = ?", (rid, ns)
        ).fetchone()
    return json.loads(row[0]) if row is not None and row[0] else []


def hide(conn: sqlite3.Connection, ns: str, rid: str, now: float) -> bool:
    """Hide a visible response (DELETE); False when the caller has none with that id."""
    cur = conn.execute(
        "UPDATE responses SET hidden = 1 WHERE id = ? AND ns = ? AND hidden = 0 AND expires_at > ?",
        (rid, ns, now),
    )
    if cur.rowcount:
        return True
    return conn.execute("DELETE FROM pending WHERE id = ? AND ns = ?", (rid, ns)).rowcount > 0


def put_pending(
    conn: sqlite3.Connection, ns: str, rid: str, body: dict[str, Any], events: list[Any], now: float
) -> None:
    conn.execute(
        "INSERT INTO pending (id, ns, body, events, created_at) VALUES (?, ?, ?, ?, ?) "
        "ON CONFLICT (id) DO UPDATE SET body = excluded.body, events = excluded.events",
        (rid, ns, json.dumps(body), json.dumps(events), now),
    )


def pending_body(conn: sqlite3.Connection, ns: str, rid: str) -> dict[str, Any] | None:
    row = conn.execute("SELECT body FROM pending WHERE id = ? AND ns = ?", (rid, ns)).fetchone()
    return json.loads(row[0]) if row is not None else None


def chains_of(conn: sqlite3.Connection, ns: str) -> list[dict[str, Any]]:
    """The caller's stored chains: each mind with its newest response, its count of visible
    responses and its conversation, most recently used first (for /pages and the web page)."""
    rows = conn.execute(
        """
        SELECT m.name, m.head, m.used_at,
               (SELECT COUNT(*) FROM responses r WHERE r.ns = m.ns AND r.mind = m.name
                AND r.hidden = 0),
               (SELECT c.id FROM conversations c WHERE c.ns = m.ns AND c.mind = m.name)
        FROM minds m WHERE m.ns = ? ORDER BY m.used_at DESC
        """,
        (ns,),
    )
    return [
        {"mind": name, "head": head, "used_at": used, "n_responses": n, "conversation": conv}
        for name, head, used, n, conv in rows
    ]
