"""PostgresFencedStore's one connection, over a fake psycopg connection: a connection
the server cut (a PostgreSQL restart, a failover, an idle connection dropped) is
replaced by the next call, instead of failing every call after it. The real
server's behaviour is checked in tests/integration/test_fencing.py."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

# The store's driver is the postgres extra: the SDK's tests also run without it.
psycopg = pytest.importorskip("psycopg", reason="needs the postgres extra (psycopg)")

from agentq.fencing import StaleTokenError, postgres  # noqa: E402


class FakeServer:
    def __init__(self) -> None:
        self.rows: dict[str, tuple[int, Any, int]] = {}  # key: token, value, revision


class FakeConnection:
    """What the store uses of a psycopg connection; ``cut()`` makes the next statement
    fail and close it, as psycopg does when the server ends the session."""

    def __init__(self, server: FakeServer) -> None:
        self.server = server
        self.closed = False
        self._cut = False

    def cut(self) -> None:
        self._cut = True

    def _check(self) -> None:
        if self.closed:
            raise psycopg.OperationalError("the connection is closed")

    @contextmanager
    def transaction(self) -> Iterator[None]:
        self._check()
        yield

    def cursor(self) -> FakeCursor:
        self._check()
        return FakeCursor(self)

    def close(self) -> None:
        self.closed = True


class FakeCursor:
    def __init__(self, connection: FakeConnection) -> None:
        self.connection = connection
        self.row: tuple[int, Any, int] | None = None

    def __enter__(self) -> FakeCursor:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def execute(self, query: Any, params: tuple[Any, ...] = ()) -> None:
        self.connection._check()
        if self.connection._cut:
            self.connection.closed = True
            raise psycopg.OperationalError("terminating connection due to administrator command")
        text = query if isinstance(query, str) else query.as_string(None)
        rows = self.connection.server.rows
        key = params[-1] if params else None
        if text.startswith("INSERT"):
            rows.setdefault(key, (0, None, 0))
        elif text.startswith("SELECT token"):
            self.row = rows.get(key)
        elif text.startswith("UPDATE"):
            _, value, revision = rows[key]
            if len(params) == 3:  # token, value, key (a write; a fence keeps the value)
                value = params[1].obj
            rows[key] = (params[0], value, revision + 1)

    def fetchone(self) -> tuple[int, Any, int] | None:
        return self.row


def test_a_connection_the_server_cut_is_replaced_by_the_next_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The store connected once, when it was made: after the server cut that connection
    every call failed with "the connection is closed" until the agent process was
    restarted, so an agent's fenced sink stayed down after a PostgreSQL restart."""
    server = FakeServer()
    connections: list[FakeConnection] = []

    def connect(dsn: str, **options: Any) -> FakeConnection:
        connections.append(FakeConnection(server))
        return connections[-1]

    monkeypatch.setattr(postgres.psycopg, "connect", connect)
    store = postgres.PostgresFencedStore("postgresql://agent@127.0.0.1:5432/results")
    assert store.write("job", 5, {"n": 1}).revision == 1
    connections[-1].cut()  # PostgreSQL restarted
    with pytest.raises(psycopg.OperationalError):
        store.write("job", 5, {"n": 2})  # the call that finds out fails (its outcome unknown)
    assert store.write("job", 5, {"n": 2}).value == {"n": 2}  # retried: a new connection
    assert len(connections) == 2
    assert store.read("job") is not None
    with pytest.raises(StaleTokenError):
        store.write("job", 4, {"n": 3})
