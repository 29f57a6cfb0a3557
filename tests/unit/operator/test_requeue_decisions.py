"""What the operator does with a requeue request (the ``agentq.dev/requeue`` annotation), by
the phase of the task it lands on: a decision table on the in-memory API server.

Moved here from the bad-input corpus (tests/integration/test_bad_input_lifecycle.py),
where each case took a real operator, a canary task and seconds of waiting to show that
nothing moved. The corpus keeps one real-process case per behaviour: a request on a
Running task is ignored, a storm on a DeadLettered task requeues it once.
"""

from __future__ import annotations

from typing import Any

import pytest

from agentq import protocol
from builders import task
from harness import NS, Harness, run


def requeue(h: Harness, name: str, request: str) -> None:
    """Write a requeue request on the task, as ``agentq requeue`` does."""

    def change(body: dict[str, Any]) -> None:
        body["metadata"].setdefault("annotations", {})[protocol.ANNOTATION_REQUEUE] = request

    h.kube.edit("agenttasks", NS, name, change)


def attempt_state(h: Harness, name: str) -> dict[str, Any]:
    """What a requeue or a new attempt would move (see the corpus' ``attempt_state``)."""
    status = h.status(name)
    skip = ("progress", "conditions", "requeueHandled")  # a refusal is an answer, not a move
    state = {k: v for k, v in status.items() if k not in skip}
    state["conditions"] = sorted(
        (c.get("type"), c.get("status"), c.get("reason")) for c in status.get("conditions") or ()
    )
    return state


def requeued(h: Harness, name: str) -> int:
    history = h.status(name).get("history") or []
    return sum(1 for entry in history if entry.get("outcome") == "Requeued")


async def running(h: Harness, name: str) -> None:
    h.task(task(name).requires("llm").lease(30))
    await h.settle()
    h.renew(name, progress="started")
    await h.settle()
    assert h.phase(name) == "Running", h.status(name)


async def pending(h: Harness, name: str) -> None:
    h.task(task(name).requires("nobody-has-this"))
    await h.settle()
    assert h.phase(name) == "Pending"
    assert (h.condition(name, "Unschedulable") or {}).get("status") == "True"


async def succeeded(h: Harness, name: str) -> None:
    await running(h, name)
    h.report(name, outcome="Succeeded", result={})
    await h.settle()
    assert h.phase(name) == "Succeeded", h.status(name)


async def dead_lettered(h: Harness, name: str) -> None:
    h.task(task(name).requires("llm").lease(30).max_reclaims(0))
    await h.settle()
    h.renew(name)
    error = {"reason": "Boom", "message": "", "retryable": True}
    h.report(name, outcome="Failed", error=error)
    await h.settle()
    assert h.phase(name) == "DeadLettered", h.status(name)


@pytest.mark.parametrize(
    ("setup", "request_id"),
    [
        pytest.param(running, "by-hand-1", id="running"),
        pytest.param(pending, "by-hand-2", id="pending-unschedulable"),
        pytest.param(succeeded, "by-hand-3", id="succeeded"),
        pytest.param(dead_lettered, "", id="empty-request-on-dead-lettered"),
    ],
)
@run
async def test_a_requeue_request_where_none_is_allowed_changes_nothing(
    setup: Any, request_id: str
) -> None:
    h = Harness()
    h.worker("w1", "llm", lease_seconds=1000)
    await setup(h, "t")
    before = attempt_state(h, "t")
    requeue(h, "t", request_id)
    await h.run_for(3, renew=("t",) if h.phase("t") == "Running" else ())
    assert attempt_state(h, "t") == before
    assert "Requeued" not in h.kube.reasons("t")


@run
async def test_a_requeue_storm_on_a_held_task_requeues_it_once() -> None:
    """Twenty requests, each seen on its own: the first requeues the Held task and it is
    granted again; the rest arrive while it is Assigned and are ignored."""
    h = Harness()
    h.worker("w1", "llm", lease_seconds=1000)
    h.task(task("t").requires("llm").lease(3).on_expiry("Hold"))
    await h.settle()
    h.renew("t")
    await h.run_for(5)  # nobody renews: the lease runs out, and Hold holds it
    assert h.phase("t") == "Held", h.status("t")
    first = h.status("t")["fencingToken"]
    for i in range(20):
        requeue(h, "t", f"held-{i}")
        await h.settle()
    status = h.status("t")
    assert status["phase"] == "Assigned" and status["fencingToken"] > first
    assert requeued(h, "t") == 1, status.get("history")
    assert h.kube.reasons("t").count("Requeued") == 1


@run
async def test_a_requeue_storm_on_a_dead_lettered_task_requeues_it_once() -> None:
    """The same on a DeadLettered task, the new attempt then running to its end."""
    h = Harness()
    h.worker("w1", "llm", lease_seconds=1000)
    await dead_lettered(h, "t")
    for i in range(40):
        requeue(h, "t", f"storm-{i}")
        await h.settle()
    status = h.status("t")
    assert status["phase"] == "Assigned" and status["attempt"] == 2
    assert requeued(h, "t") == 1, status.get("history")
    h.renew("t")
    h.report("t", outcome="Succeeded", result={})
    await h.settle()
    assert h.phase("t") == "Succeeded"
    assert h.kube.reasons("t").count("Requeued") == 1


def deep(levels: int) -> Any:
    value: Any = "leaf"
    for _ in range(levels):
        value = {"k": value}
    return value


async def unprocessable(h: Harness, name: str) -> None:
    h.task(task(name).requires("llm").payload(deep(protocol.MAX_JSON_DEPTH + 5)))
    await h.settle()
    assert h.phase(name) == "Failed", h.status(name)
    assert (h.condition(name, "Unprocessable") or {}).get("reason") == "PayloadTooDeep"


def settled(h: Harness, name: str) -> bool:
    """The operator keeps no record of the task, only when to delete it."""
    uid = h.kube.get("agenttasks", NS, name)["metadata"]["uid"]
    return (NS, name) not in h.controller.store.tasks and h.controller.cleanup.holds(
        (NS, name), uid
    )


@pytest.mark.parametrize("setup", [succeeded, unprocessable], ids=["succeeded", "unprocessable"])
@run
async def test_a_requeue_request_on_a_task_that_cannot_run_again_is_refused_once(
    setup: Any,
) -> None:
    """Answered (``requeueHandled``, a RequeueRefused Event), so a wait on the task ends
    and its TTL runs: unanswered, the task stayed unsettled for good."""
    h = Harness()
    h.worker("w1", "llm", lease_seconds=1000)
    await setup(h, "t")
    phase = h.phase("t")
    requeue(h, "t", "again-1")
    await h.run_for(3)
    assert h.phase("t") == phase
    assert h.status("t").get("requeueHandled") == "again-1"
    assert h.kube.reasons("t").count("RequeueRefused") == 1
    assert "Requeued" not in h.kube.reasons("t")
    assert settled(h, "t")
    requeue(h, "t", "again-2")  # each request is answered once
    await h.run_for(3)
    assert h.status("t").get("requeueHandled") == "again-2"
    assert h.kube.reasons("t").count("RequeueRefused") == 2
    assert settled(h, "t")


@run
async def test_a_cancel_of_an_unprocessable_task_is_ignored_once_and_it_settles() -> None:
    h = Harness()
    await unprocessable(h, "t")
    h.kube.edit("agenttasks", NS, "t", lambda b: b["spec"].update(cancel=True))
    await h.run_for(3)
    assert h.phase("t") == "Failed"
    assert (h.condition("t", "Cancelled") or {}).get("reason") == "AlreadyFinished"
    assert h.kube.reasons("t").count("CancelIgnored") == 1
    assert settled(h, "t")
