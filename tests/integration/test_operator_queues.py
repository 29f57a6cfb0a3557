"""AgentQueues on the real API server, with real sidecars and agents (docs/tenancy.md):
two team queues of equal weight share one pool; team B, arriving late behind a long
backlog of team A's, gets its share of the completions at once."""

from __future__ import annotations

from collections.abc import Iterator
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
