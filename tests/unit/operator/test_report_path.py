"""The report of the attempt just committed is acknowledged, not refused as stale.

The operator commits a report from the claim's Lease and deletes the Lease afterwards, at
low priority; the task's new status is decided again meanwhile and found the report
still there. It was judged stale: a StaleReportRefused Warning (and a status write) for
every normal completion, which people read as a zombie. A zombie's report still is one.
"""

from __future__ import annotations

import json

from agentq import protocol
from agentq.operator.fake import Hang
from builders import task
from harness import NS, Harness, run


async def running(h: Harness, name: str = "t") -> None:
    await h.running(task(name).requires("llm").lease(30).backoff(initial=0))
    assert h.phase(name) == "Running"


def lease_deletes_held(h: Harness) -> None:
    """The operator's Lease deletes wait (low priority, a busy API server)."""
    h.kube.inject("delete_lease", Hang())


@run
async def test_a_success_draws_no_stale_report_refusal() -> None:
    h = Harness()
    await running(h)
    lease_deletes_held(h)
    h.report("t", outcome="Succeeded", result={"answer": 42})
    await h.steps(5)
    h.controller.gate.cancel_all()
    await h.controller.events.flush()
    assert h.phase("t") == "Succeeded"
    assert "StaleReportRefused" not in h.kube.reasons("t"), h.kube.reasons("t")
    assert "refusedReports" not in h.status("t")


@run
async def test_a_retryable_failure_draws_no_stale_report_refusal() -> None:
    h = Harness()
    await running(h)
    lease_deletes_held(h)
    h.report("t", outcome="Failed", error={"reason": "Flaky", "retryable": True})
    await h.steps(5)
    h.controller.gate.cancel_all()
    await h.controller.events.flush()
    assert h.status("t")["reclaims"] == 1
    assert "StaleReportRefused" not in h.kube.reasons("t"), h.kube.reasons("t")
    assert "refusedReports" not in h.status("t")


@run
async def test_a_success_after_the_lease_is_deleted_later_draws_nothing() -> None:
    h = Harness()
    await running(h)
    h.report("t", outcome="Succeeded", result={"answer": 42})
    await h.settle()
    assert h.phase("t") == "Succeeded" and h.lease("t") is None
    assert "StaleReportRefused" not in h.kube.reasons("t"), h.kube.reasons("t")


@run
async def test_a_zombies_report_on_the_next_attempts_lease_is_still_refused() -> None:
    h = Harness()
    await running(h)
    first = h.status("t")
    h.worker("w2", "llm", lease_seconds=1000)
    await h.advance(31)  # the holder stopped: reclaimed, granted to w2
    await h.settle()
    assert h.status("t")["fencingToken"] != first["fencingToken"]
    # The first attempt's agent wakes up and reports on the Lease of the second.
    zombie = {"token": first["fencingToken"], "worker": "w1", "outcome": "Succeeded"}
    h.annotate_lease("t", protocol.ANNOTATION_REPORT, json.dumps(zombie))
    await h.settle()
    assert "StaleReportRefused" in h.kube.reasons("t")
    assert h.phase("t") in ("Assigned", "Running")
    assert (NS, "t") in h.controller.store.tasks


@run
async def test_a_zombies_report_on_its_own_expired_attempts_lease_is_still_refused() -> None:
    """The reclaimed attempt's Lease is not deleted yet (low priority) when its agent,
    back from a freeze, reports on it: its history entry says LeaseExpired, not what it
    reports."""
    h = Harness()
    await running(h)
    first = h.status("t")
    lease_deletes_held(h)
    h.clock.advance(31)  # the holder stopped: reclaimed
    await h.steps(10, yields=5)
    assert h.status("t")["reclaims"] == 1 and h.lease("t") is not None
    zombie = {
        "token": first["fencingToken"],
        "worker": "w1",
        "outcome": "Failed",
        "error": {"reason": "Boom", "retryable": True},
    }
    h.annotate_lease("t", protocol.ANNOTATION_REPORT, json.dumps(zombie))
    await h.steps(10, yields=5)
    h.controller.gate.cancel_all()
    await h.controller.events.flush()
    assert "StaleReportRefused" in h.kube.reasons("t"), h.kube.reasons("t")
    assert h.status("t")["reclaims"] == 1
