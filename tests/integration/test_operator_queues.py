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


def _make_queues(fleet: Fleet, specs: list[tuple[str, float, str | None, bool]]) -> list[str]:
    """Create AgentQueues (name suffix, weight, parent suffix, leaf) selecting the fleet's
    namespace; returns their full names in order. Leaves draw on the fleet's workers."""
    names = []
    for suffix, weight, parent, leaf in specs:
        name = f"{fleet.namespace}-{suffix}"
        builder = (
            queue(name).weight(weight).selects(**{"kubernetes.io/metadata.name": fleet.namespace})
        )
        if parent is not None:
            builder = builder.parent(f"{fleet.namespace}-{parent}")
        if leaf:
            builder = builder.workers_in(fleet.namespace)
        fleet.custom.create_cluster_custom_object(GROUP, VERSION, "agentqueues", builder.obj())
        names.append(name)
    return names


def _delete_queues(fleet: Fleet, names: list[str]) -> None:
    for name in names:
        fleet.custom.delete_cluster_custom_object(GROUP, VERSION, "agentqueues", name)


def _grant_order(done: list[dict[str, Any]]) -> list[str]:
    """Each granted task's queue, in the order of the grants (fencing tokens rise with
    every grant), read back from the API server."""
    granted = sorted((t for t in done if _token(t)), key=_token)
    return [t["spec"]["queue"] for t in granted]


def _worst_gap(order: list[str], left: set[str], right: set[str], wl: float, wr: float) -> float:
    """The largest |served(left)/wl - served(right)/wr| over every prefix of ``order``
    that ends before either side has run out of work (both backlogged): costs are 1."""
    total_l = sum(q in left for q in order)
    total_r = sum(q in right for q in order)
    a = b = 0
    worst = 0.0
    for q in order:
        if a == total_l or b == total_r:
            break  # one side drained: the bound holds only while both are backlogged
        a += q in left
        b += q in right
        worst = max(worst, abs(a / wl - b / wr))
    return worst


def _all_succeeded(items: list[dict[str, Any]]) -> bool:
    return all((t.get("status") or {}).get("phase") == "Succeeded" for t in items)


def test_weighted_queues_share_by_weight_within_the_bound(fleet: Fleet) -> None:
    """Weights 1:3, both backlogged from the start, cost 1 each: at every grant the
    normalized services differ by at most the DRR bound C/w_i + C/w_j (= 4/3 here),
    with one more task of slack for the start (grants already in flight)."""
    light, heavy = _make_queues(fleet, [("w1", 1, None, True), ("w3", 3, None, True)])
    try:
        fleet.add_worker(worker("pool").capabilities("llm").max_in_flight(4))
        fleet.agent("pool", "complete", work_seconds=0.05)
        for i in range(30):
            fleet.add_task(task(f"l-{i:03d}").requires("llm").queue(light))
        for i in range(60):
            fleet.add_task(task(f"h-{i:03d}").requires("llm").queue(heavy))
        fleet.operator()
        done = fleet.wait_all(_all_succeeded, timeout=240)
        order = _grant_order(done)
        assert len(order) == 90
        gap = _worst_gap(order, {light}, {heavy}, 1, 3)
        assert gap <= 1 + 1 / 3 + 1, (gap, order)
        # And the heavy queue finished first: it got about three grants for each light one.
        first_60 = order[:60]
        assert first_60.count(heavy) >= 40, first_60
    finally:
        _delete_queues(fleet, [light, heavy])


def test_a_nested_queue_tree_converges_at_each_level(fleet: Fleet) -> None:
    """Orgs 2:1, two teams of weights 1:3 under the first: while all three leaves are
    backlogged the orgs share 2:1 and the teams 1:3, each within its level's bound. (A
    flat tree of the three leaves would give org1 4/5, not 2/3: the test tells them
    apart.)"""
    names = _make_queues(
        fleet,
        [
            ("org1", 2, None, False),
            ("org2", 1, None, True),
            ("team1", 1, "org1", True),
            ("team2", 3, "org1", True),
        ],
    )
    _, org2, team1, team2 = names
    try:
        fleet.add_worker(worker("pool").capabilities("llm").max_in_flight(4))
        fleet.agent("pool", "complete", work_seconds=0.05)
        for tag, leaf in (("o2", org2), ("t1", team1), ("t2", team2)):
            for i in range(36):
                fleet.add_task(task(f"{tag}-{i:03d}").requires("llm").queue(leaf))
        fleet.operator()
        done = fleet.wait_all(_all_succeeded, timeout=240)
        order = _grant_order(done)
        assert len(order) == 108
        # While all three are backlogged (until team2, served half the time, drains).
        last_t2 = len(order) - 1 - order[::-1].index(team2)
        window = order[: last_t2 + 1]
        # Level 1: org1 (its subtree) against org2, weights 2 and 1: bound C/2 + C/1.
        org_gap = _worst_gap(window, {team1, team2}, {org2}, 2, 1)
        assert org_gap <= 0.5 + 1 + 1, (org_gap, order)
        # Level 2: the teams under org1, weights 1 and 3: bound C/1 + C/3.
        inner = [q for q in window if q in (team1, team2)]
        team_gap = _worst_gap(inner, {team1}, {team2}, 1, 3)
        assert team_gap <= 1 + 1 / 3 + 1, (team_gap, order)
        # All three leaves took turns from the start: each is in the first 12 grants.
        assert {org2, team1, team2} <= set(order[:12]), order[:12]
    finally:
        _delete_queues(fleet, names)


def test_a_high_priority_task_behind_200_of_its_queue_takes_the_next_free_slot(
    fleet: Fleet,
) -> None:
    """200 priority-0 tasks wait in a queue (no worker is ready); a priority-10 task
    created after them is the first granted when a capable slot frees, and the rest
    follow oldest first."""
    (name,) = _make_queues(fleet, [("prio", 1, None, True)])
    try:
        fleet.add_worker(worker("pool").capabilities("llm").max_in_flight(1))
        fleet.operator()
        for i in range(200):
            fleet.add_task(task(f"low-{i:03d}").requires("llm").queue(name))
        fleet.add_task(task("urgent").requires("llm").queue(name).priority(10))
        fleet.agent("pool", "complete", work_seconds=0.05)
        fleet.wait_all(
            lambda items: sum(bool(_token(t)) for t in items) >= 6,
            timeout=120,
        )
        done = fleet.wait_all(
            lambda items: all(
                (t.get("status") or {}).get("phase") == "Succeeded"
                for t in sorted((t for t in items if _token(t)), key=_token)[:6]
            ),
            timeout=60,
        )
        granted = [
            t["metadata"]["name"] for t in sorted((t for t in done if _token(t)), key=_token)
        ]
        assert granted[0] == "urgent", granted[:10]
        assert granted[1:6] == [f"low-{i:03d}" for i in range(5)], granted[:10]
    finally:
        _delete_queues(fleet, [name])


def _queued(t: dict[str, Any]) -> tuple[str, str] | None:
    for c in (t.get("status") or {}).get("conditions") or []:
        if c["type"] == "Queued":
            return c["status"], c["reason"]
    return None


def test_a_team_cannot_use_a_queue_its_namespace_is_not_selected_by(fleet: Fleet) -> None:
    """A queue selecting namespaces labelled team=b: a task of the fleet's namespace
    (unlabelled) naming it is never dispatched, though a worker is free and serves the
    namespace's other work, and says why; labelling the namespace admits it."""
    name = f"{fleet.namespace}-only-b"
    body = queue(name).selects(team="b").workers_in(fleet.namespace).obj()
    fleet.custom.create_cluster_custom_object(GROUP, VERSION, "agentqueues", body)
    try:
        fleet.add_worker(worker("pool").capabilities("llm").max_in_flight(2))
        fleet.agent("pool", "complete", work_seconds=0.05)
        fleet.operator()
        fleet.add_task(task("sneaky").requires("llm").queue(name))
        refused = fleet.wait_task("sneaky", lambda t: _queued(t) is not None, timeout=60)
        assert _queued(refused) == ("False", "QueueForbidden"), refused.get("status")
        # The pool is free and serves the namespace's own tasks meanwhile.
        for i in range(3):
            fleet.add_task(task(f"own-{i}").requires("llm"))
        for i in range(3):
            fleet.wait_phase(f"own-{i}", "Succeeded", timeout=60)
        still = fleet.task("sneaky")
        assert (still.get("status") or {}).get("phase") == "Pending", still.get("status")
        assert not (still.get("status") or {}).get("fencingToken"), still.get("status")
        # The namespace joins team b: the verdict is judged again, the task is served.
        fleet.core.patch_namespace(fleet.namespace, {"metadata": {"labels": {"team": "b"}}})
        done = fleet.wait_phase("sneaky", "Succeeded", timeout=60)
        assert _queued(done) == ("True", "Admitted"), done.get("status")
    finally:
        fleet.custom.delete_cluster_custom_object(GROUP, VERSION, "agentqueues", name)
