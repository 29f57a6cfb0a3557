"""FencedStore on its three backends, against real stores: an SQLite file, a real
PostgreSQL server (its own process, from Debian's packages), and a ConfigMap on
the real API server.

Properties (hypothesis):
- sequentially, every backend behaves like the model: a write or fence with a
  token lower than the key's highest is refused with StaleTokenError naming both
  tokens, anything else is applied and bumps the revision;
- concurrently, writers in separate processes with random tokens never let a
  lower token overwrite a higher one: ordered by revision, each key's accepted
  changes have non-decreasing tokens, no accepted change is lost, every refusal
  names a token that was really accepted, and the final record holds the highest
  token and the last accepted write's value.
"""

from __future__ import annotations

import multiprocessing
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentq.fencing import FencedStore, StaleTokenError, open_store
from agentq.fencing.configmap import ConfigMapFencedStore
from fencing_writers import Outcome, run_writer
from fleet import ControlPlane

BACKENDS = ["sqlite", "postgresql", "configmap"]
# The store factory fixture is shared by the examples; each example makes a fresh store.
FIXTURE_OK = [HealthCheck.function_scoped_fixture]


@pytest.fixture(scope="module")
def fencing_namespace(control_plane: ControlPlane) -> Iterator[str]:
    name = f"fence-{uuid.uuid4().hex[:8]}"
    control_plane.kubectl("create", "namespace", name)
    yield name
    control_plane.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture
def store_url(
    request: pytest.FixtureRequest, tmp_path: Path, control_plane: ControlPlane
) -> Callable[[], tuple[str, dict[str, Any]]]:
    """A factory of fresh, empty stores of the backend under test: (url, open options)."""
    backend = request.param

    def make() -> tuple[str, dict[str, Any]]:
        unique = uuid.uuid4().hex[:12]
        if backend == "sqlite":
            return f"sqlite://{tmp_path / f'{unique}.db'}", {}
        if backend == "postgresql":
            dsn = request.getfixturevalue("postgres")
            return dsn, {"table": f"fenced_{unique}"}
        namespace = request.getfixturevalue("fencing_namespace")
        return f"configmap://{namespace}/fenced-{unique}", {"kubeconfig": control_plane.kubeconfig}

    return make


# -- behaviour, one by one ----------------------------------------------------------------


@pytest.mark.parametrize("store_url", BACKENDS, indirect=True)
def test_a_lower_token_is_refused_naming_both_tokens(
    store_url: Callable[[], tuple[str, dict[str, Any]]],
) -> None:
    url, options = store_url()
    with open_store(url, **options) as store:
        assert store.read("job") is None
        first = store.write("job", 7, {"by": "a"})
        assert (first.token, first.revision) == (7, 1)
        again = store.write("job", 7, {"by": "a", "retry": True})  # equal token: same attempt
        assert again.revision == 2
        assert store.fence("job", 12).token == 12  # a newer attempt claims the key
        with pytest.raises(StaleTokenError) as refused:
            store.write("job", 7, {"by": "zombie"})
        assert refused.value.token == 7 and refused.value.highest == 12
        assert "7" in str(refused.value) and "12" in str(refused.value)
        kept = store.read("job")
        assert kept is not None
        assert (kept.token, kept.value, kept.revision) == (12, {"by": "a", "retry": True}, 3)
        store.write("job", 12, {"by": "b"})
        assert store.read("job").value == {"by": "b"}  # type: ignore[union-attr]
        # Keys are fenced independently: a low token is fine on another key.
        assert store.write("other", 1, "x").token == 1
        for bad in (0, -1, True, "3", 2.0):
            with pytest.raises((TypeError, ValueError)):
                store.write("job", bad, None)  # type: ignore[arg-type]


def test_sqlite_transaction_commits_the_agents_rows_with_the_fence(tmp_path: Path) -> None:
    from agentq.fencing import SQLiteFencedStore

    store = SQLiteFencedStore(str(tmp_path / "sink.db"))
    store._conn.execute("CREATE TABLE outputs (task TEXT, line TEXT)")
    with store.transaction("job", 5) as tx:
        tx.connection.execute("INSERT INTO outputs VALUES ('job', 'from token 5')")
    with pytest.raises(StaleTokenError), store.transaction("job", 4) as tx:
        tx.connection.execute("INSERT INTO outputs VALUES ('job', 'from token 4')")
    rows = store._conn.execute("SELECT line FROM outputs").fetchall()
    assert rows == [("from token 5",)]  # the zombie's row was never written
    store.close()


def test_postgres_transaction_rolls_back_the_agents_rows_with_a_stale_token(postgres: str) -> None:
    from agentq.fencing.postgres import PostgresFencedStore

    table = f"outputs_{uuid.uuid4().hex[:8]}"
    with PostgresFencedStore(postgres, table=f"fenced_{uuid.uuid4().hex[:8]}") as store:
        store._conn.execute(f"CREATE TABLE {table} (task text, line text)")
        with store.transaction("job", 9) as tx:
            tx.connection.execute(f"INSERT INTO {table} VALUES ('job', 'token 9')")
        with pytest.raises(StaleTokenError), store.transaction("job", 8) as tx:
            tx.connection.execute(f"INSERT INTO {table} VALUES ('job', 'token 8')")
        rows = store._conn.execute(f"SELECT line FROM {table}").fetchall()
        assert rows == [("token 9",)]
        assert store.ref("job").startswith("postgresql://127.0.0.1:")
        assert "password" not in store.ref("job")


def test_a_postgres_store_connects_again_after_the_server_ended_its_session(
    postgres: str,
) -> None:
    """The server ends the store's session (as a restart or a failover does): the call
    that finds out fails, the next one works on a new connection."""
    import psycopg

    from agentq.fencing.postgres import PostgresFencedStore

    with PostgresFencedStore(postgres, table=f"fenced_{uuid.uuid4().hex[:8]}") as store:
        store.write("job", 5, "one")
        with psycopg.connect(postgres, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (store._conn.info.backend_pid,))
        with pytest.raises(psycopg.OperationalError):
            store.write("job", 5, "two")
        assert store.write("job", 5, "two").revision == 2
        record = store.read("job")
        assert record is not None and record.value == "two"


def test_configmap_keys_that_are_not_configmap_keys_are_hashed(
    control_plane: ControlPlane, fencing_namespace: str
) -> None:
    store = ConfigMapFencedStore(
        name=f"keys-{uuid.uuid4().hex[:8]}",
        namespace=fencing_namespace,
        kubeconfig=control_plane.kubeconfig,
    )
    store.write("ns/task with spaces", 3, [1, 2])
    store.write("plain-key", 3, "v")
    assert store.read("ns/task with spaces").value == [1, 2]  # type: ignore[union-attr]
    assert [r.key for r in store.records()] == ["ns/task with spaces", "plain-key"]
    store.close()


# -- the model, sequentially -----------------------------------------------------------------

KEYS = st.sampled_from(["a", "b", "c"])
OPS = st.lists(
    st.tuples(
        st.sampled_from(["write", "fence"]),
        KEYS,
        st.integers(min_value=1, max_value=30),
        st.integers(min_value=0, max_value=1000),
    ),
    min_size=1,
    max_size=25,
)


@pytest.mark.parametrize("store_url", BACKENDS, indirect=True)
@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(ops=OPS)
def test_every_backend_behaves_like_the_model(
    store_url: Callable[[], tuple[str, dict[str, Any]]], ops: list[tuple[str, str, int, int]]
) -> None:
    url, options = store_url()
    model: dict[str, tuple[int, Any, int]] = {}  # key -> (token, value, revision)
    with open_store(url, **options) as store:
        for kind, key, token, value in ops:
            token_now, value_now, revision = model.get(key, (0, None, 0))
            if token < token_now:
                with pytest.raises(StaleTokenError) as refused:
                    _apply(store, kind, key, token, value)
                assert refused.value.highest == token_now
                continue
            record = _apply(store, kind, key, token, value)
            stored = value if kind == "write" else value_now
            model[key] = (token, stored, revision + 1)
            assert (record.token, record.value, record.revision) == model[key]
        for key, (token, value, revision) in model.items():
            got = store.read(key)
            assert got is not None and (got.token, got.value, got.revision) == (
                token,
                value,
                revision,
            )


def _apply(store: FencedStore, kind: str, key: str, token: int, value: Any) -> Any:
    return store.write(key, token, value) if kind == "write" else store.fence(key, token)


# -- concurrent writers in separate processes --------------------------------------------------


@pytest.fixture(scope="module")
def writers() -> Iterator[ProcessPoolExecutor]:
    """Four writer processes (spawned: nothing shared with this one), reused across examples."""
    with ProcessPoolExecutor(4, mp_context=multiprocessing.get_context("spawn")) as pool:
        yield pool


WRITER_OPS = st.lists(
    st.tuples(
        st.sampled_from(["write", "write", "fence"]),
        st.sampled_from(["x", "y"]),
        st.integers(min_value=1, max_value=12),
        st.integers(min_value=0, max_value=10**6),
    ),
    min_size=1,
    max_size=10,
)


@pytest.mark.parametrize("store_url", BACKENDS, indirect=True)
@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(plans=st.lists(WRITER_OPS, min_size=2, max_size=4))
def test_concurrent_writers_never_let_a_lower_token_overwrite_a_higher_one(
    store_url: Callable[[], tuple[str, dict[str, Any]]],
    writers: ProcessPoolExecutor,
    plans: list[list[tuple[str, str, int, int]]],
) -> None:
    url, options = store_url()
    with open_store(url, **options):
        pass  # create the table / file before the race, so the race is about the rows
    start_at = time.time() + 0.3
    futures = [writers.submit(run_writer, url, options, ops, start_at) for ops in plans]
    outcomes: list[Outcome] = [o for f in futures for o in f.result(timeout=120)]

    accepted: dict[str, list[Outcome]] = defaultdict(list)
    for outcome in outcomes:
        if outcome[4]:
            accepted[outcome[1]].append(outcome)
    for key, changes in accepted.items():
        changes.sort(key=lambda o: o[5])
        revisions = [o[5] for o in changes]
        assert revisions == list(range(1, len(changes) + 1)), f"{key}: lost or doubled {revisions}"
        tokens = [o[2] for o in changes]
        assert tokens == sorted(tokens), f"{key}: a lower token overwrote a higher one: {tokens}"
    for _kind, key, token, _value, ok, highest in outcomes:
        if not ok:
            assert highest > token
            assert highest in {o[2] for o in accepted[key]}, "refused in the name of a ghost"
    with open_store(url, **options) as store:
        for key in ("x", "y"):
            tried = [o[2] for o in outcomes if o[1] == key]
            record = store.read(key)
            if not tried:
                assert record is None
                continue
            assert record is not None
            assert record.token == max(tried)  # the highest token can never be refused
            assert record.revision == len(accepted[key])
            writes = [o for o in accepted[key] if o[0] == "write"]
            assert record.value == (writes[-1][3] if writes else None)
