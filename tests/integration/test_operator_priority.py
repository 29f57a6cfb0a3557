"""spec.priority on the real API server: when one slot frees, a higher-priority task
created later is granted before the older priority-0 tasks (docs/tenancy.md)."""

from __future__ import annotations

from builders import task, worker
from fleet import Fleet


def test_a_later_higher_priority_task_is_granted_first_when_a_slot_frees(fleet: Fleet) -> None:
    fleet.add_worker(worker("w1").capabilities("llm").max_in_flight(1))
    fleet.agent("w1", "complete", work_seconds=2)
    fleet.operator()
    fleet.add_task(task("first").requires("llm"))
    fleet.wait_phase("first", "Assigned", "Running", timeout=60)
    lows = [f"low-{i}" for i in range(5)]
    for name in lows:
        fleet.add_task(task(name).requires("llm"))
    fleet.add_task(task("urgent").requires("llm").priority(10))
    # The API server defaulted and kept the field.
    assert fleet.task("urgent")["spec"]["priority"] == 10
    assert fleet.task("low-0")["spec"]["priority"] == 0
    assert fleet.task("first")["status"]["phase"] in ("Assigned", "Running")

    granted = fleet.wait_task(
        "urgent", lambda t: (t.get("status") or {}).get("phase") != "Pending", timeout=60
    )
    assert granted["status"]["worker"] == "w1"
    # The one slot went to the urgent task: every older priority-0 task still waits.
    assert [(fleet.task(n).get("status") or {}).get("phase") for n in lows] == ["Pending"] * 5
    assert fleet.task("first")["status"]["phase"] == "Succeeded"
    # And the rest follow, oldest first.
    fleet.wait_all(
        lambda items: all((t.get("status") or {}).get("phase") == "Succeeded" for t in items),
        timeout=90,
    )
    starts = {n: fleet.task(n)["status"]["startTime"] for n in ["urgent", *lows]}
    assert starts["urgent"] < min(starts[n] for n in lows), starts
