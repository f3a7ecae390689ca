"""The stored conversations' database: one SQLite connection (the standard library's
`sqlite3`), its schema, and the transactions every write runs in.

A file (`state.sqlite3` under `--state-dir`, else `<--slot-save-path>/.kvswap-state/`) in WAL
mode with `synchronous=FULL`: a committed turn is on disk (fsynced) before its answer goes
out, and a SIGKILL leaves either the turn or nothing. The file shrinks after deletes: it is in
incremental auto-vacuum, and `compact` (each sweep) returns its free pages and truncates the
write-ahead log (kept to `JOURNAL_LIMIT_BYTES` between). Without a path the database lives in
memory (the server says so in one line at start-up) and is lost at exit.

Tables: `segments` (a tree of immutable token runs: a response's tokens are its segment's chain
from the root), `responses`, `minds` (each mind's newest response and whether the store made
it), `conversations` and `conv_items`, `pending` (background responses still running). The
connection is shared by the I/O threads under one lock; callers never touch it outside
`read`/`write`.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Final

DB_NAME: Final = "state.sqlite3"
SCHEMA_VERSION: Final = 1
JOURNAL_LIMIT_BYTES: Final = 16 << 20  # the write-ahead log is cut back to this after a checkpoint
_INCREMENTAL: Final = 2  # PRAGMA auto_vacuum's value for INCREMENTAL

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS segments (
    id INTEGER PRIMARY KEY,
    parent INTEGER,
    n_from INTEGER NOT NULL,
    tokens BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS segments_parent ON segments(parent);
CREATE TABLE IF NOT EXISTS responses (
    id TEXT PRIMARY KEY,
    ns TEXT NOT NULL,
    mind TEXT NOT NULL,
    parent TEXT,
    conversation TEXT,
    conv_seq INTEGER NOT NULL,
    segment INTEGER NOT NULL,
    n_tokens INTEGER NOT NULL,
    n_prompt INTEGER NOT NULL,
    prompt_chars INTEGER NOT NULL,
    prompt_digest TEXT NOT NULL,
    n_dropped INTEGER NOT NULL,
    input TEXT NOT NULL,
    output TEXT NOT NULL,
    body TEXT NOT NULL,
    events TEXT,
    created_at REAL NOT NULL,
    expires_at REAL NOT NULL,
    hidden INTEGER NOT NULL DEFAULT 0,
    n_bytes INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS responses_mind ON responses(ns, mind);
CREATE INDEX IF NOT EXISTS responses_parent ON responses(parent);
CREATE INDEX IF NOT EXISTS responses_expiry ON responses(hidden, expires_at);
CREATE TABLE IF NOT EXISTS minds (
    ns TEXT NOT NULL,
    name TEXT NOT NULL,
    head TEXT,
    owned INTEGER NOT NULL,
    used_at REAL NOT NULL,
    PRIMARY KEY (ns, name)
);
CREATE TABLE IF NOT EXISTS conversations (
    id TEXT PRIMARY KEY,
    ns TEXT NOT NULL,
    mind TEXT NOT NULL,
    metadata TEXT NOT NULL,
    created_at REAL NOT NULL,
    used_at REAL NOT NULL,
    head TEXT,
    covered_seq INTEGER NOT NULL DEFAULT 0,
    intact INTEGER NOT NULL DEFAULT 1,
    next_seq INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS conv_items (
    conversation TEXT NOT NULL,
    seq INTEGER NOT NULL,
    id TEXT NOT NULL,
    body TEXT NOT NULL,
    PRIMARY KEY (conversation, seq)
);
CREATE INDEX IF NOT EXISTS conv_items_id ON conv_items(conversation, id);
CREATE TABLE IF NOT EXISTS pending (
    id TEXT PRIMARY KEY,
    ns TEXT NOT NULL,
    body TEXT NOT NULL,
    events TEXT NOT NULL,
    created_at REAL NOT NULL
);
"""


class RecordsDbError(RuntimeError):
    """The database cannot be opened (another schema, a damaged file)."""


class RecordsDb:
    """See the module docstring."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._conn = sqlite3.connect(
                str(path) if path is not None else ":memory:",
                check_same_thread=False,
                isolation_level=None,  # transactions are explicit (`write`)
            )
            if path is not None:
                self._vacuum_incrementally()
                self._conn.execute("PRAGMA journal_mode=WAL")
                self._conn.execute("PRAGMA synchronous=FULL")
                self._conn.execute(f"PRAGMA journal_size_limit={JOURNAL_LIMIT_BYTES}")
            self._conn.executescript(_SCHEMA)
            self._check_version()
        except sqlite3.DatabaseError as err:
            raise RecordsDbError(f"{path}: {err}") from err
        self._lock = threading.Lock()

    def _vacuum_incrementally(self) -> None:
        """Free pages go back to the file system on `compact` (a file made before this setting
        is rewritten once, here)."""
        if self._conn.execute("PRAGMA auto_vacuum").fetchone()[0] != _INCREMENTAL:
            self._conn.execute(f"PRAGMA auto_vacuum={_INCREMENTAL}")
            self._conn.execute("VACUUM")  # takes effect on a file with tables only so

    def compact(self) -> None:
        """Give the file's free pages back and truncate the write-ahead log (after deletes)."""
        if self.path is None:
            return
        with self._lock:
            self._conn.executescript("PRAGMA incremental_vacuum;")  # steps until all are freed
            self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    def _check_version(self) -> None:
        row = self._conn.execute("SELECT value FROM meta WHERE key = 'version'").fetchone()
        if row is None:
            self._conn.execute(
                "INSERT INTO meta (key, value) VALUES ('version', ?)", (str(SCHEMA_VERSION),)
            )
        elif int(row[0]) != SCHEMA_VERSION:
            raise RecordsDbError(f"schema version {row[0]}, this server reads {SCHEMA_VERSION}")

    @contextmanager
    def read(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            yield self._conn

    @contextmanager
    def write(self) -> Iterator[sqlite3.Connection]:
        """One transaction: committed (and, on a file, synced) when the block ends, rolled back
        when it raises."""
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                yield self._conn
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            self._conn.execute("COMMIT")

    def close(self) -> None:
        with self._lock:
            self._conn.close()
