"""Dispatch on the real API server: capability matching, weighted shares, printer columns.

The operator runs as a process; scripted agents (real processes) hold the claims.
"""

from __future__ import annotations

import time
import urllib.request
from collections import Counter

from agentq import protocol
from agentq.controlplane.cluster import free_port
from builders import task, worker
from fleet import Fleet


def test_tasks_go_only_to_capable_workers_and_complete(fleet: Fleet) -> None:
    fleet.add_worker(worker("gpu-1").capabilities("gpu", "llm").max_in_flight(4))
    fleet.add_worker(worker("cpu-1").capabilities("cpu", "llm").max_in_flight(4))
    fleet.agent("gpu-1", "complete", work_seconds=0.3)
    fleet.agent("cpu-1", "complete", work_seconds=0.3)
    metrics_port = free_port()
    fleet.operator("--metrics-port", str(metrics_port))
    for i in range(4):
        fleet.add_task(task(f"render-{i}").requires("gpu"))
        fleet.add_task(task(f"summarise-{i}").requires("llm"))
        fleet.add_task(task(f"parse-{i}").requires("cpu", "llm"))
    fleet.add_task(task("impossible").requires("quantum"))

    done = fleet.wait_all(
        lambda items: all(
            (t.get("status") or {}).get("phase") == "Succeeded"
            for t in items
            if t["metadata"]["name"] != "impossible"
        ),
        timeout=60,
    )
    by_name = {t["metadata"]["name"]: t["status"] for t in done}
    for i in range(4):
        assert by_name[f"render-{i}"]["worker"] == "gpu-1"
        assert by_name[f"parse-{i}"]["worker"] == "cpu-1"
        assert by_name[f"summarise-{i}"]["worker"] in ("gpu-1", "cpu-1")
        assert by_name[f"render-{i}"]["result"] == {"by": "gpu-1"}
        assert by_name[f"render-{i}"]["attempt"] == 1
    assert by_name["impossible"]["phase"] == "Pending"
    assert "worker" not in by_name["impossible"]
    # The claim's Lease is removed once the attempt is over.
    assert fleet.task_lease("render-0") is None
    fleet.wait_reasons("render-0", {"Assigned": 1, "Succeeded": 1})

    table = fleet.kubectl("get", "agenttasks")
    header = table.splitlines()[0].split()
    assert header[:5] == ["NAME", "PHASE", "WORKER", "ATTEMPT", "RECLAIMS"]
    assert "AGE" in header
    row = next(line.split() for line in table.splitlines() if line.startswith("render-0 "))
    assert row[1:5] == ["Succeeded", "gpu-1", "1", "0"]

    # Counts in worker status are published at most every WORKER_STATUS_INTERVAL (2 s in
    # the tests) per worker: wait for them.
    def served(status: dict) -> bool:
        # the four gpu-only tasks, at least
        return status.get("inFlight") == 0 and status.get("servedCost", 0) >= 4

    fleet.wait_all(lambda _: served(fleet.worker("gpu-1").get("status", {})))
    ready = fleet.worker("gpu-1")["status"]
    assert ready["phase"] == "Ready"

    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as rsp:
        scraped = rsp.read().decode()
    assert f'agentq_dispatches_total{{namespace="{fleet.namespace}"}} 12.0' in scraped
    assert 'agentq_completions_total{outcome="Succeeded"} 12.0' in scraped
    assert 'agentq_pending_tasks{capabilities="quantum"} 1.0' in scraped
    labels = f'capabilities="quantum",namespace="{fleet.namespace}"'
    assert f"agentq_namespace_pending_tasks{{{labels}}} 1.0" in scraped
    assert f'agentq_worker_ready{{namespace="{fleet.namespace}",worker="gpu-1"}} 1.0' in scraped
    assert "agentq_leader 1.0" in scraped


def test_weights_are_honoured_over_a_backlog(fleet: Fleet) -> None:
    weights = {"w1": 1, "w2": 2, "w4": 4}
    for name, weight in weights.items():
        fleet.add_worker(worker(name).capabilities("llm").weight(weight).max_in_flight(100))
        fleet.agent(name, "hold")
    fleet.operator()
    # Every worker must be eligible from the first decision on: a worker whose agent
    # is still starting would rightly get nothing at first, and the share with it.
    fleet.wait_all(
        lambda _: all(
            fleet.worker(name).get("status", {}).get("phase") == "Ready" for name in weights
        )
    )
    costs = [1 + (i % 3) for i in range(70)]  # costs 1..3, total 139
    for i, cost in enumerate(costs):
        fleet.add_task(task(f"job-{i:03d}").requires("llm").cost(cost))

    items = fleet.wait_all(
        lambda items: all((t.get("status") or {}).get("phase") == "Running" for t in items),
        timeout=90,
    )
    served: Counter[str] = Counter()
    for t in items:
        served[t["status"]["worker"]] += t["spec"]["cost"]
    total = sum(costs)
    for name, weight in weights.items():
        fair = total * weight / sum(weights.values())
        # The DRR bound: within one maximum task cost of the weighted share.
        assert abs(served[name] - fair) <= max(costs), (name, served, fair)

    # Every claim is backed by exactly one Lease, held by the status' worker with its token.
    for t in items:
        lease = fleet.task_lease(t["metadata"]["name"])
        assert lease is not None
        assert lease.spec.holder_identity == t["status"]["worker"]
        assert protocol.lease_token(lease.metadata.annotations) == t["status"]["fencingToken"]
    on_w4 = sum(1 for t in items if t["status"]["worker"] == "w4")
    fleet.wait_all(lambda _: fleet.worker("w4").get("status", {}).get("inFlight") == on_w4)


def test_paused_and_not_ready_workers_get_nothing(fleet: Fleet) -> None:
    fleet.add_worker(worker("paused").capabilities("llm").max_in_flight(5).paused())
    fleet.add_worker(worker("absent").capabilities("llm").max_in_flight(5))  # no agent: no Lease
    fleet.add_worker(worker("ready").capabilities("llm").max_in_flight(5))
    fleet.agent("paused", "hold")
    fleet.agent("ready", "hold")
    fleet.operator()
    for i in range(3):
        fleet.add_task(task(f"t{i}").requires("llm"))
    items = fleet.wait_all(
        lambda items: all((t.get("status") or {}).get("phase") == "Running" for t in items)
    )
    assert {t["status"]["worker"] for t in items} == {"ready"}
    fleet.wait_all(lambda _: fleet.worker("paused").get("status", {}).get("phase") == "Draining")
    fleet.wait_all(lambda _: fleet.worker("absent").get("status", {}).get("phase") == "NotReady")


def test_an_agent_told_to_stop_drains_and_loses_no_claim(fleet: Fleet) -> None:
    """A scale-down: the pod's agent gets SIGTERM while it holds two claims. It asks its
    sidecar to drain (the worker Lease is marked agentq.dev/draining), the worker is
    Draining and gets no new task, the two claims are finished and reported, and the
    agent exits; the backlog goes to the other worker. No task is reclaimed."""
    import signal as signals

    for name in ("leaving", "staying"):
        fleet.add_worker(worker(name).capabilities("llm").max_in_flight(2))
    leaving = fleet.agent("leaving", "complete", work_seconds=4)
    fleet.operator()
    for i in range(2):
        fleet.add_task(task(f"first-{i}").requires("llm"))
    fleet.wait_all(
        lambda items: all((t.get("status") or {}).get("phase") == "Running" for t in items)
    )
    leaving.agent.signal(signals.SIGTERM)
    fleet.wait_all(lambda _: fleet.worker("leaving").get("status", {}).get("phase") == "Draining")
    fleet.agent("staying", "complete", work_seconds=0.2)
    for i in range(4):
        fleet.add_task(task(f"later-{i}").requires("llm"))
    items = fleet.wait_all(
        lambda items: all((t.get("status") or {}).get("phase") == "Succeeded" for t in items),
        timeout=60,
    )
    by_name = {t["metadata"]["name"]: t["status"] for t in items}
    assert {by_name[f"first-{i}"]["worker"] for i in range(2)} == {"leaving"}
    assert {by_name[f"later-{i}"]["worker"] for i in range(4)} == {"staying"}
    assert all(status.get("reclaims", 0) == 0 for status in by_name.values())
    assert all(status["attempt"] == 1 for status in by_name.values())
    # It exits once nothing is in hand and its sidecar lists nothing for a while.
    deadline = time.monotonic() + 20
    while "drained" not in [e.get("event") for e in leaving.agent.events()]:
        assert time.monotonic() < deadline, leaving.agent.text()
        time.sleep(0.2)
    assert "draining" in [e.get("event") for e in leaving.agent.events()]
