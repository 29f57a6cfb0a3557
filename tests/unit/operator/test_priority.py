"""spec.priority: within a namespace's pending queue, higher first, oldest first within a
priority (docs/tenancy.md, "Priorities")."""

from __future__ import annotations

from typing import Any

from agentq.operator.queue import PendingQueue
from builders import task
from harness import NS, Harness, run


def drain(queue: PendingQueue, required: frozenset[str]) -> list[str]:
    order = []
    where = (required, frozenset[str]())  # (no budgets)
    while (head := queue.head((NS, ""), where)) is not None:
        order.append(head[2])
        queue.pop((NS, ""), where)
    return order


def test_the_queue_puts_higher_priority_first_and_oldest_first_within_one() -> None:
    queue = PendingQueue()
    llm = frozenset({"llm"})
    for name, created, priority in [
        ("old-low", "2026-01-01T00:00:01Z", 0),
        ("new-high", "2026-01-01T00:00:05Z", 10),
        ("old-high", "2026-01-01T00:00:02Z", 10),
        ("negative", "2026-01-01T00:00:00Z", -5),
        ("new-low", "2026-01-01T00:00:03Z", 0),
    ]:
        queue.add((NS, name), llm, created, ready=True, priority=priority)
    assert drain(queue, llm) == ["old-high", "new-high", "old-low", "new-low", "negative"]


def test_a_changed_priority_moves_a_queued_task_and_leaves_no_stale_place() -> None:
    queue = PendingQueue()
    llm = frozenset({"llm"})
    queue.add((NS, "a"), llm, "2026-01-01T00:00:01Z", ready=True)
    queue.add((NS, "b"), llm, "2026-01-01T00:00:02Z", ready=True)
    queue.add((NS, "b"), llm, "2026-01-01T00:00:02Z", ready=True, priority=3)
    assert queue.head((NS, ""), (llm, frozenset())) == (-3, "2026-01-01T00:00:02Z", "b")
    queue.add((NS, "b"), llm, "2026-01-01T00:00:02Z", ready=True, priority=-3)
    # b's older places (priority 0 and 3) are stale: it comes once, last.
    assert drain(queue, llm) == ["a", "b"]


async def one_slot_busy(h: Harness, lows: int) -> None:
    """w1 (one slot) runs "first"; then ``lows`` priority-0 tasks queue behind it."""
    h.worker("w1", "llm", max_in_flight=1, lease_seconds=1000)
    h.task(task("first").requires("llm").lease(600))
    await h.settle()
    assert h.status("first").get("worker") == "w1"
    h.renew("first")
    for i in range(lows):
        h.task(task(f"low{i:02d}").requires("llm").lease(600))
    await h.settle()


def finish(h: Harness, name: str) -> None:
    h.report(name, outcome="Succeeded", result={"ok": True})


@run
async def test_a_later_higher_priority_task_is_granted_at_the_next_free_slot() -> None:
    h = Harness()
    await one_slot_busy(h, 30)
    h.task(task("urgent").requires("llm").lease(600).priority(10))
    await h.settle()
    assert h.phase("urgent") == "Pending"
    finish(h, "first")
    await h.settle()
    assert h.phase("urgent") == "Assigned", h.status("urgent")
    assert all(h.phase(f"low{i:02d}") == "Pending" for i in range(30))
    # Then the priority-0 tasks, oldest first.
    h.renew("urgent")
    finish(h, "urgent")
    await h.settle()
    assert h.phase("low00") == "Assigned"


@run
async def test_raising_a_pending_tasks_priority_moves_it_to_the_front() -> None:
    h = Harness()
    await one_slot_busy(h, 5)
    h.kube.edit("agenttasks", NS, "low04", lambda b: b["spec"].__setitem__("priority", 1))
    await h.settle()
    finish(h, "first")
    await h.settle()
    assert h.phase("low04") == "Assigned"
    assert [h.phase(f"low{i:02d}") for i in range(4)] == ["Pending"] * 4


@run
async def test_priority_orders_across_capability_sets_of_a_namespace() -> None:
    h = Harness()
    h.worker("w1", "llm", "code", max_in_flight=1, lease_seconds=1000)
    h.task(task("first").requires("llm").lease(600))
    await h.settle()
    h.renew("first")
    h.task(task("plain").requires("llm").lease(600))
    h.task(task("urgent-code").requires("code").lease(600).priority(5))
    await h.settle()
    finish(h, "first")
    await h.settle()
    assert h.phase("urgent-code") == "Assigned"
    assert h.phase("plain") == "Pending"


@run
async def test_a_head_whose_condition_write_is_in_flight_is_not_jumped_by_a_younger_task() -> None:
    # The older task waits Unschedulable; one change to the worker gives it the
    # capability and a slot. Clearing the condition is a write in flight when dispatch
    # runs: the younger task of another capability set must not take the slot meanwhile
    # (a CI failure of test_leader_epoch_fence.py, on a takeover).
    h = Harness()
    h.worker("w1", "llm", max_in_flight=1, lease_seconds=1000)
    h.kube.edit("agentworkers", NS, "w1", lambda b: b["spec"].__setitem__("paused", True))
    await h.settle()
    h.task(task("old").requires("llm", "x").lease(600))
    await h.settle()
    assert (h.condition("old", "Unschedulable") or {}).get("status") == "True"
    h.task(task("new").requires("llm").lease(600))
    await h.settle()
    assert h.phase("new") == "Pending"

    def offer_x_and_resume(body: dict[str, Any]) -> None:
        body["spec"]["capabilities"] = ["llm", "x"]
        body["spec"]["paused"] = False

    h.kube.edit("agentworkers", NS, "w1", offer_x_and_resume)
    await h.settle()
    assert h.phase("old") == "Assigned", h.status("old")
    assert h.phase("new") == "Pending"
