"""A task's whole life with real processes (operator, sidecar, agent-sim) on the real API
server: a cancel and a deadline reach the agent within a heartbeat interval, fence its sink
writes and end the task without a re-dispatch; a finished task goes after its TTL."""

from __future__ import annotations

import json
import time
from pathlib import Path

from agentq.fencing import StaleTokenError, open_store
from builders import task, worker
from fleet import Fleet


def wait_for(check: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():  # type: ignore[operator]
            return
        time.sleep(0.1)
    raise AssertionError(f"not within {timeout}s: {what}")


def event_of(pair_events: list[dict[str, object]], kind: str, task_name: str) -> dict | None:
    return next(
        (e for e in pair_events if e.get("event") == kind and e.get("task") == task_name), None
    )


def running(fleet: Fleet, name: str, builder: object) -> dict:
    """The task's status once Running."""
    fleet.add_task(builder)  # type: ignore[arg-type]
    status: dict = fleet.wait_phase(name, "Running", timeout=30)["status"]
    return status


def test_a_cancel_reaches_the_agent_within_a_heartbeat_and_fences_its_sink(
    fleet: Fleet, tmp_path: Path
) -> None:
    sink = f"sqlite://{tmp_path / 'sink.db'}"
    fleet.add_worker(worker("w", "llm").max_in_flight(1))
    pair = fleet.agent("w", "hold", sink=sink)
    fleet.operator("--no-leader-election")
    status = running(fleet, "job", task("job").requires("llm").lease(9).heartbeat(3))
    token = status["fencingToken"]
    with open_store(sink) as store:
        store.write("job", token, {"part": 1})  # the attempt has written before
    fleet.kubectl("patch", "agenttask", "job", "--type=merge", "-p", '{"spec":{"cancel":true}}')
    cancelled_at = time.monotonic()
    wait_for(lambda: event_of(pair.agent.events(), "revoked", "job"), 10, "the agent told")
    told = time.monotonic() - cancelled_at
    revoked = event_of(pair.agent.events(), "revoked", "job")
    assert revoked is not None and revoked["reason"] == "Cancelled"
    assert told <= 3 + 1.5, f"told after {told:.1f}s (heartbeat interval 3 s)"
    done = fleet.wait_phase("job", "Cancelled", timeout=15)["status"]
    assert done["history"][-1]["outcome"] == "Cancelled"
    fenced = event_of(pair.agent.events(), "sink-fenced", "job")
    assert fenced is not None and fenced["token"] == token + 1
    assert fleet.task_lease("job") is None
    # The attempt's own later write is refused at its sink: the revocation fenced it.
    with open_store(sink) as store:
        try:
            store.write("job", token, {"late": True})
        except StaleTokenError:
            pass
        else:
            raise AssertionError("a write of the cancelled attempt was accepted")
    time.sleep(5)  # never dispatched again, though a worker has room
    assert fleet.task("job")["status"]["phase"] == "Cancelled"
    assert not [e for e in pair.agent.events() if e.get("event") == "assigned"][1:]


def test_a_deadline_ends_a_running_task_failed_and_its_agent_is_told(fleet: Fleet) -> None:
    fleet.add_worker(worker("w", "llm"))
    pair = fleet.agent("w", "hold")
    fleet.operator("--no-leader-election")
    running(fleet, "slow", task("slow").requires("llm").lease(9).heartbeat(3).deadline(6))
    done = fleet.wait_phase("slow", "Failed", timeout=25)["status"]
    assert done["error"]["reason"] == "DeadlineExceeded"
    wait_for(lambda: event_of(pair.agent.events(), "revoked", "slow"), 5, "the agent told")
    revoked = event_of(pair.agent.events(), "revoked", "slow")
    assert revoked is not None and revoked["reason"] == "DeadlineExceeded"
    assert "DeadlineExceeded" in fleet.reasons("slow")


def test_a_cancel_racing_a_completion_has_exactly_one_outcome(fleet: Fleet) -> None:
    fleet.add_worker(worker("w", "llm").max_in_flight(8))
    pair = fleet.agent("w", "complete", work_seconds=1.0)
    fleet.operator("--no-leader-election")
    names = [f"race-{i}" for i in range(8)]
    for name in names:
        fleet.add_task(task(name).requires("llm").lease(9).heartbeat(3))
    wait_for(
        lambda: all(event_of(pair.agent.events(), "assigned", n) for n in names), 20, "assigned"
    )
    time.sleep(0.9)  # the agents report about now
    for name in names:
        fleet.kubectl("patch", "agenttask", name, "--type=merge", "-p", '{"spec":{"cancel":true}}')
    finals = {
        n: fleet.wait_phase(n, "Succeeded", "Cancelled", timeout=30)["status"]["phase"]
        for n in names
    }
    for name, phase in finals.items():
        reasons = fleet.reasons(name)
        assert ("Succeeded" in reasons) != ("Cancelled" in reasons), (name, phase, reasons)


def test_a_finished_task_is_deleted_after_its_ttl(fleet: Fleet) -> None:
    fleet.add_worker(worker("w", "llm"))
    fleet.agent("w", "complete", work_seconds=0.1)
    fleet.operator("--no-leader-election")
    fleet.add_task(task("short").requires("llm").ttl(2))
    fleet.add_task(task("kept").requires("llm"))
    fleet.wait_phase("short", "Succeeded", timeout=30)
    fleet.wait_phase("kept", "Succeeded", timeout=30)
    finished = time.monotonic()
    wait_for(lambda: "short" not in {t["metadata"]["name"] for t in fleet.tasks()}, 10, "deleted")
    assert time.monotonic() - finished <= 2 + 0.5 + 3  # TTL + reconcile interval + slack
    assert fleet.task_lease("short") is None
    assert "kept" in {t["metadata"]["name"] for t in fleet.tasks()}
    json.dumps(fleet.task("kept"))  # still there: the default TTL is 12 h
