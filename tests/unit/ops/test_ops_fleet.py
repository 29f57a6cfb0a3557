"""``agentq top``'s view: shares against weights, queues per capability set, phases."""

from __future__ import annotations

import pytest

from agentq.clock import rfc3339
from agentq.ops.fleet import ShareWindow, build
from opsdata import NOW, at, task, worker

pytestmark = pytest.mark.unit


def test_weight_share_is_over_the_ready_unpaused_workers_of_the_namespace() -> None:
    workers = [
        worker("a", "llm", weight=1, served=10),
        worker("b", "llm", weight=3, served=30),
        worker("off", "llm", weight=4, phase="NotReady", served=60),
        worker("paused", "llm", weight=4, phase="Draining", paused=True),
    ]
    view = build([], workers, now=NOW)
    rows = {w.name: w for w in view.workers}
    assert rows["a"].weight_share == pytest.approx(0.25)
    assert rows["b"].weight_share == pytest.approx(0.75)
    assert rows["off"].weight_share is None and rows["paused"].weight_share is None
    assert rows["a"].served_share == pytest.approx(0.1)
    assert rows["off"].served_share == pytest.approx(0.6)
    assert rows["paused"].paused and rows["paused"].phase == "Draining"


def test_namespaces_are_separate_fleets() -> None:
    other = worker("z", "llm", weight=3, served=5)
    other["metadata"]["namespace"] = "other"
    view = build([], [worker("a", "llm", served=5), other], now=NOW)
    assert {w.name: w.weight_share for w in view.workers} == {"a": 1.0, "z": 1.0}
    assert {w.name: w.served_share for w in view.workers} == {"a": 1.0, "z": 1.0}


def test_queues_group_pending_tasks_by_required_capabilities() -> None:
    waiting = {"phase": "Pending", "notBefore": rfc3339(at(30))}
    tasks = [
        task("t1", requires=("llm",), created=-120, status={"phase": "Pending"}),
        task("t2", requires=("llm",), created=-30, status=waiting),
        task("t3", requires=("llm",), created=-10),  # no status yet: Pending
        task("t4", requires=("quantum",), created=-5, status={"phase": "Pending"}),
        task("t5", requires=("llm",), status={"phase": "Running", "worker": "a"}),
        task("t6", requires=("llm",), status={"phase": "DeadLettered"}),
    ]
    workers = [
        worker("a", "llm", in_flight=1, max_in_flight=3),
        worker("b", "llm", "gpu", in_flight=0, max_in_flight=2),
        worker("c", "llm", phase="NotReady", max_in_flight=5),
    ]
    view = build(tasks, workers, now=NOW)
    queues = {q.capabilities: q for q in view.queues}
    llm = queues[("llm",)]
    assert (llm.pending, llm.backoff, llm.oldest_seconds) == (3, 1, 120.0)
    assert (llm.capable_workers, llm.ready_workers, llm.free_slots) == (3, 2, 4)
    assert queues[("quantum",)].unschedulable
    assert view.phases == {"agents": {"Pending": 4, "Running": 1, "DeadLettered": 1}}
    assert view.to_dict()["queues"][1]["unschedulable"] is True


def test_the_share_window_measures_the_last_minute_only() -> None:
    window = ShareWindow(seconds=60)
    key_a, key_b = ("agents", "a"), ("agents", "b")
    window.add(0, {key_a: 100.0, key_b: 0.0})  # a served a lot long ago
    assert window.shares() == {}
    window.add(30, {key_a: 110.0, key_b: 30.0})
    assert window.shares() == {key_a: pytest.approx(0.25), key_b: pytest.approx(0.75)}
    window.add(61, {key_a: 150.0, key_b: 40.0})
    window.add(95, {key_a: 160.0, key_b: 70.0})
    # The baseline is the newest sample at least 60 s old (t=30), not the first (t=0):
    # a served 50 and b 40 since.
    assert window.shares() == {key_a: pytest.approx(50 / 90), key_b: pytest.approx(40 / 90)}


def test_a_new_worker_in_the_window_counts_from_zero_and_nothing_served_is_empty() -> None:
    window = ShareWindow(seconds=60)
    window.add(0, {("ns", "a"): 5.0})
    window.add(1, {("ns", "a"): 5.0})
    assert window.shares() == {}
    window.add(2, {("ns", "a"): 6.0, ("ns", "new"): 3.0})
    assert window.shares() == {("ns", "a"): pytest.approx(0.25), ("ns", "new"): pytest.approx(0.75)}


def test_in_flight_is_counted_from_the_tasks_not_the_workers_status_snapshot() -> None:
    # The operator rate-limits worker status writes: the snapshot may lag the tasks.
    workers = [
        worker("a", "llm", in_flight=1, max_in_flight=3),
        worker("b", "llm", max_in_flight=2),
    ]
    tasks = [
        task("done", status={"phase": "Succeeded", "worker": "a"}),
        task("run", status={"phase": "Running", "worker": "b"}, cost=2),
        task("new", status={"phase": "Assigned", "worker": "b"}),
        task("wait"),
    ]
    view = build(tasks, workers, now=NOW)
    rows = {w.name: w for w in view.workers}
    assert (rows["a"].in_flight, rows["a"].in_flight_cost) == (0, 0)
    assert (rows["b"].in_flight, rows["b"].in_flight_cost) == (2, 3)
    (queue,) = view.queues
    assert queue.free_slots == 3  # a: 3 - 0, b: 2 - 2
