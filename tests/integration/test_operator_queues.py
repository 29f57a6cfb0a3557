"""AgentQueues on the real API server, with real sidecars and agents (docs/tenancy.md):
two team queues of equal weight share one pool; team B, arriving late behind a long
backlog of team A's, gets its share of the completions at once; a queue's status follows
its tasks."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from agentq import GROUP, VERSION
from builders import queue, task, worker
from fleet import Fleet


@pytest.fixture
def queues(fleet: Fleet) -> Iterator[list[str]]:
    """Two leaf queues selecting the fleet's namespace (by its name label), both drawing
    on its workers; deleted after the test (they are cluster-scoped)."""
    names = [f"{fleet.namespace}-a", f"{fleet.namespace}-b"]
    for name in names:
        body = (
            queue(name)
            .set(
                "spec.namespaceSelector",
                {"matchLabels": {"kubernetes.io/metadata.name": fleet.namespace}},
            )
            .workers_in(fleet.namespace)
            .obj()
        )
        fleet.custom.create_cluster_custom_object(GROUP, VERSION, "agentqueues", body)
    try:
        yield names
    finally:
        for name in names:
            fleet.custom.delete_cluster_custom_object(GROUP, VERSION, "agentqueues", name)


def _token(t: dict[str, Any]) -> int:
    return int((t.get("status") or {}).get("fencingToken") or 0)


def test_a_late_team_queue_gets_its_share_of_completions_at_once(
    fleet: Fleet, queues: list[str]
) -> None:
    qa, qb = queues
    fleet.add_worker(worker("pool").capabilities("llm").max_in_flight(2))
    fleet.agent("pool", "complete", work_seconds=0.2)
    fleet.operator()
    for i in range(80):
        fleet.add_task(task(f"a-{i:03d}").requires("llm").queue(qa))
    # Team A has the pool to itself (B's share is lent) until its 10th completion.
    items = fleet.wait_all(
        lambda items: sum((t.get("status") or {}).get("phase") == "Succeeded" for t in items) >= 10,
        timeout=120,
    )
    before = max(_token(t) for t in items)
    for i in range(40):
        fleet.add_task(task(f"b-{i:03d}").requires("llm").queue(qb))
    done = fleet.wait_all(
        lambda items: all(
            (t.get("status") or {}).get("phase") == "Succeeded"
            for t in items
            if t["metadata"]["name"].startswith("b-")
        ),
        timeout=240,
    )
    # Read back from the API server: every task kept its queue; completions in the order
    # they were granted (fencing tokens rise with every grant; finishedAt has whole
    # seconds only).
    assert {t["spec"]["queue"] for t in done} == {qa, qb}
    b_tokens = sorted(_token(t) for t in done if t["metadata"]["name"].startswith("b-"))
    # B is served at once: its first grant comes within a few grants of its arrival
    # (tokens are not consecutive: they are ranked, not subtracted).
    order = " ".join(
        f"{t['metadata']['name']}:{_token(t)}" for t in sorted(done, key=_token) if _token(t)
    )
    between = sum(before < _token(t) < b_tokens[0] for t in done)
    assert between <= 4, (between, order)
    # While both had a backlog (B's first grant to its last), B got >= 45 % of them.
    window = [
        t
        for t in done
        if b_tokens[0] <= _token(t) <= b_tokens[-1]
        and (t.get("status") or {}).get("phase") == "Succeeded"
    ]
    share = sum(t["metadata"]["name"].startswith("b-") for t in window) / len(window)
    assert share >= 0.45, (share, len(window), order)
    # ... and A was still backlogged at the end of that window.
    a_left = [
        t
        for t in done
        if t["metadata"]["name"].startswith("a-") and (_token(t) > b_tokens[-1] or not _token(t))
    ]
    assert a_left, "team A ran out of work: the window was not a shared backlog"


def _queue_status(
    fleet: Fleet, name: str, predicate: Callable[[dict[str, Any]], bool], timeout: float = 60
) -> dict[str, Any]:
    """The AgentQueue's status once ``predicate`` holds, read back from the API server."""
    deadline = time.monotonic() + timeout
    while True:
        body = fleet.custom.get_cluster_custom_object(GROUP, VERSION, "agentqueues", name)
        status: dict[str, Any] = body.get("status") or {}
        if predicate(status):
            return status
        if time.monotonic() > deadline:
            raise AssertionError(f"AgentQueue {name}: not reached in {timeout}s: {status}")
        time.sleep(0.2)


def _condition(status: dict[str, Any], kind: str) -> tuple[str, str] | None:
    for c in status.get("conditions") or []:
        if c["type"] == kind:
            return c["status"], c["reason"]
    return None


def test_a_queues_status_follows_its_tasks(fleet: Fleet, queues: list[str]) -> None:
    qa, _ = queues
    orphan = f"{fleet.namespace}-orphan"
    body = queue(orphan).parent(f"{fleet.namespace}-gone").workers_in(fleet.namespace).obj()
    fleet.custom.create_cluster_custom_object(GROUP, VERSION, "agentqueues", body)
    try:
        fleet.add_worker(worker("pool").capabilities("llm").max_in_flight(2))
        fleet.agent("pool", "complete", work_seconds=5)
        fleet.operator(env={"AGENTQ_QUEUE_STATUS_INTERVAL": "1"})
        for i in range(6):
            fleet.add_task(task(f"a-{i}").requires("llm").queue(qa).cost(2))
        # While the first two run: two in flight, four pending, what was granted served.
        running = _queue_status(
            fleet, qa, lambda s: s.get("inFlight") == 2 and s.get("pending") == 4
        )
        assert running["servedCost"] == 4
        assert _condition(running, "Attached") == ("True", "Attached")
        assert _condition(running, "Ready") == ("True", "Ready")
        # Siblings: every top-level queue of the cluster (other tests' too).
        assert 0 < running["weightShare"] <= 0.5
        assert 0 < running["share"] <= 1
        fleet.wait_all(
            lambda items: all((t.get("status") or {}).get("phase") == "Succeeded" for t in items),
            timeout=120,
        )
        done = _queue_status(
            fleet,
            qa,
            lambda s: s.get("inFlight") == 0 and s.get("pending") == 0,
        )
        assert done["servedCost"] == 12
        detached = _queue_status(fleet, orphan, lambda s: bool(s.get("conditions")))
        assert _condition(detached, "Attached") == ("False", "ParentNotFound")
        assert _condition(detached, "Ready") == ("False", "NotAttached")
    finally:
        fleet.custom.delete_cluster_custom_object(GROUP, VERSION, "agentqueues", orphan)
