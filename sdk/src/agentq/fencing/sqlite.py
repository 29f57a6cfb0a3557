"""The SQLite backend: the fence is a column of the row it guards.

Each check-and-write runs in one ``BEGIN IMMEDIATE`` transaction: SQLite takes
the database's write lock at BEGIN, so two writers (threads or processes) are
serialised and the second one reads the token the first committed. The
connection is shared by the threads of one process (guarded by a lock); other
processes open their own and wait for the lock up to ``timeout`` seconds.

``transaction(key, token)`` lets an agent write its own tables in the same
transaction as the fence check, so its data and the token commit or roll back
together.
"""

from __future__ import annotations

import datetime
import json
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from agentq.fencing.base import (
    UNSET,
    Record,
    StaleTokenError,
    Transaction,
    TransactionalStore,
    check_identifier,
    check_key,
    check_token,
)


class SQLiteFencedStore(TransactionalStore):
    def __init__(self, path: str, *, table: str = "agentq_fenced", timeout: float = 30.0) -> None:
        self.path = path
        self.table = check_identifier(table)
        self._lock = threading.RLock()
        self._conn = sqlite3.connect(
            path, timeout=timeout, isolation_level=None, check_same_thread=False
        )
        with self._lock:
            # WAL: readers do not block the writer; the write lock still serialises writers.
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute(
                f"CREATE TABLE IF NOT EXISTS {self.table} ("
                "key TEXT PRIMARY KEY, token INTEGER NOT NULL, value TEXT, "
                "revision INTEGER NOT NULL, updated_at TEXT NOT NULL)"
            )

    @contextmanager
    def transaction(self, key: str, token: int) -> Iterator[Transaction]:
        """Check ``token`` against ``key`` and raise it, in one transaction with whatever
        the block does on ``tx.connection``. StaleTokenError (and any exception in the
        block) rolls everything back."""
        check_key(key)
        check_token(token)
        self._refuse_owed(key, token)
        with self._lock:
            conn = self._conn
            conn.execute("BEGIN IMMEDIATE")
            try:
                row = conn.execute(
                    f"SELECT token, value, revision FROM {self.table} WHERE key = ?", (key,)
                ).fetchone()
                previous = (
                    Record(key, int(row[0]), _load(row[1]), int(row[2]))
                    if row is not None
                    else None
                )
                if previous is not None and token < previous.token:
                    raise StaleTokenError(key, token, previous.token)
                tx = Transaction(connection=conn, previous=previous)
                yield tx
                revision = (previous.revision if previous else 0) + 1
                stamp = datetime.datetime.now(datetime.UTC).isoformat()
                if tx.value is UNSET:
                    conn.execute(
                        f"INSERT INTO {self.table} (key, token, value, revision, updated_at) "
                        "VALUES (?, ?, NULL, ?, ?) ON CONFLICT(key) DO UPDATE SET "
                        "token = excluded.token, revision = excluded.revision, "
                        "updated_at = excluded.updated_at",
                        (key, token, revision, stamp),
                    )
                else:
                    conn.execute(
                        f"INSERT INTO {self.table} (key, token, value, revision, updated_at) "
                        "VALUES (?, ?, ?, ?, ?) ON CONFLICT(key) DO UPDATE SET "
                        "token = excluded.token, value = excluded.value, "
                        "revision = excluded.revision, updated_at = excluded.updated_at",
                        (key, token, json.dumps(tx.value), revision, stamp),
                    )
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise

    def write(self, key: str, token: int, value: Any) -> Record:
        json.dumps(value)  # refuse what cannot be stored before taking the lock
        return super().write(key, token, value)

    def read(self, key: str) -> Record | None:
        with self._lock:
            row = self._conn.execute(
                f"SELECT token, value, revision FROM {self.table} WHERE key = ?", (key,)
            ).fetchone()
        return Record(key, int(row[0]), _load(row[1]), int(row[2])) if row is not None else None

    def records(self) -> list[Record]:
        """Every record (for tests and inspection)."""
        with self._lock:
            rows = self._conn.execute(
                f"SELECT key, token, value, revision FROM {self.table} ORDER BY key"
            ).fetchall()
        return [Record(str(r[0]), int(r[1]), _load(r[2]), int(r[3])) for r in rows]

    def ref(self, key: str) -> str:
        return f"sqlite://{self.path}#{self.table}/{key}"

    def close(self) -> None:
        with self._lock:
            self._conn.close()


def _load(text: str | None) -> Any:
    return None if text is None else json.loads(text)
