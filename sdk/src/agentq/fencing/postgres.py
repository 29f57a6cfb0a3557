"""The PostgreSQL backend (psycopg 3): the fence is a column of the row it guards.

Each check-and-write is one transaction that first makes sure the key's row
exists (``INSERT ... ON CONFLICT DO NOTHING``) and then locks it
(``SELECT ... FOR UPDATE``): a concurrent writer of the same key waits for the
lock and then reads the token the first one committed (READ COMMITTED re-reads
a locked row's latest version), so the check and the raise are atomic across
any number of connections and processes.

``transaction(key, token)`` gives the agent the connection inside that same
transaction, so its own tables commit or roll back with the fence.
"""

from __future__ import annotations

import threading
import zlib
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
    needs_extra,
)

with needs_extra("postgres", "the PostgreSQL store"):
    import psycopg
    from psycopg import sql
    from psycopg.conninfo import conninfo_to_dict
    from psycopg.types.json import Jsonb


class PostgresFencedStore(TransactionalStore):
    def __init__(
        self, dsn: str, *, table: str = "agentq_fenced", connect_timeout: float = 10.0
    ) -> None:
        self.dsn = dsn
        self.table = check_identifier(table)
        self._lock = threading.RLock()
        self._connect_timeout = int(connect_timeout)
        self._conn = self._connect()
        self._t = sql.Identifier(self.table)
        with self._conn.transaction(), self._conn.cursor() as cur:
            # Concurrent first users of a new table would race on CREATE TABLE IF NOT EXISTS
            # (a unique violation in the catalogue); an advisory lock serialises them.
            cur.execute("SELECT pg_advisory_xact_lock(%s)", (zlib.crc32(self.table.encode()),))
            cur.execute(
                sql.SQL(
                    "CREATE TABLE IF NOT EXISTS {} (key text PRIMARY KEY, token bigint NOT NULL, "
                    "value jsonb, revision bigint NOT NULL, "
                    "updated_at timestamptz NOT NULL DEFAULT now())"
                ).format(self._t)
            )

    def _connect(self) -> psycopg.Connection[Any]:
        return psycopg.connect(self.dsn, autocommit=True, connect_timeout=self._connect_timeout)

    def _connection(self) -> psycopg.Connection[Any]:
        """The connection, made again if the server ended it (a restart, a failover, an
        idle connection dropped): the call that found out failed, the next one works."""
        if self._conn.closed:
            self._conn = self._connect()
        return self._conn

    @contextmanager
    def transaction(self, key: str, token: int) -> Iterator[Transaction]:
        """Check ``token`` against ``key`` and raise it, in one transaction with whatever
        the block does on ``tx.connection``; any exception rolls everything back."""
        check_key(key)
        check_token(token)
        self._refuse_owed(key, token)
        with self._lock, self._connection().transaction(), self._conn.cursor() as cur:
            cur.execute(
                sql.SQL(
                    "INSERT INTO {} (key, token, revision) VALUES (%s, 0, 0) "
                    "ON CONFLICT (key) DO NOTHING"
                ).format(self._t),
                (key,),
            )
            cur.execute(
                sql.SQL("SELECT token, value, revision FROM {} WHERE key = %s FOR UPDATE").format(
                    self._t
                ),
                (key,),
            )
            row = cur.fetchone()
            assert row is not None  # inserted or already there, and locked by us
            previous = Record(key, int(row[0]), row[1], int(row[2])) if int(row[2]) > 0 else None
            if previous is not None and token < previous.token:
                raise StaleTokenError(key, token, previous.token)
            tx = Transaction(connection=self._conn, previous=previous)
            yield tx
            if tx.value is UNSET:
                cur.execute(
                    sql.SQL(
                        "UPDATE {} SET token = %s, revision = revision + 1, updated_at = now() "
                        "WHERE key = %s"
                    ).format(self._t),
                    (token, key),
                )
            else:
                cur.execute(
                    sql.SQL(
                        "UPDATE {} SET token = %s, value = %s, revision = revision + 1, "
                        "updated_at = now() WHERE key = %s"
                    ).format(self._t),
                    (token, Jsonb(tx.value), key),
                )

    def read(self, key: str) -> Record | None:
        with self._lock, self._connection().cursor() as cur:
            cur.execute(
                sql.SQL("SELECT token, value, revision FROM {} WHERE key = %s").format(self._t),
                (key,),
            )
            row = cur.fetchone()
        if row is None or int(row[2]) == 0:
            return None
        return Record(key, int(row[0]), row[1], int(row[2]))

    def records(self) -> list[Record]:
        """Every record (for tests and inspection)."""
        with self._lock, self._connection().cursor() as cur:
            cur.execute(
                sql.SQL(
                    "SELECT key, token, value, revision FROM {} WHERE revision > 0 ORDER BY key"
                ).format(self._t)
            )
            rows = cur.fetchall()
        return [Record(str(r[0]), int(r[1]), r[2], int(r[3])) for r in rows]

    def ref(self, key: str) -> str:
        info = conninfo_to_dict(self.dsn)
        host = info.get("host") or "localhost"
        port = info.get("port") or 5432
        database = info.get("dbname") or ""
        return f"postgresql://{host}:{port}/{database}#{self.table}/{key}"  # never the password

    def close(self) -> None:
        with self._lock:
            self._conn.close()
