"""The gateway's SQLite store: one serialised connection, schema created on open."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

SCHEMA = """
CREATE TABLE IF NOT EXISTS accounts (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    created_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS tokens (
    id TEXT PRIMARY KEY,
    account_id TEXT NOT NULL REFERENCES accounts(id) ON DELETE CASCADE,
    name TEXT NOT NULL,
    token_hash TEXT NOT NULL UNIQUE,
    created_at REAL NOT NULL,
    revoked_at REAL
);
CREATE INDEX IF NOT EXISTS tokens_by_account ON tokens (account_id, created_at);
CREATE TABLE IF NOT EXISTS gateways (
    account_id TEXT NOT NULL REFERENCES accounts(id) ON DELETE CASCADE,
    id TEXT NOT NULL,
    cache_ttl INTEGER,
    cache_invalidate_on_update INTEGER NOT NULL,
    collect_logs INTEGER NOT NULL,
    rate_limiting_limit INTEGER,
    rate_limiting_interval INTEGER,
    rate_limiting_technique TEXT NOT NULL,
    authentication INTEGER NOT NULL,
    created_at REAL NOT NULL,
    modified_at REAL NOT NULL,
    PRIMARY KEY (account_id, id)
);
CREATE TABLE IF NOT EXISTS logs (
    id TEXT PRIMARY KEY,
    account_id TEXT NOT NULL,
    gateway_id TEXT NOT NULL,
    provider TEXT NOT NULL,
    model TEXT NOT NULL,
    path TEXT NOT NULL,
    request_type TEXT,
    status_code INTEGER NOT NULL,
    success INTEGER NOT NULL,
    cached INTEGER NOT NULL,
    tokens_in INTEGER,
    tokens_out INTEGER,
    cost REAL,
    duration_ms INTEGER NOT NULL,
    metadata TEXT NOT NULL,
    step INTEGER,
    node TEXT,
    stand_in TEXT,
    request_body TEXT,
    response_body TEXT,
    created_at REAL NOT NULL,
    FOREIGN KEY (account_id, gateway_id) REFERENCES gateways (account_id, id) ON DELETE CASCADE
);
-- Listing is always within one gateway, newest first; the filters narrow that same range.
CREATE INDEX IF NOT EXISTS logs_by_gateway ON logs (account_id, gateway_id, created_at, id);
CREATE INDEX IF NOT EXISTS logs_by_model ON logs (account_id, gateway_id, model, created_at);
-- Retention by age deletes the oldest logs of every gateway.
CREATE INDEX IF NOT EXISTS logs_by_time ON logs (created_at);
"""

# (table, column, type) added to an existing database on open; new databases have them.
_ADDED_COLUMNS = (("logs", "stand_in", "TEXT"), ("logs", "request_body", "TEXT"),
                  ("logs", "response_body", "TEXT"))

Params = Sequence[object]


class Database:
    """A SQLite database shared by the server's threads.

    One connection serialised by a lock is enough for an emulator's write rate and avoids
    per-thread connections whose uncommitted state the others cannot see.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        # isolation_level=None: statements autocommit unless inside transaction(), which issues
        # its own BEGIN, so a multi-statement change is never half-visible.
        self._conn = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None,
                                     timeout=10.0)
        self._conn.row_factory = sqlite3.Row
        # Re-entrant so that execute()/query() work inside a transaction() on the same thread.
        self._lock = threading.RLock()
        with self._lock:
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute("PRAGMA foreign_keys=ON")
            self._conn.executescript(SCHEMA)
            self._add_missing_columns()

    def _add_missing_columns(self) -> None:
        """Columns added since a database was created (CREATE IF NOT EXISTS keeps old tables)."""
        for table, column, kind in _ADDED_COLUMNS:
            have = {row["name"] for row in self._conn.execute(f"PRAGMA table_info({table})")}
            if column not in have:
                self._conn.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")

    def execute(self, sql: str, params: Params = ()) -> int:
        """Run one statement; the number of rows it changed."""
        with self._lock:
            return self._conn.execute(sql, params).rowcount

    def query(self, sql: str, params: Params = ()) -> list[sqlite3.Row]:
        with self._lock:
            return self._conn.execute(sql, params).fetchall()

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """Make the statements in the block atomic; nested blocks join the outer one."""
        with self._lock:
            if self._conn.in_transaction:
                yield
                return
            # IMMEDIATE takes the write lock up front, so a read-then-write check (such as the
            # per-account gateway limit) cannot race another process's writer.
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                yield
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            self._conn.execute("COMMIT")

    def close(self) -> None:
        with self._lock:
            self._conn.close()


def iso_time(ts: float) -> str:
    """A unix time as the ISO 8601 UTC string the Cloudflare API returns."""
    stamp = datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds")
    return stamp.replace("+00:00", "Z")
