"""Recovery under faults of the operator itself: SIGKILL mid-burst, a wall-clock jump,
and two replicas of which only one decides."""

from __future__ import annotations

import glob
import time
from collections import Counter
from pathlib import Path

import pytest

from agentq import protocol
from builders import task, worker
from fleet import Fleet


def assert_each_task_validly_held_once(fleet: Fleet, items: list[dict], limits: dict) -> None:
    per_worker: Counter[str] = Counter()
    for t in items:
        st = t["status"]
        name = t["metadata"]["name"]
        assert st["phase"] in ("Assigned", "Running"), (name, st)
        assert st["attempt"] == 1, f"{name} was granted {st['attempt']} times"
        assert st["fencingToken"] >= 1
        lease = fleet.task_lease(name)
        assert lease is not None, f"{name} has no Lease"
        assert lease.spec.holder_identity == st["worker"]
        assert protocol.lease_token(lease.metadata.annotations) == st["fencingToken"]
        per_worker[st["worker"]] += 1
    for name, count in per_worker.items():
        assert count <= limits[name], (name, count)
    # Tokens come from one cluster-wide counter: no two grants share one.
    tokens = [t["status"]["fencingToken"] for t in items]
    assert len(set(tokens)) == len(tokens)
    # Exactly one task Lease per task: nothing half-made or duplicated lying around.
    leases = fleet.leases.list_namespaced_lease(
        fleet.namespace, label_selector=f"{protocol.LABEL_LEASE_KIND}=task"
    ).items
    assert len(leases) == len(items)


def test_operator_killed_during_a_burst_of_200_loses_and_duplicates_nothing(
    fleet: Fleet,
) -> None:
    limits = {"w1": 60, "w2": 60, "w3": 60, "w4": 60}
    for name, limit in limits.items():
        fleet.add_worker(worker(name).capabilities("llm").max_in_flight(limit))
        fleet.agent(name, "hold")  # agent-sim beats every third of the heartbeat interval
    for i in range(200):
        fleet.add_task(task(f"burst-{i:03d}").requires("llm").lease(30))
    # One grant at a time, so the burst lasts long enough to be cut (at full speed it
    # can be over between two listings of 200 tasks on a loaded machine).
    first = fleet.operator(env={"AGENTQ_WRITE_CONCURRENCY": "1", "AGENTQ_DISPATCH_BATCH": "1"})
    deadline = time.monotonic() + 60
    while True:  # kill it mid-burst: some tasks granted, most not yet
        assigned = sum(1 for t in fleet.tasks() if (t.get("status") or {}).get("worker"))
        if assigned >= 20:
            break
        assert time.monotonic() < deadline, fleet.logs()
        time.sleep(0.05)
    first.kill()
    assert assigned < 200, "the burst finished before the kill; the test proves nothing"

    fleet.operator()
    # Running: the holder has renewed its claim, so the grant's Lease exists.
    items = fleet.wait_all(
        lambda items: all((t.get("status") or {}).get("phase") == "Running" for t in items),
        timeout=120,
    )
    assert len(items) == 200
    assert_each_task_validly_held_once(fleet, items, limits)
    # The restart gave every lease a full duration and the agents kept renewing,
    # so nothing was reclaimed.
    assert all(t["status"].get("reclaims", 0) == 0 for t in items)


LIBFAKETIME = next(iter(glob.glob("/usr/lib/*/faketime/libfaketime.so.1")), None)


@pytest.mark.skipif(LIBFAKETIME is None, reason="needs libfaketime (make test installs it)")
def test_a_wall_clock_jump_of_the_operator_expires_no_healthy_lease(
    fleet: Fleet, tmp_path: Path
) -> None:
    clock_file = tmp_path / "faketime"
    clock_file.write_text("+0\n")
    for name in ("a", "b"):
        fleet.add_worker(worker(name).capabilities("llm").max_in_flight(5))
        fleet.agent(name, "hold")
    for i in range(6):
        fleet.add_task(task(f"t{i}").requires("llm").lease(4))
    operator = fleet.operator(
        env={
            "LD_PRELOAD": str(LIBFAKETIME),
            "FAKETIME_TIMESTAMP_FILE": str(clock_file),
            "FAKETIME_NO_CACHE": "1",
            # An NTP step moves CLOCK_REALTIME only; the monotonic clock keeps going.
            "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        }
    )
    fleet.wait_all(
        lambda items: all((t.get("status") or {}).get("phase") == "Running" for t in items)
    )
    clock_file.write_text("+2h\n")  # the operator's wall clock leaps two hours ahead
    time.sleep(3 * 4)  # three lease durations of real time
    items = fleet.tasks()
    assert all(t["status"]["phase"] == "Running" for t in items), [t["status"] for t in items]
    assert all(t["status"].get("reclaims", 0) == 0 for t in items)
    assert all(t["status"]["attempt"] == 1 for t in items)
    assert "LeaseExpired" not in operator.text()
    # The jump was real for the operator: its timestamps are two hours ahead now.
    fleet.add_task(task("after").requires("llm").lease(4))
    stamped = fleet.wait_phase("after", "Assigned", "Running")["status"]["assignedAt"]
    assert stamped > time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 3600))


def test_two_replicas_one_leader_and_failover_within_a_lease(fleet: Fleet) -> None:
    fleet.add_worker(worker("a").capabilities("llm").max_in_flight(20))
    fleet.agent("a", "complete", work_seconds=0.2)
    flags = ("--leader-election", "--leader-lease-seconds", "4")
    first = fleet.operator(*flags)
    deadline = time.monotonic() + 30
    while not fleet.leader():  # the first has the lead before the second starts
        assert time.monotonic() < deadline, fleet.logs()
        time.sleep(0.1)
    second = fleet.operator(*flags)
    fleet.add_task(task("before").requires("llm"))
    fleet.wait_phase("before", "Succeeded", timeout=30)

    election = fleet.leases.read_namespaced_lease("agentq-operator", fleet.namespace)
    leader = election.spec.holder_identity
    assert leader
    leader_proc, standby = (first, second) if str(first.pid) in leader else (second, first)
    assert str(leader_proc.pid) in leader
    leader_proc.kill()
    killed = time.monotonic()
    fleet.add_task(task("after").requires("llm"))
    while str(standby.pid) not in (
        fleet.leases.read_namespaced_lease("agentq-operator", fleet.namespace).spec.holder_identity
        or ""
    ):
        assert time.monotonic() - killed < 30, fleet.logs()
        time.sleep(0.1)
    took = time.monotonic() - killed
    print(f"standby took over {took:.2f}s after SIGKILL of the leader (lease 4 s, retry 2 s)")
    # client-go's bound: one lease duration after the last renewal it saw, found at the
    # next retry; +1 s for a loaded machine.
    assert took <= 4 + 2 + 1, took
    fleet.wait_phase("after", "Succeeded", timeout=30)
    assert fleet.task("after")["status"]["attempt"] == 1


def test_a_restarted_operator_continues_each_workers_served_cost(fleet: Fleet) -> None:
    fleet.add_worker(worker("a").capabilities("llm").max_in_flight(4))
    fleet.agent("a", "complete", work_seconds=0.1)
    first = fleet.operator()
    for i in range(4):
        fleet.add_task(task(f"t{i}").requires("llm").cost(2))

    def served() -> float:
        return float(fleet.worker("a").get("status", {}).get("servedCost", -1))

    fleet.wait_all(lambda _: served() == 8, timeout=30)
    first.kill()
    fleet.operator()
    fleet.add_task(task("t9").requires("llm").cost(1))
    fleet.wait_phase("t9", "Succeeded", timeout=30)
    fleet.wait_all(lambda _: served() == 9, timeout=30)
