"""State the controller sets up on one path only, or for one order of events only.

The family of 048444c (a worker Lease seen before its AgentWorker set no staleness
timer): the operator's watches deliver in any order, a write can end in several
ways (done, lost race, unknown outcome, not sent, cancelled with the lead), and
each path must leave the task or worker where some later step looks at it again.
Each test here failed on the controller as it was; found by reviewing the
controller for that family.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from agentq import protocol
from agentq.operator import metrics
from agentq.operator.dispatch import DOUBT_SECONDS
from agentq.operator.fake import Hang, Held
from agentq.operator.port import KubeError, Status
from builders import task
from harness import NS, Harness, run


async def grant_in_flight(h: Harness) -> None:
    """Step until a grant is in flight (the first step reserves a block of tokens)."""
    for _ in range(10):
        h.controller.step()
        await asyncio.sleep(0.001)
        if h.controller.dispatcher.grants:
            return
    raise AssertionError("no grant in flight")


@run
async def test_a_grant_cancelled_with_the_lead_is_dispatched_when_the_lead_comes_back() -> None:
    """Losing the lead cancels the grants in flight; a grant cancelled before its status
    write had taken its task off the pending queue, and nothing put it back: once this
    replica led again the task stayed Pending for good (until an event about it)."""
    h = Harness()
    h.worker("w1", "llm", lease_seconds=1000)
    h.kube.inject("patch_status", Hang(), when=lambda a: a[0] == "agenttasks")
    h.task(task("t").requires("llm"))
    await grant_in_flight(h)
    h.controller.set_leading(False)
    await asyncio.sleep(0.01)
    h.controller.set_leading(True)
    await h.settle()
    assert h.phase("t") == "Assigned"


@run
async def test_a_grant_whose_status_write_never_arrived_is_dispatched_again() -> None:
    """A grant's status write with an unknown outcome that did not happen (a timeout
    before the API server had it): its task had been taken off the pending queue, and
    only the path where the grant was not sent (``NotLeading``) put it back. The task
    stayed Pending for good, re-decided every resync but never dispatched."""
    h = Harness()
    h.worker("w1", "llm", lease_seconds=1000)
    h.kube.inject("patch_status", KubeError("timeout"), when=lambda a: a[0] == "agenttasks")
    h.task(task("t").requires("llm"))
    await h.settle()
    assert h.controller.stats.unknown == 1 and h.phase("t") == "Pending"
    # It may still land: its slot is held, the task not granted again, for a while.
    assert h.core().worker_state("w1").in_flight == 1
    await h.advance(2)
    assert h.phase("t") == "Pending"
    await h.advance(DOUBT_SECONDS)
    assert h.phase("t") == "Assigned"
    assert h.core().worker_state("w1").in_flight == 1


@run
async def test_a_grant_of_unknown_outcome_that_landed_holds_its_slot() -> None:
    """A grant whose request was cut at our timeout but that the API server applied (its
    reply lost, its event not yet seen): the slot was given back at once, and the next
    step granted the worker another task -- one worker over its maxInFlight (make chaos
    seed 2: 122 times, with requests bounded by a leader lease that ran short)."""
    h = Harness()
    h.worker("w1", "llm", max_in_flight=1, lease_seconds=1000)

    def first_grant(args: tuple[Any, ...]) -> bool:
        if args[0] != "agenttasks":
            return False
        h.kube.hold_events()  # its event is not seen yet (a slow watch)
        return True

    h.kube.inject("patch_status", KubeError("timeout"), applied=True, when=first_grant)
    h.task(task("a").requires("llm"))
    h.task(task("b").requires("llm"))
    await h.steps(30)
    await h.advance(5)
    assigned = [n for n in ("a", "b") if h.phase(n) == "Assigned"]
    assert len(assigned) == 1, "one grant landed; no second one beside it"
    h.kube.deliver()
    await h.settle()
    # The grant's event shows it landed: the task is held (its Lease written by the
    # repair of a claim without one); the other still waits for the slot.
    for _ in range(int(DOUBT_SECONDS) + 1):
        await h.advance(1)
        active = [n for n in ("a", "b") if h.phase(n) in ("Assigned", "Running")]
        assert len(active) <= 1, active
    assert h.core().worker_state("w1").in_flight <= 1


@run
async def test_a_requeue_whose_write_had_an_unknown_outcome_is_tried_again() -> None:
    """A decision whose write has an unknown outcome is looked at again RETRY_SECONDS
    later by a task timer; that timer did nothing for a task without a claim (Held,
    DeadLettered, Pending), so a requeue of a Held task whose write timed out was
    never made (until the next resync or event), nor an Unschedulable condition."""
    h = Harness()
    h.worker("w1", "llm", lease_seconds=1000)
    h.task(task("t").requires("llm").lease(3).on_expiry("Hold"))
    await h.settle()
    h.renew("t")
    await h.advance(3.5)
    assert h.phase("t") == "Held"
    h.renew_worker("w1")  # alive after all
    h.kube.inject("patch_status", KubeError("timeout"), when=lambda a: a[0] == "agenttasks")

    def requeue(body: dict[str, Any]) -> None:  # as `agentq requeue` does
        body["metadata"].setdefault("annotations", {})[protocol.ANNOTATION_REQUEUE] = "again"

    h.kube.edit("agenttasks", NS, "t", requeue)
    await h.settle()
    assert h.phase("t") == "Held" and h.controller.stats.unknown == 1
    await h.advance(2)
    assert h.phase("t") == "Assigned", h.status("t")


@run
async def test_a_late_status_reply_does_not_bring_back_a_deleted_worker() -> None:
    """The reply to a worker's status write can be read after the watch has shown the
    worker deleted. Tasks have tombstones for that; workers had none, and the reply
    put the deleted worker back in the cache for good: while its pod's sidecar still
    renewed the Lease it was Ready and given tasks, and after that it went on offering
    its capabilities (no Unschedulable condition for tasks only it could take)."""
    h = Harness()

    def delete_after_the_write(plural: str, kind: str, body: dict[str, Any]) -> None:
        if plural == "agentworkers" and kind == "MODIFIED" and h.kube.get(plural, NS, "w"):
            h.kube.remove("agentworkers", NS, "w")  # seen before the write's reply

    h.kube.subscribe(delete_after_the_write)
    h.worker("w", "llm", lease_seconds=1000)
    await h.settle()  # Ready: its status is written, and the worker deleted
    assert h.kube.get("agentworkers", NS, "w") is None
    assert (NS, "w") not in h.controller.store.workers
    h.task(task("t").requires("llm"))
    await h.settle()
    assert h.phase("t") == "Pending"
    assert (h.condition("t", "Unschedulable") or {}).get("status") == "True"


@run
async def test_a_task_needing_what_only_a_deleted_worker_offered_is_unschedulable() -> None:
    """Whether a capability set is offered is remembered per set and judged again when
    the workers change -- but only for sets with a task in the queue at that moment.
    A set whose tasks had all been dispatched kept "offered" after its only worker was
    deleted, and the next task needing it waited with no Unschedulable condition."""
    h = Harness()
    h.worker("w", "gpu", lease_seconds=1000)
    h.task(task("t1").requires("gpu"))
    await h.settle()
    assert h.phase("t1") == "Assigned"
    h.kube.remove("agentworkers", NS, "w")  # decommissioned
    await h.settle()
    h.task(task("t2").requires("gpu"))
    await h.settle()
    assert (h.condition("t2", "Unschedulable") or {}).get("status") == "True"


@run
async def test_a_task_needing_what_a_newer_worker_offers_is_not_unschedulable() -> None:
    """The other way round: a set judged "not offered" while its tasks waited, and left
    by them (deleted) before the namespace's first worker offering it arrived, kept
    "not offered": the next task needing it was called Unschedulable ("no AgentWorker
    in namespace yet") while that worker existed."""
    h = Harness()
    h.task(task("t1").requires("gpu"))
    await h.settle()
    assert (h.condition("t1", "Unschedulable") or {}).get("status") == "True"
    h.delete_task("t1")
    await h.settle()
    h.worker("w", "gpu", lease=False)  # offers gpu; not Ready yet
    await h.settle()
    h.task(task("t2").requires("gpu"))
    await h.settle()
    assert (h.condition("t2", "Unschedulable") or {}).get("status") != "True"


@run
async def test_a_worker_whose_spec_becomes_unreadable_says_so_and_comes_back() -> None:
    """A worker whose spec the operator cannot read leaves the scheduling core, and the
    publisher wrote the status only of workers in the core: its Ready condition went on
    saying LeaseRenewed (phase Ready) while it got no task, never Unprocessable."""
    h = Harness()
    h.worker("w", "llm", lease_seconds=1000)
    await h.settle()
    assert h.worker_status("w")["phase"] == "Ready"

    def spec(value: object) -> Callable[[dict[str, Any]], None]:
        return lambda body: body["spec"].__setitem__("maxInFlight", value)

    # Refused by this version's CRD, not by every CRD the operator may run with.
    h.kube.edit("agentworkers", NS, "w", spec("lots"))
    await h.settle()
    status = h.worker_status("w")
    assert status["phase"] == "NotReady"
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert ready["reason"] == "Unprocessable" and "maxInFlight" in ready["message"], ready
    await h.advance(1.1)  # the gauges follow within a second
    ready_gauge = {
        (s.labels["namespace"], s.labels["worker"]): s.value
        for m in metrics.WORKER_READY.collect()
        for s in m.samples
    }
    assert ready_gauge[(NS, "w")] == 0, ready_gauge
    h.task(task("t").requires("llm"))
    await h.settle()
    assert h.phase("t") == "Pending"
    h.kube.edit("agentworkers", NS, "w", spec(2))
    await h.settle()
    assert h.worker_status("w")["phase"] == "Ready"
    assert h.phase("t") == "Assigned"


@run
async def test_a_pending_task_refused_for_good_is_dispatched_again_after_its_pause() -> None:
    """A task whose status writes the API server refuses for good is left alone for
    ``UNWRITABLE_SECONDS``. A grant refused that way had taken the task off the
    pending queue and nothing put it back: the task stayed Pending for good, resync
    or not."""
    h = Harness()
    h.worker("w1", "llm", lease_seconds=100_000)
    # The grant and the smaller write that says why are both refused (422).
    h.kube.inject("patch_status", Status.INVALID, times=2, when=lambda a: a[0] == "agenttasks")
    h.task(task("t").requires("llm"))
    await h.settle()
    assert h.phase("t") == "Pending"
    until = h.record("t").unwritable_until
    await h.advance(350)  # a resync (every 300 s) on the way
    await h.advance(until - h.clock.monotonic() + 0.5)
    assert h.phase("t") == "Assigned", h.status("t")


@run
async def test_a_claim_refused_for_good_is_judged_again_when_its_pause_ends() -> None:
    """The same pause for a claim set no timer for its end: the claim (here, its holder
    died meanwhile) was judged again only at the next resync, up to 5 minutes late."""
    h = Harness()
    await h.running(task("t").requires("llm").lease(30), lease_seconds=100_000)
    h.kube.inject("patch_status", Status.INVALID, times=2, when=lambda a: a[0] == "agenttasks")
    h.renew("t", progress="step 1")  # its copy into status is refused for good
    await h.settle()
    until = h.record("t").unwritable_until
    await h.advance(350)  # a resync (every 300 s): still not to be written
    await h.advance(until - h.clock.monotonic() + 0.5)  # the holder died long ago
    assert h.phase("t") == "Pending", h.status("t")


@run
async def test_a_worker_deleted_while_its_claims_expiry_is_written_leaves_nothing_behind() -> None:
    """A claim's expiry marks its worker suspect when the write is done; a worker deleted
    while that write was in flight was remembered as suspect for good (a leak per
    deleted worker)."""
    h = Harness()
    await h.running(task("t").requires("llm").lease(3))
    gate = asyncio.Event()
    h.kube.inject("patch_status", Held(gate), when=lambda a: a[0] == "agenttasks")
    h.clock.advance(3.5)  # the holder is dead: the expiry is decided, its write held
    await h.steps(20)
    h.kube.remove("agentworkers", NS, "w1")
    gate.set()
    await h.settle()
    assert h.status("t").get("reclaims") == 1
    assert (NS, "w1") not in h.controller.store.workers, "nothing is left of it"


@run
async def test_a_finished_tasks_lease_changed_while_its_delete_was_in_flight_is_deleted() -> None:
    """The Lease of a finished attempt is deleted with a precondition on the version the
    decision saw. When its holder wrote it again while that delete was in flight (a
    renewal just after its report), the change was decided again but the second delete
    was skipped as one was in flight, and the first one's 409 did nothing: the finished
    task kept its record and its Lease, and was never cleaned up after its TTL."""
    h = Harness()
    await h.running(task("t").requires("llm"))
    gate = asyncio.Event()
    h.kube.inject("delete_lease", Held(gate))
    h.report("t", outcome="Succeeded", result={"ok": True})
    await h.steps(20)
    assert h.phase("t") == "Succeeded"
    h.renew("t")  # the holder's renewal, after its report, before the delete
    await h.steps(20)
    gate.set()
    await h.settle()
    await h.advance(2)
    assert h.lease("t") is None, "the finished attempt's Lease is deleted"
    assert (NS, "t") not in h.controller.store.tasks, "no record kept of a settled task"


@run
async def test_a_finished_task_whose_lease_we_deleted_is_let_go_and_deleted_after_its_ttl() -> None:
    """The reply to our own delete of a finished attempt's Lease is recorded from a body
    without labels (``leases.gone``): the store did not see a task Lease go, and kept the
    finished task's record for good when no later write of it let it go: its TTL never
    started (test_task_life's TTL test, in CI)."""
    from agentq.operator.leases import gone

    h = Harness()
    await h.running(task("t").requires("llm").ttl(2))
    store = h.controller.store
    lease = store.lease_of(store.tasks[(NS, "t")].view)
    assert lease is not None
    h.kube.hold_events()  # what follows is not seen by the watch, only recorded here

    def succeed(body: dict[str, Any]) -> None:
        body["status"].update(phase="Succeeded", finishedAt="2026-01-01T00:00:01Z")

    h.kube.edit("agenttasks", NS, "t", succeed)
    # As its commit's reply would: the Succeeded status, the Lease still there.
    store.observe_task(h.kube.get("agenttasks", NS, "t"))
    assert (NS, "t") in store.tasks
    store.observe_lease(gone(store.leases[lease.key].view), deleted=True, now=0.0, wall_age=0.0)
    assert (NS, "t") not in store.tasks, "no record kept of a settled task"
    assert store.changed.finished.get((NS, "t")) is not None, "the cleanup hears of it"
