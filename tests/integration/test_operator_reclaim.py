"""Lost leases and poison tasks, under real faults: SIGKILL, SIGSTOP, failing agents."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agentq import protocol
from agentq.holder import LeaseLost, write_report
from builders import task, worker
from fleet import Fleet

LEASE = 3
RECONCILE = 0.5  # the fleet's operator runs with --reconcile-interval 0.5


def status(fleet: Fleet, name: str) -> dict:
    return fleet.task(name).get("status") or {}


def test_a_killed_agent_loses_its_task_to_another_worker_within_the_bound(fleet: Fleet) -> None:
    fleet.add_worker(worker("a").capabilities("llm"))
    fleet.add_worker(worker("b").capabilities("llm"))
    agent_a = fleet.agent("a", "hold")
    fleet.operator()
    # No retry backoff: this measures the reclaim mechanism alone (backoff adds its delay).
    fleet.add_task(task("job").requires("llm").lease(LEASE).max_reclaims(3).backoff(initial=0))
    first = fleet.wait_phase("job", "Running")["status"]
    assert first["worker"] == "a"
    fleet.agent("b", "hold")
    fleet.wait_all(lambda _: fleet.worker("b").get("status", {}).get("phase") == "Ready")

    agent_a.kill()  # SIGKILL: no goodbye, the lease simply stops being renewed
    killed_at = time.monotonic()
    second = fleet.wait_task(
        "job",
        lambda b: (b.get("status") or {}).get("worker") == "b",
        timeout=LEASE + RECONCILE + 10,
        what="re-dispatch to b",
    )["status"]
    elapsed = time.monotonic() - killed_at
    # The lease was last renewed before the kill, so expiry + re-dispatch fits the bound.
    print(f"re-dispatched {elapsed:.2f}s after the kill (bound {LEASE + RECONCILE + 1}s)")
    assert elapsed <= LEASE + RECONCILE + 1, (elapsed, second, fleet.logs())
    assert second["fencingToken"] > first["fencingToken"]
    assert second["reclaims"] == 1 and second["attempt"] == 2
    assert second["history"][-1]["worker"] == "a"
    reasons = fleet.wait_reasons("job", {"LeaseExpired": 1, "Reclaimed": 1, "Assigned": 2})
    assert reasons.count("Assigned") == 2


def test_a_zombie_completion_is_refused(fleet: Fleet) -> None:
    fleet.add_worker(worker("a").capabilities("llm"))
    fleet.add_worker(worker("b").capabilities("llm"))
    agent_a = fleet.agent("a", "hold")
    fleet.operator()
    fleet.add_task(task("job").requires("llm").lease(LEASE))
    old = fleet.wait_phase("job", "Running")["status"]
    agent_a.signal(signal.SIGSTOP)  # frozen, not dead: it will wake up as a zombie
    fleet.agent("b", "hold")
    fleet.wait_task(
        "job", lambda b: (b.get("status") or {}).get("worker") == "b", timeout=LEASE + 10
    )
    fleet.wait_phase("job", "Running")

    # The zombie's library call notices it lost the claim and refuses to write...
    zombie = protocol.Report(
        token=old["fencingToken"], worker="a", outcome="Succeeded", result={"by": "zombie"}
    )
    with pytest.raises(LeaseLost):
        write_report(fleet.leases, fleet.namespace, "job", zombie)
    # ...and a zombie that bypasses the library and writes anyway is refused by the operator.
    fleet.leases.patch_namespaced_lease(
        protocol.task_lease_name("job"),
        fleet.namespace,
        {"metadata": {"annotations": {protocol.ANNOTATION_REPORT: zombie.encode()}}},
    )
    fleet.wait_reasons("job", {"StaleReportRefused": 1})
    now = status(fleet, "job")
    assert now["phase"] == "Running" and now["worker"] == "b"
    assert "result" not in now
    agent_a.signal(signal.SIGCONT)


def test_a_hung_agent_whose_sidecar_beats_is_reclaimed_for_no_progress(fleet: Fleet) -> None:
    fleet.add_worker(worker("a").capabilities("llm"))
    fleet.agent("a", "stuck")  # renews the claim, progress never moves
    fleet.operator()
    fleet.add_task(task("job").requires("llm").lease(LEASE).progress_deadline(4).max_reclaims(0))
    done = fleet.wait_phase("job", "DeadLettered", timeout=20)["status"]
    assert done["history"][-1]["reason"] == "ProgressDeadlineExceeded"
    assert done["error"]["reason"] == "ProgressDeadlineExceeded"


@pytest.mark.parametrize("behaviour", ["fail", "hang"])
def test_a_poison_task_is_dead_lettered_after_exactly_max_reclaims_plus_one(
    fleet: Fleet, behaviour: str
) -> None:
    fleet.add_worker(worker("a").capabilities("llm"))
    fleet.add_worker(worker("b").capabilities("llm"))
    fleet.agent("a", behaviour, work_seconds=0.2)
    fleet.agent("b", behaviour, work_seconds=0.2)
    fleet.operator()
    fleet.add_task(
        task("poison").requires("llm").lease(LEASE).max_reclaims(2).backoff(initial=0.2, max=1)
    )
    final = fleet.wait_phase("poison", "DeadLettered", timeout=40)["status"]
    assert final["attempt"] == 3
    assert final["reclaims"] == 3
    assert [h["attempt"] for h in final["history"]] == [1, 2, 3]
    assert len({h["token"] for h in final["history"]}) == 3
    reasons = fleet.wait_reasons("poison", {"Assigned": 3, "DeadLettered": 1})
    assert reasons.count("Assigned") == 3
    assert reasons.count("DeadLettered") == 1
    # The last attempt's Lease goes; that nothing re-dispatches the task afterwards, however
    # long, is tests/unit/operator/test_stays_put.py's.
    fleet.wait_all(lambda _: fleet.task_lease("poison") is None, timeout=10)
    assert status(fleet, "poison")["attempt"] == 3


def test_hold_waits_for_a_person_then_requeue_redrives(fleet: Fleet) -> None:
    fleet.add_worker(worker("a").capabilities("llm"))
    hung = fleet.agent("a", "hang")
    fleet.operator()
    fleet.add_task(task("careful").requires("llm").lease(LEASE).on_expiry("Hold"))
    held = fleet.wait_phase("careful", "Held", timeout=LEASE + 10)["status"]
    assert held["attempt"] == 1
    # Nobody but a person moves it (for minutes: tests/unit/operator/test_stays_put.py).
    fleet.wait_reasons("careful", {"Held": 1})
    assert status(fleet, "careful")["phase"] == "Held"

    hung.kill()
    fleet.agent("a", "complete", work_seconds=0.2)
    agentq = str(Path(sys.executable).with_name("agentq"))
    done = subprocess.run(
        [agentq, "requeue", "careful", "-n", fleet.namespace],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        env={"KUBECONFIG": fleet.kubeconfig, "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stderr
    final = fleet.wait_phase("careful", "Succeeded", timeout=20)["status"]
    assert final["attempt"] == 2 and final["fencingToken"] > held["fencingToken"]
    fleet.wait_reasons("careful", {"Requeued": 1})


def test_grace_period_accepts_a_late_report_and_otherwise_redispatches(fleet: Fleet) -> None:
    fleet.add_worker(worker("a").capabilities("llm").max_in_flight(2))
    agent_a = fleet.agent("a", "hold")
    fleet.operator("--max-reclaims", "3")
    patient = task("patient").requires("llm").lease(LEASE).on_expiry("GracePeriod", grace=6)
    fleet.add_task(patient)
    fleet.add_task(task("abandoned").requires("llm").lease(LEASE).on_expiry("GracePeriod", grace=2))
    items = fleet.wait_all(
        lambda items: all((t.get("status") or {}).get("phase") == "Running" for t in items)
    )
    assert {t["status"]["worker"] for t in items} == {"a"}
    fleet.add_worker(worker("b").capabilities("llm").max_in_flight(2))
    fleet.agent("b", "hold")

    agent_a.kill()
    late = status(fleet, "patient")
    fleet.wait_task(
        "patient",
        lambda b: bool((b.get("status") or {}).get("graceUntil")),
        timeout=LEASE + 5,
        what="grace period started",
    )
    report = protocol.Report(
        token=late["fencingToken"], worker="a", outcome="Succeeded", result={"late": True}
    )
    write_report(fleet.leases, fleet.namespace, "patient", report)
    assert fleet.wait_phase("patient", "Succeeded", timeout=10)["status"]["result"] == {
        "late": True
    }
    moved = fleet.wait_task(
        "abandoned", lambda b: (b.get("status") or {}).get("worker") == "b", timeout=LEASE + 2 + 10
    )["status"]
    assert moved["reclaims"] == 1


def test_a_not_ready_worker_keeps_its_tasks_until_their_leases_expire(fleet: Fleet) -> None:
    fleet.add_worker(worker("a").capabilities("llm"))
    fleet.add_worker(worker("b").capabilities("llm"))
    agent_a = fleet.agent("a", "hold", worker_lease_seconds=3)
    fleet.operator()
    fleet.add_task(task("long").requires("llm").lease(12).backoff(initial=0))
    fleet.wait_phase("long", "Running")
    fleet.agent("b", "hold")
    agent_a.kill()
    killed = time.monotonic()
    fleet.wait_all(
        lambda _: fleet.worker("a").get("status", {}).get("phase") == "NotReady", timeout=10
    )
    # The worker is NotReady, but its claim's own lease has not run out: nothing moves.
    assert time.monotonic() - killed < 10
    held = status(fleet, "long")
    assert held["worker"] == "a" and held["phase"] == "Running" and held["reclaims"] == 0
    moved = fleet.wait_task(
        "long", lambda b: (b.get("status") or {}).get("worker") == "b", timeout=20
    )["status"]
    elapsed = time.monotonic() - killed
    assert 10 <= elapsed <= 12 + RECONCILE + 1, elapsed
    assert moved["reclaims"] == 1
