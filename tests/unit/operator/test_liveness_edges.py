"""Liveness edges: a task that waited for good, or an operator that spun, after one unlucky
interleaving or one stranger's edit. Each test failed before its fix (issue 19 item 9, and
an earlier review's findings whose fixes were lost)."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest
from prometheus_client import REGISTRY

from agentq import protocol
from agentq.operator.fake import Held
from agentq.operator.port import KubeError, Status
from agentq.views import MAX_TASK_BYTES
from builders import task
from harness import NS, Harness, run


async def running(h: Harness, name: str, *, lease: int = 30, max_reclaims: int = 3) -> int:
    await h.running(
        task(name).requires("llm").lease(lease).max_reclaims(max_reclaims),
        worker="w",
        lease_seconds=100_000,
    )
    assert h.phase(name) == "Running", h.status(name)
    token: int = h.status(name)["fencingToken"]
    return token


# --- A2: a task Lease stripped of its agentq.dev/lease label ------------------------------


def strip_label(h: Harness, name: str) -> None:
    h.kube.edit(
        "leases",
        NS,
        protocol.task_lease_name(name),
        lambda b: b["metadata"]["labels"].pop(protocol.LABEL_LEASE_KIND),
    )


@run
async def test_a_claim_lease_stripped_of_its_label_is_repaired_and_its_report_committed() -> None:
    """The watch selects claim Leases by the label: without it the Lease is gone from the
    operator's view, and the task stayed Running for good (its grant's Lease "exists")."""
    h = Harness()
    await running(h, "t")
    strip_label(h, "t")
    await h.settle()
    lease = h.lease("t")
    assert lease is not None
    assert lease["metadata"]["labels"].get(protocol.LABEL_LEASE_KIND) == "task", lease
    h.report("t", outcome="Succeeded", result={"ok": True})
    await h.settle()
    assert h.phase("t") == "Succeeded", h.status("t")


@run
async def test_a_claim_lease_stripped_of_its_label_whose_holder_died_is_reclaimed() -> None:
    h = Harness()
    await running(h, "t", lease=10)
    strip_label(h, "t")
    await h.settle()
    await h.run_for(15)
    status = h.status("t")
    assert status.get("reclaims") == 1, status
    assert status["history"][-1]["reason"] == "LeaseExpired", status


# --- A3: over-long report fields are judged at once, not at the end of the lease ---------


@run
async def test_over_long_report_fields_are_judged_while_the_holder_renews() -> None:
    h = Harness()
    await running(h, "t", max_reclaims=0)
    h.report("t", outcome="Succeeded", resultRef="s3://b/" + "k" * 5000)
    await h.run_for(2, renew=("t",))
    status = h.status("t")
    assert status["phase"] == "DeadLettered", status
    assert status["error"]["reason"] == "InvalidReport", status
    reasons = h.kube.reasons("t")
    assert reasons, reasons


# --- B(a): a retry after an unknown outcome is a decision, not a look at the deadline -----


@run
async def test_a_report_whose_commit_had_an_unknown_outcome_is_committed_on_retry() -> None:
    """The retry's timer only looked at the claim's next deadline: the holder renews (a
    healthy claim, its report unchanged: no decision) so the report was never committed."""
    h = Harness()
    await running(h, "t")
    h.kube.inject("patch_status", KubeError("timeout"), when=lambda a: a[0] == "agenttasks")
    h.report("t", outcome="Succeeded", result={"ok": True})
    await h.settle()
    assert h.phase("t") == "Running"
    await h.run_for(5, renew=("t",))
    assert h.phase("t") == "Succeeded", h.status("t")


# --- B(b): a revocation that loses a race is tried again --------------------------------


@run
async def test_a_revocation_that_loses_its_race_is_tried_again() -> None:
    h = Harness()
    await running(h, "t")
    # The revocation's CAS loses to renewals twice (the second time nothing else changed
    # on the task, so only the retry can bring it).
    h.kube.inject("patch_lease", Status.CONFLICT, times=2)
    h.kube.edit("agenttasks", NS, "t", lambda b: b["spec"].__setitem__("cancel", True))
    await h.settle()
    await h.run_for(5, renew=("t",))
    lease = h.lease("t")
    assert lease is not None
    assert lease["metadata"]["annotations"].get(protocol.ANNOTATION_REVOKED) == "Cancelled"


# --- B(c) and B(f): a finished task's Lease and its TTL delete --------------------------


@run
async def test_a_finished_tasks_lease_delete_that_loses_a_race_to_a_renewal_is_retried() -> None:
    """The holder renewed between the commit and the Lease's delete: the delete lost its
    CAS, the renewal's decision found a delete already in flight, and the Lease (with the
    record of the finished task, and so its TTL) stayed for good."""
    h = Harness(ttl_after_finished=5)
    await running(h, "t")
    gate = asyncio.Event()
    h.kube.inject("delete_lease", Held(gate))
    h.report("t", outcome="Succeeded", result={"ok": True})
    await h.steps(10, yields=5)
    assert h.phase("t") == "Succeeded"
    h.renew("t")  # the holder's last renewal, before it saw the end
    await h.steps(10, yields=5)
    gate.set()
    await h.settle()
    await h.run_for(3)
    assert h.lease("t") is None
    await h.run_for(10)
    assert h.kube.get("agenttasks", NS, "t") is None, "deleted after its TTL"


@run
async def test_a_ttl_delete_that_loses_to_a_change_of_the_task_is_tried_again() -> None:
    """A finished task changed while its TTL delete was in flight (a label added): the
    delete lost its precondition, but the entry already said the new version, and was
    forgotten: the task was never deleted. (A requeue or a cancel meanwhile goes through
    a record of its own and a fresh entry: test_cleanup.py.)"""
    h = Harness(ttl_after_finished=5)
    await running(h, "t")
    h.report("t", outcome="Succeeded", result={"ok": True})
    await h.settle()
    gate = asyncio.Event()
    h.kube.inject("delete_task", Held(gate))
    h.clock.advance(6)
    await h.steps(10, yields=5)
    assert h.controller.cleanup.deleting == 1
    h.kube.edit(
        "agenttasks",
        NS,
        "t",
        lambda b: b["metadata"].setdefault("labels", {}).__setitem__("team", "a"),
    )
    await h.steps(10, yields=5)
    gate.set()
    await h.settle()
    await h.run_for(10)
    assert h.kube.get("agenttasks", NS, "t") is None, "deleted after its TTL"


# --- B(d): a standby neither spins nor piles up what the watches show -------------------


@run
async def test_a_standby_does_not_spin_on_timers_left_from_its_lead() -> None:
    h = Harness(ttl_after_finished=5)
    await running(h, "t")
    h.report("t", outcome="Succeeded", result={"ok": True})
    await h.settle()
    h.task(task("p").requires("gpu"))  # pending, nobody can take it
    await h.settle()
    c = h.controller
    c.set_leading(False)
    h.clock.advance(3600)  # every timer of the lead is long past
    stop = asyncio.Event()
    calls = 0
    may_decide = c.may_decide

    def counting() -> bool:
        nonlocal calls
        calls += 1
        return may_decide()

    c.may_decide = counting  # type: ignore[method-assign]
    loop = asyncio.create_task(c.run(stop))
    started = time.monotonic()
    await asyncio.sleep(0.3)
    stop.set()
    c.poke()
    await loop
    assert calls < 20, f"{calls} rounds of the loop in {time.monotonic() - started:.1f}s"


@run
async def test_a_standby_keeps_no_growing_record_of_changes() -> None:
    h = Harness()
    h.worker("w", "llm", lease_seconds=100_000)
    c = h.controller
    c.set_leading(False)
    for i in range(200):
        h.task(task(f"t{i}").requires("llm"))
        h.delete_task(f"t{i}")
    c.standby()
    changed = c.store.changed
    assert len(changed.tasks) + len(changed.finished) + len(changed.leases) == 0
    c.set_leading(True)
    await h.settle()
    h.task(task("after").requires("llm"))
    await h.settle()
    assert h.phase("after") == "Assigned"


# --- B(e): a write's end belongs to the record it started on ------------------------------


@run
async def test_the_end_of_a_write_about_a_deleted_task_does_not_end_its_successors() -> None:
    """A write about a task that was deleted and re-created under its name ended after the
    new task's grant had started: it cleared the new record's write in flight."""
    h = Harness()
    await running(h, "t")
    old = asyncio.Event()
    h.kube.inject("patch_status", Held(old), when=lambda a: a[0] == "agenttasks")
    h.report("t", outcome="Succeeded", result={"ok": True})
    await h.steps(10, yields=5)
    assert h.record("t").busy
    h.delete_task("t")
    new = asyncio.Event()
    h.kube.inject("patch_status", Held(new), when=lambda a: a[0] == "agenttasks")
    h.task(task("t").requires("llm").lease(30))
    await h.steps(10, yields=5)
    record = h.record("t")
    assert record.busy and record.granting == "w", "the new task's grant is in flight"
    old.set()
    await h.steps(10, yields=5)
    assert record.busy and record.granting == "w", "still in flight"
    assert h.controller.store.busy == 1
    new.set()
    await h.settle()
    assert h.phase("t") == "Assigned"


# --- B(g): a claim Lease is its task's by its name, not by a label anyone can edit -------


@run
async def test_a_claim_lease_labelled_for_another_task_still_speaks_for_its_own() -> None:
    """The task a claim Lease speaks for was read from its agentq.dev/task label: with the
    label pointing elsewhere, its own task was not decided on its report while its holder
    renewed (and the other task was decided on a Lease that is not its own)."""
    h = Harness()
    await running(h, "t")
    h.kube.edit(
        "leases",
        NS,
        protocol.task_lease_name("t"),
        lambda b: b["metadata"]["labels"].__setitem__(protocol.LABEL_TASK, "other"),
    )
    await h.settle()
    h.report("t", outcome="Succeeded", result={"ok": True})
    await h.run_for(3, renew=("t",))
    assert h.phase("t") == "Succeeded", h.status("t")


# --- B(h): a relist that fails is tried again ---------------------------------------------


@run
async def test_a_failed_relist_does_not_stop_the_cleanup_for_good() -> None:
    h = Harness(ttl_after_finished=10, max_finished=10)
    now = h.clock.now().isoformat()
    for i in range(15):
        body = task(f"t{i:02d}").requires("llm").obj()
        body["metadata"]["namespace"] = NS
        body["status"] = {"phase": "Succeeded", "finishedAt": now, "fencingToken": 1}
        h.kube.put("agenttasks", body)
    await h.settle()
    cleanup = h.controller.cleanup
    assert cleanup.overflowed
    calls = 0

    async def relist() -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise KubeError("the API server is away")
        for (plural, _, _), body in list(h.kube.objects.items()):
            if plural == "agenttasks":
                h.controller.observe("agenttasks", "MODIFIED", dict(body))

    cleanup.relist = relist
    for _ in range(60):
        await h.advance(30)
    assert calls >= 2
    assert not any(p == "agenttasks" for (p, _, _) in h.kube.objects), "all deleted"


# --- A task too large for etcd to store with a status ---------------------------------------


def unprocessable_count(reason: str) -> float:
    labels = {"kind": "AgentTask", "reason": reason}
    return REGISTRY.get_sample_value("agentq_unprocessable_total", labels) or 0.0


def near_the_limit(h: Harness, name: str, room: int) -> None:
    """A task over MAX_TASK_BYTES, with ``room`` bytes left under etcd's limit (the fake's
    ``max_object_bytes``); a negative room: not even the object as it is fits again (a
    real update carries more than a create did, and the status the API server defaults)."""
    body = h.task(task(name).requires("llm").payload({"blob": "x" * (MAX_TASK_BYTES + 1000)}))
    h.kube.max_object_bytes = len(json.dumps(body, separators=(",", ":"))) + room


@pytest.mark.parametrize(
    ("room", "error", "condition"),
    [
        (600, {"reason": "ObjectTooLarge", "retryable": False}, True),  # the short Failed
        (60, {"reason": "ObjectTooLarge"}, False),  # the error's reason alone
        (0, None, False),  # the phase alone ("Failed" is shorter than "Pending")
    ],
)
@run
async def test_a_task_too_large_for_its_status_ends_failed_in_the_write_that_fits(
    room: int, error: dict[str, Any] | None, condition: bool
) -> None:
    """The status that says ObjectTooLarge did not fit beside the object, nor the smaller
    StatusRefused one meant to say so: the task stayed Pending for good, retried every
    UNWRITABLE_SECONDS with an event."""
    h = Harness()
    h.worker("w1", "llm", lease_seconds=100_000)
    before = unprocessable_count("ObjectTooLarge")
    near_the_limit(h, "big", room)
    await h.settle()
    st = h.status("big")
    assert st["phase"] == "Failed", st
    assert (st.get("error") or {}).items() >= (error or {}).items()
    if error is None:
        assert "error" not in st
    got = h.condition("big", "Unprocessable")
    assert (got is not None and got["reason"] == "ObjectTooLarge") is condition, got
    assert "Unprocessable" in h.kube.reasons("big")
    assert unprocessable_count("ObjectTooLarge") == before + 1
    record = h.controller.store.tasks.get((NS, "big"))
    assert record is None or record.unwritable_until is None, "not left alone: done"
    assert h.lease("big") is None


@run
async def test_a_task_that_takes_no_write_at_all_says_so_and_is_left_alone() -> None:
    """Within a few dozen bytes of etcd's limit nothing can be written to the object (the
    API server already drops managedFields to make room): an Event and a metric say so,
    the task is left alone for UNWRITABLE_SECONDS -- never a write every pass -- and the
    operator serves the others."""
    h = Harness()
    h.worker("w1", "llm", lease_seconds=100_000)
    before = unprocessable_count("Unwritable")
    near_the_limit(h, "big", -10)
    await h.settle()
    assert h.phase("big") == "Pending"
    assert h.record("big").unwritable_until is not None
    assert unprocessable_count("Unwritable") == before + 1
    said = [e["message"] for e in h.kube.events("big") if e["reason"] == "Unprocessable"]
    assert len(said) == 1 and "cannot be processed" in said[0], said
    calls = h.kube.calls["patch_status"]
    await h.advance(60)
    assert h.kube.calls["patch_status"] - calls < 5, "written again and again"
    h.task(task("small").requires("llm"))
    await h.settle()
    assert h.phase("small") == "Assigned"


@run
async def test_a_status_refused_for_another_reason_still_fails_with_status_refused() -> None:
    """Only a refusal for size takes the ObjectTooLarge ladder; a 422 keeps its reason."""
    h = Harness()
    h.worker("w1", "llm", lease_seconds=100_000)
    h.kube.inject("patch_status", Status.INVALID, when=lambda a: a[0] == "agenttasks")
    h.task(task("t").requires("llm"))
    await h.settle()
    assert h.phase("t") == "Failed"
    assert h.status("t")["error"]["reason"] == "StatusRefused"
