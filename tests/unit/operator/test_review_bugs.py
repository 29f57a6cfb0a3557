"""One test per bug of issue 9's review list, on the in-memory API server.

Each names the bug it pins down; each fails on the controller as it was.
"""

from __future__ import annotations

import asyncio

import pytest

from agentq import protocol
from agentq.operator import metrics
from agentq.operator.config import OperatorConfig
from agentq.operator.fake import Hang
from agentq.operator.leader import LeaderElector
from agentq.operator.port import Status
from builders import task
from harness import NS, Harness, run


async def running(h: Harness, name: str, builder: object) -> None:
    h.task(builder)  # type: ignore[arg-type]
    await h.settle()
    h.renew(name)
    await h.settle()
    assert h.phase(name) == "Running"


@run
async def test_a_conflicting_commit_does_not_restart_the_grace_period() -> None:
    h = Harness()
    h.worker("w1", "llm", lease_seconds=1000)
    await running(h, "t", task("t").requires("llm").lease(3).on_expiry("GracePeriod", grace=5))
    await h.advance(3.1)  # the lease expires: the grace period starts
    assert h.status("t").get("graceUntil")
    grace_events = h.kube.reasons("t").count("LeaseExpired")
    # The commit at the end of the grace period loses a race once.
    h.kube.inject("patch_status", Status.CONFLICT, when=lambda a: a[0] == "agenttasks")
    await h.advance(5.0)
    assert h.phase("t") == "Running"
    h.kube.edit("agenttasks", NS, "t", lambda b: b["metadata"].setdefault("labels", {}))
    await h.settle()  # decided again on the fresh object: the grace period is over
    assert h.phase("t") == "Pending" and h.status("t")["reclaims"] == 1
    assert h.kube.reasons("t").count("LeaseExpired") == grace_events + 1  # no second grace


@run
async def test_a_task_deleted_during_its_grace_period_leaves_nothing_behind() -> None:
    h = Harness()
    h.worker("w1", "llm", lease_seconds=1000)
    await running(h, "t", task("t").requires("llm").lease(3).on_expiry("GracePeriod", grace=60))
    await h.advance(3.1)
    assert h.record("t").grace
    h.delete_task("t")
    await h.settle()  # the ticking clock makes a spinning timer fail here
    assert (NS, "t") not in h.controller.store.tasks
    steps = h.controller.stats.steps
    await h.advance(10)
    assert h.controller.stats.steps - steps < 5, "the loop keeps waking for a deleted task"


@run
async def test_a_wall_clock_stepped_back_does_not_hold_a_retry() -> None:
    h = Harness()
    h.worker("w1", "llm", lease_seconds=1000)
    await running(h, "t", task("t").requires("llm").lease(3).backoff(initial=5, max=5, jitter=0))
    await h.advance(3.1)
    assert h.phase("t") == "Pending" and h.status("t").get("notBefore")
    h.clock.jump_wall(-3600)  # an NTP step back by an hour
    h.renew_worker("w1")  # the worker is alive (else it stays suspect after the expiry)
    await h.advance(4.0)
    assert h.phase("t") == "Pending"
    await h.advance(1.5)
    assert h.phase("t") == "Assigned", "the retry waited for the wall clock"


@run
async def test_tables_are_emptied_when_their_objects_go() -> None:
    h = Harness()
    h.worker("w1", "llm", lease_seconds=1000)
    h.worker("w2", "llm", lease_seconds=1000)
    for i in range(6):
        h.task(task(f"t{i}").requires("llm").lease(3).on_expiry("GracePeriod", grace=30))
    h.task(task("lonely").requires("quantum"))
    await h.settle()
    for i in range(6):
        h.renew(f"t{i}", progress="p")
    h.annotate_lease(
        "t0", protocol.ANNOTATION_REPORT, '{"token": 999, "worker": "w1", "outcome": "Succeeded"}'
    )  # refused
    await h.advance(3.5)  # grace periods, suspect workers
    c = h.controller
    store = c.store
    assert any(t.grace for t in store.tasks.values())
    assert any(w.suspect_since is not None for w in store.workers.values())
    assert any(lease.refused_report for lease in store.leases.values())
    for name in [*(f"t{i}" for i in range(6)), "lonely"]:
        h.delete_task(name)
    for worker in ("w1", "w2"):
        h.kube.remove("agentworkers", NS, worker)
        h.kube.remove("leases", NS, protocol.worker_lease_name(worker))
    await h.settle()
    # One record per object: forgetting an object is one removal, and every index is
    # derived from the records (check_invariants ran after every step above).
    assert len(store) == 0 and store.busy == 0
    assert not c.indexes.claims and len(c.indexes.queue) == 0 and not +c.indexes.phases
    assert not c.indexes.offered
    assert not c.cores.of(NS).holds() and not c.cores.of(NS).workers()
    assert len(store.task_tombstones) <= store.task_tombstones.limit
    ready = {s.labels.get("worker") for m in metrics.WORKER_READY.collect() for s in m.samples}
    assert not {"w1", "w2"} & ready, "series of deleted workers are kept"


@run
async def test_losing_leadership_cancels_the_writes_in_flight() -> None:
    h = Harness()
    h.worker("w1", "llm")
    h.kube.inject("patch_status", Hang(), when=lambda a: a[0] == "agenttasks")
    h.task(task("t").requires("llm"))
    for _ in range(10):  # the first step reserves a block of tokens, a later one grants
        h.controller.step()
        await asyncio.sleep(0.001)
        if h.controller.dispatcher.grants:
            break
    assert h.controller.dispatcher.grants, "a grant is in flight"
    h.controller.set_leading(False)
    await asyncio.sleep(0.01)
    assert not h.controller.writes and not h.controller.dispatcher.grants


def test_a_leader_lease_shorter_than_the_renew_deadline_is_refused() -> None:
    with pytest.raises(ValueError, match="renew deadline"):
        OperatorConfig(leader_lease_seconds=4, leader_renew_seconds=10).check()
    config = OperatorConfig(leader_lease_seconds=4)
    config.check()  # the default deadline follows the lease
    assert config.leader_renew_deadline < 4
    with pytest.raises(ValueError):
        LeaderElector(
            kube=None,  # type: ignore[arg-type]
            clock=None,  # type: ignore[arg-type]
            namespace="ns",
            name="l",
            identity="me",
            lease_seconds=4,
            renew_deadline=10,
            retry_seconds=2,
            on_change=lambda _: None,
        )


@run
async def test_a_leader_round_that_hangs_times_out_and_leadership_is_lost() -> None:
    h = Harness()
    changes: list[bool] = []
    elector = LeaderElector(
        kube=h.kube,
        clock=h.clock,
        namespace=NS,
        name="leader",
        identity="me",
        lease_seconds=0.6,
        renew_deadline=0.4,
        retry_seconds=0.1,
        on_change=changes.append,
    )
    assert await elector.try_acquire_or_renew()
    elector._last_renewed = h.clock.monotonic()
    elector._set(True)
    h.kube.inject("get_lease", Hang(), times=100)
    stop = asyncio.Event()
    runner = asyncio.create_task(elector.run(stop))
    for _ in range(50):
        await asyncio.sleep(0.05)
        h.clock.advance(0.05)
        if changes == [True, False]:
            break
    assert changes == [True, False], "a hung renewal kept the leader leading"
    assert not elector.valid()
    stop.set()
    await asyncio.wait_for(runner, timeout=5)


@run
async def test_tokens_are_unique_across_delete_and_recreate_and_a_lease_is_never_lowered() -> None:
    h = Harness()
    h.worker("w1", "llm", lease_seconds=1000)
    await running(h, "t", task("t").requires("llm").lease(30))
    old = h.status("t")["fencingToken"]
    old_lease = h.lease("t")
    assert old_lease is not None
    # Deleted and re-created; the old Lease lingers (the garbage collector is slow).
    h.kube.remove("agenttasks", NS, "t")
    h.task(task("t").requires("llm").lease(30))
    await h.settle()
    new = h.status("t")
    assert new["fencingToken"] > old
    lease = h.lease("t")
    assert lease is not None
    assert protocol.lease_token(lease["metadata"]["annotations"]) == new["fencingToken"]
    assert (
        lease["metadata"]["annotations"][protocol.ANNOTATION_TASK_UID]
        != old_lease["metadata"]["annotations"][protocol.ANNOTATION_TASK_UID]
    )
    # A Lease with a higher token than the task's is never written down to it.
    h.annotate_lease("t", protocol.ANNOTATION_TOKEN, str(new["fencingToken"] + 50))
    await h.settle()
    assert h.kube.calls["replace_lease"] == 0  # the foreign one was deleted, not rewritten
    assert h.status("t")["error"]["reason"] == "LeaseTampered"


@run
async def test_work_per_event_is_proportional_to_what_changed() -> None:
    h = Harness()
    h.worker("w1", "gpu")
    for i in range(2000):
        h.task(task(f"t{i:04d}").requires("llm"))  # a backlog nobody can take
    await h.settle()
    decisions = h.controller.stats.decisions
    h.task(task("one").requires("gpu"))
    await h.settle()
    assert h.controller.stats.decisions - decisions <= 3
    assert h.phase("one") == "Assigned"
