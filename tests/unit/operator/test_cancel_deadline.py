"""spec.cancel and spec.activeDeadlineSeconds, decided on the in-memory API server.

A pending task ends at once; a running attempt's claim is revoked first (the Lease is
marked, its sidecar tells the agent and lets the Lease go), and the task ends once the
holder stops or its lease runs out -- never reclaimed, never dispatched again.
"""

from __future__ import annotations

import json

from agentq import protocol
from agentq.operator.port import Status
from builders import task
from harness import NS, Harness, run


def cancel(h: Harness, name: str, value: bool = True) -> None:
    h.kube.edit("agenttasks", NS, name, lambda b: b["spec"].__setitem__("cancel", value))


def release(h: Harness, name: str) -> None:
    """What the sidecar does once it told its agent: the Lease let go (holder cleared)."""
    h.kube.edit(
        "leases",
        NS,
        protocol.task_lease_name(name),
        lambda b: b["spec"].update(holderIdentity=None),
    )


def revoked(h: Harness, name: str) -> str | None:
    lease = h.lease(name)
    assert lease is not None
    return (lease["metadata"].get("annotations") or {}).get(protocol.ANNOTATION_REVOKED)


async def running(h: Harness, name: str = "t", **extra: int) -> None:
    builder = task(name).requires("llm").lease(10).backoff(initial=0)
    if "deadline" in extra:
        builder = builder.deadline(extra["deadline"])
    h.task(builder)
    await h.settle()
    h.renew(name)
    await h.settle()
    assert h.phase(name) == "Running"


@run
async def test_a_pending_task_is_cancelled_at_once_and_never_granted() -> None:
    h = Harness()
    h.task(task("t").requires("llm"))  # no worker yet
    await h.settle()
    cancel(h, "t")
    await h.settle()
    assert h.phase("t") == "Cancelled"
    assert h.condition("t", "Cancelled")["status"] == "True"
    assert "Cancelled" in h.kube.reasons("t")
    h.worker("w1", "llm", lease_seconds=1000)
    await h.run_for(5)
    assert h.phase("t") == "Cancelled" and h.lease("t") is None


@run
async def test_a_running_task_is_revoked_then_cancelled_when_its_holder_lets_go() -> None:
    h = Harness()
    h.worker("w1", "llm", max_in_flight=1, lease_seconds=1000)
    await running(h)
    h.task(task("next").requires("llm"))
    cancel(h, "t")
    await h.settle()
    assert h.phase("t") == "Running", "the agent may still work: its slot stays taken"
    assert revoked(h, "t") == "Cancelled"
    assert h.condition("t", "Revoked")["reason"] == "Cancelled"
    assert h.phase("next") == "Pending"
    release(h, "t")
    await h.settle()
    assert h.phase("t") == "Cancelled" and h.lease("t") is None
    assert h.status("t")["history"][-1]["outcome"] == "Cancelled"
    assert h.status("t").get("reclaims") == 0
    assert h.phase("next") == "Assigned", "the slot is given back"


@run
async def test_a_revoked_claim_whose_holder_stops_renewing_ends_when_its_lease_runs_out() -> None:
    h = Harness()
    h.worker("w1", "llm", lease_seconds=1000)
    await running(h)
    cancel(h, "t")
    await h.settle()
    assert revoked(h, "t") == "Cancelled"
    await h.advance(10.5)
    assert h.phase("t") == "Cancelled"
    assert h.status("t").get("reclaims") == 0, "a cancel is no failed attempt"
    await h.run_for(30)
    assert h.phase("t") == "Cancelled"


@run
async def test_a_revoked_claim_renewed_regardless_ends_a_lease_duration_later() -> None:
    h = Harness()
    h.worker("w1", "llm", lease_seconds=1000)
    await running(h)
    cancel(h, "t")
    await h.settle()
    await h.run_for(8, renew=("t",))  # a holder that ignores the revocation
    assert h.phase("t") == "Running"
    await h.run_for(3, renew=("t",))
    assert h.phase("t") == "Cancelled"


@run
async def test_a_completion_racing_a_cancel_gives_exactly_one_outcome() -> None:
    h = Harness()
    h.worker("w1", "llm", lease_seconds=1000)
    await running(h)
    h.kube.hold_events()  # the report and the cancel reach the operator together
    h.report("t", outcome="Succeeded", result={"ok": True})
    cancel(h, "t")
    h.kube.deliver()
    await h.settle()
    assert h.phase("t") == "Succeeded"
    assert "Cancelled" not in h.kube.reasons("t")
    assert h.condition("t", "Cancelled")["reason"] == "AlreadyFinished"


@run
async def test_a_cancel_of_a_finished_task_is_ignored_and_said_once() -> None:
    h = Harness()
    h.worker("w1", "llm", lease_seconds=1000)
    await running(h)
    h.report("t", outcome="Succeeded", result={"ok": True})
    await h.settle()
    cancel(h, "t")
    await h.settle()
    cancel(h, "t", False)
    cancel(h, "t", True)
    await h.settle()
    assert h.phase("t") == "Succeeded"
    assert h.kube.reasons("t").count("CancelIgnored") == 1


@run
async def test_a_cancel_set_and_unset_before_it_is_decided_changes_nothing() -> None:
    h = Harness()
    h.worker("w1", "llm", lease_seconds=1000)
    await running(h)
    h.kube.hold_events()
    cancel(h, "t")
    cancel(h, "t", False)
    h.kube.deliver()
    await h.settle()
    assert h.phase("t") == "Running" and revoked(h, "t") is None


@run
async def test_only_a_requeue_undoes_a_cancel() -> None:
    h = Harness()
    h.worker("w1", "llm", lease_seconds=1000)
    h.task(task("t").requires("gpu"))
    cancel(h, "t")
    await h.settle()
    assert h.phase("t") == "Cancelled"
    cancel(h, "t", False)
    await h.settle()
    assert h.phase("t") == "Cancelled"

    def requeue(body: dict) -> None:  # what agentq requeue does
        body["metadata"].setdefault("annotations", {})[protocol.ANNOTATION_REQUEUE] = "r1"
        body["spec"]["requiredCapabilities"] = ["llm"]

    h.kube.edit("agenttasks", NS, "t", requeue)
    await h.settle()
    assert h.phase("t") == "Assigned"


@run
async def test_a_running_task_past_its_deadline_fails_deadline_exceeded() -> None:
    h = Harness()
    h.worker("w1", "llm", lease_seconds=1000)
    await running(h, deadline=60)
    await h.run_for(59, renew=("t",))
    assert h.phase("t") == "Running"
    await h.run_for(2, renew=("t",))
    assert revoked(h, "t") == "DeadlineExceeded"
    release(h, "t")
    await h.settle()
    status = h.status("t")
    assert status["phase"] == "Failed" and status["error"]["reason"] == "DeadlineExceeded"
    assert "DeadlineExceeded" in h.kube.reasons("t")


@run
async def test_the_deadline_counts_across_attempts() -> None:
    h = Harness()
    h.worker("w1", "llm", lease_seconds=100_000)
    h.worker("w2", "llm", lease_seconds=100_000)
    await running(h, deadline=30)
    start = h.status("t")["startTime"]
    await h.advance(11)  # the holder died: reclaimed, granted again
    status = h.status("t")
    assert status["reclaims"] == 1 and status["phase"] == "Assigned"
    assert status["startTime"] == start
    h.renew("t")
    await h.run_for(15, renew=("t",))
    assert h.phase("t") == "Running"
    await h.run_for(5, renew=("t",))
    assert revoked(h, "t") == "DeadlineExceeded"


@run
async def test_a_pending_task_past_its_deadline_fails_without_a_grant() -> None:
    h = Harness()
    h.worker("w1", "llm", lease_seconds=100_000)
    builder = task("t").requires("llm").lease(10).deadline(20).backoff(initial=60, max=60, jitter=0)
    h.task(builder)
    await h.settle()
    h.renew("t")
    await h.settle()
    await h.advance(11)  # reclaimed: pending for a 60 s backoff, past the deadline in 9 s
    assert h.phase("t") == "Pending"
    h.renew_worker("w1")
    await h.advance(10)
    status = h.status("t")
    assert status["phase"] == "Failed" and status["error"]["reason"] == "DeadlineExceeded"
    assert status["attempt"] == 1


@run
async def test_a_report_on_a_revoked_lease_before_it_ends_is_committed_once() -> None:
    h = Harness()
    h.worker("w1", "llm", lease_seconds=1000)
    await running(h)
    cancel(h, "t")
    await h.settle()
    assert revoked(h, "t") == "Cancelled"
    status = h.status("t")
    body = {"token": status["fencingToken"], "worker": "w1", "outcome": "Succeeded"}
    h.annotate_lease("t", protocol.ANNOTATION_REPORT, json.dumps(body))
    await h.settle()
    assert h.phase("t") == "Succeeded", "the work was done: one outcome, the report's"
    assert "Cancelled" not in h.kube.reasons("t")


@run
async def test_a_cancel_unset_after_its_revocation_was_decided_still_ends_the_attempt() -> None:
    """The revocation is committed (condition ``Revoked``) but its mark on the Lease loses
    to renewals until the user has set ``cancel`` back: the attempt is still revoked and
    ends Cancelled -- only a requeue undoes a cancel -- and a deadline passing later does
    not end it under the wrong reason."""
    h = Harness()
    h.worker("w1", "llm", lease_seconds=1000)
    await running(h, deadline=30)
    h.kube.inject("patch_lease", Status.CONFLICT, times=1000)
    cancel(h, "t")
    await h.settle()
    assert (h.condition("t", "Revoked") or {}).get("reason") == "Cancelled", h.status("t")
    assert revoked(h, "t") is None
    cancel(h, "t", False)
    await h.settle()
    h.kube._faults.clear()  # the renewals stop winning
    await h.run_for(5, renew=("t",))
    assert revoked(h, "t") == "Cancelled"
    assert h.phase("t") == "Running"
    release(h, "t")
    await h.settle()
    status = h.status("t")
    assert status["phase"] == "Cancelled", status
    assert status["history"][-1]["outcome"] == "Cancelled"
