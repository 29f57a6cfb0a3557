"""agentq.fencing with the SDK alone: the SQLite store (standard library) keeps the
fencing promise across connections, and a store whose driver is an extra that is not
installed says which extra to install. Every backend against a real server, with
property tests: tests/integration/test_fencing.py."""

from __future__ import annotations

import sqlite3
import sys
import threading
from pathlib import Path

import pytest

from agentq.fencing import SQLiteFencedStore, StaleTokenError, open_store


def test_a_lower_token_is_refused_and_an_equal_or_higher_one_applied(tmp_path: Path) -> None:
    with open_store(f"sqlite://{tmp_path / 'results.db'}") as store:
        assert isinstance(store, SQLiteFencedStore)
        assert store.fence("task-a", 3).revision == 1
        assert store.write("task-a", 3, {"answer": 42}).revision == 2  # the same attempt
        with pytest.raises(StaleTokenError) as refused:
            store.write("task-a", 2, {"answer": 0})  # an older attempt, late
        assert (refused.value.token, refused.value.highest) == (2, 3)
        assert store.write("task-a", 4, {"answer": 43}).revision == 3
        with pytest.raises(StaleTokenError):
            store.fence("task-a", 3)
        record = store.read("task-a")
        assert record is not None and (record.token, record.value) == (4, {"answer": 43})
        assert store.read("task-b") is None


def test_a_refused_write_rolls_back_the_agents_own_statements(tmp_path: Path) -> None:
    with SQLiteFencedStore(str(tmp_path / "results.db")) as store:
        with store.transaction("task-a", 5) as tx:
            tx.connection.execute("CREATE TABLE IF NOT EXISTS out (v TEXT)")
            tx.connection.execute("INSERT INTO out VALUES ('from 5')")
            tx.value = "done"
        with pytest.raises(StaleTokenError), store.transaction("task-a", 4) as tx:
            tx.connection.execute("INSERT INTO out VALUES ('from 4')")
    rows = sqlite3.connect(tmp_path / "results.db").execute("SELECT v FROM out").fetchall()
    assert rows == [("from 5",)]


def test_writers_on_separate_connections_never_let_a_lower_token_win(tmp_path: Path) -> None:
    """Two stores (two connections to one file, as two agent processes would hold),
    racing writes with interleaved tokens: the record ends with the highest token."""
    path = str(tmp_path / "results.db")
    stores = [SQLiteFencedStore(path), SQLiteFencedStore(path)]
    accepted: list[int] = []
    guard = threading.Lock()

    def writer(store: SQLiteFencedStore, tokens: range) -> None:
        for token in tokens:
            try:
                store.write("task-a", token, {"by": token})
            except StaleTokenError:
                continue
            with guard:
                accepted.append(token)

    threads = [
        threading.Thread(target=writer, args=(stores[0], range(1, 200, 2))),
        threading.Thread(target=writer, args=(stores[1], range(2, 200, 2))),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    record = stores[0].read("task-a")
    assert record is not None and record.token == 199 and record.value == {"by": 199}
    assert record.revision == len(accepted)  # every accepted write, and nothing else
    for store in stores:
        store.close()


def test_bad_urls_and_tokens_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no database path"):
        open_store("sqlite://")
    with pytest.raises(ValueError, match="unknown fenced store URL"):
        open_store("redis://localhost")
    with open_store(f"sqlite://{tmp_path / 'results.db'}") as store:
        with pytest.raises(TypeError):
            store.write("task-a", True, 1)  # type: ignore[arg-type]
        with pytest.raises(ValueError):
            store.write("task-a", 0, 1)


@pytest.mark.parametrize(
    ("url", "driver", "extra"),
    [
        ("postgresql://agent@127.0.0.1:1/results", "psycopg", "postgres"),
        ("configmap://default/results", "kubernetes", "configmap"),
    ],
)
def test_a_store_whose_driver_is_missing_names_the_extra_to_install(
    monkeypatch: pytest.MonkeyPatch, url: str, driver: str, extra: str
) -> None:
    """agentq-agent alone has no third-party dependency: a store's driver comes with an
    extra, and a missing one is named, with the extra that brings it."""
    monkeypatch.setitem(sys.modules, driver, None)  # as if not installed
    for name in ("agentq.fencing.postgres", "agentq.fencing.configmap"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    with pytest.raises(ModuleNotFoundError) as missing:
        open_store(url)
    assert f"pip install 'agentq-agent[{extra}]'" in str(missing.value)
    assert missing.value.name == driver


class AwayStore(SQLiteFencedStore):
    """A SQLite store whose database can be made unreachable (a PostgreSQL restart, say)."""

    away = False

    def transaction(self, key, token):  # type: ignore[no-untyped-def]
        if self.away:
            raise OSError("the store is away")
        return super().transaction(key, token)


def test_an_owed_fence_refuses_lower_tokens_while_away_and_lands_once_back(
    tmp_path: Path,
) -> None:
    with AwayStore(str(tmp_path / "sink.db")) as store:
        store.write("job", 7, {"part": 1})
        store.away = True
        store.owe_fence("job", 8)
        with pytest.raises(StaleTokenError):
            store.write("job", 7, {"late": True})  # refused here, the store unreachable
        store.away = False
        with pytest.raises(StaleTokenError):
            store.write("job", 7, {"late": True})  # the fence made first, then refused
        record = store.read("job")
        assert record is not None and record.token == 8 and record.value == {"part": 1}
        assert store.write("job", 9, {"next": True}).token == 9  # a newer attempt goes on
        assert store.write("other", 1, {}).token == 1  # other keys are not concerned
