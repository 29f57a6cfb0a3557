"""Claims across namespaces (docs/tenancy.md, "Cross-namespace claims"): a task of a
team's namespace granted to a worker of the pool namespace its AgentQueue names, on the
in-memory API server. The harness's namespace ``NS`` is the pool; every step ends with
the invariants (``strict``), which judge the lanes, claims, cores and the index of the
Leases in other namespaces again from the records."""

from __future__ import annotations

import json
from typing import Any

from agentq import protocol
from agentq.clock import micro_rfc3339
from agentq.operator.port import KubeError, Status
from builders import queue, task
from harness import NS, Harness, run

TEAM_A, TEAM_B = "team-a", "team-b"


async def fleet(h: Harness, *, slots: int = 2, workers: int = 1) -> None:
    h.namespace(TEAM_A, team="a")
    h.namespace(TEAM_B, team="b")
    h.namespace(NS)
    for i in range(workers):
        h.worker(f"w{i + 1}", "llm", max_in_flight=slots, lease_seconds=100_000)
    h.queue(queue("qa").selects(team="a").workers_in(NS))
    h.queue(queue("qb").selects(team="b").workers_in(NS))
    await h.settle()


def submit(h: Harness, namespace: str, name: str, **extra: Any) -> None:
    builder = task(name).requires("llm").queue("qa" if namespace == TEAM_A else "qb")
    body = builder.namespace(namespace).obj()
    body["spec"].update({"leaseDurationSeconds": 300, **extra})
    h.kube.put("agenttasks", body)


def status(h: Harness, namespace: str, name: str) -> dict[str, Any]:
    body = h.kube.get("agenttasks", namespace, name)
    assert body is not None
    return body.get("status") or {}


def xlease(h: Harness, namespace: str, name: str) -> dict[str, Any] | None:
    return h.kube.get("leases", NS, protocol.cross_task_lease_name(namespace, name))


def renew(h: Harness, namespace: str, name: str) -> None:
    h.clock.advance(0.001)
    h.kube.edit(
        "leases",
        NS,
        protocol.cross_task_lease_name(namespace, name),
        lambda b: b["spec"].__setitem__("renewTime", micro_rfc3339(h.clock.now())),
    )


def report(h: Harness, namespace: str, name: str, **fields: Any) -> None:
    st = status(h, namespace, name)
    body = {"token": st.get("fencingToken"), "worker": st.get("worker"), **fields}
    h.kube.edit(
        "leases",
        NS,
        protocol.cross_task_lease_name(namespace, name),
        lambda b: (
            b["metadata"]
            .setdefault("annotations", {})
            .__setitem__(protocol.ANNOTATION_REPORT, json.dumps(body))
        ),
    )


@run
async def test_tasks_of_two_teams_run_on_the_pool_and_succeed() -> None:
    h = Harness()
    await fleet(h)
    submit(h, TEAM_A, "a1")
    submit(h, TEAM_B, "b1")
    await h.settle()
    for namespace, name in [(TEAM_A, "a1"), (TEAM_B, "b1")]:
        st = status(h, namespace, name)
        assert st["phase"] == "Assigned"
        assert (st["worker"], st["workerNamespace"]) == ("w1", NS)
        assert st["leaseName"] == protocol.cross_task_lease_name(namespace, name)
        lease = xlease(h, namespace, name)
        assert lease is not None
        labels = lease["metadata"]["labels"]
        assert labels[protocol.LABEL_TASK_NAMESPACE] == namespace
        assert labels[protocol.LABEL_TASK] == name
        assert labels[protocol.LABEL_WORKER] == "w1"
        assert not lease["metadata"].get("ownerReferences")  # cannot cross namespaces
        assert lease["spec"]["holderIdentity"] == "w1"
        # Nothing in the team's own namespace.
        assert h.kube.get("leases", namespace, protocol.task_lease_name(name)) is None
    await h.run_for(31, step=5)  # the worker's counts are written within 30 s
    assert sorted(h.worker_status("w1")["assignedTasks"]) == ["team-a/a1", "team-b/b1"]
    # The claim API's lookup knows the current claims, and nothing else.
    ref = h.controller.claim_ref(NS, protocol.cross_task_lease_name(TEAM_A, "a1"))
    assert ref is not None
    assert (ref.task_namespace, ref.task_name, ref.worker) == (TEAM_A, "a1", "w1")
    assert ref.token == status(h, TEAM_A, "a1")["fencingToken"]
    assert h.controller.claim_ref(TEAM_A, protocol.cross_task_lease_name(TEAM_A, "a1")) is None
    assert h.controller.claim_ref(NS, protocol.task_lease_name("a1")) is None
    # The holder runs both and reports: Succeeded, the Leases deleted by the operator.
    for namespace, name in [(TEAM_A, "a1"), (TEAM_B, "b1")]:
        renew(h, namespace, name)
        await h.settle()
        assert status(h, namespace, name)["phase"] == "Running"
        report(h, namespace, name, outcome="Succeeded", result={"ok": name})
    await h.settle()
    for namespace, name in [(TEAM_A, "a1"), (TEAM_B, "b1")]:
        st = status(h, namespace, name)
        assert st["phase"] == "Succeeded"
        assert (st["worker"], st["workerNamespace"]) == ("w1", NS)  # kept with worker
        assert xlease(h, namespace, name) is None
    assert h.controller.claim_ref(NS, protocol.cross_task_lease_name(TEAM_A, "a1")) is None
    await h.run_for(31, step=5)
    assert not h.worker_status("w1").get("assignedTasks")
    assert h.controller.cores.loaded == {}


@run
async def test_the_lookup_names_the_pod_that_owns_a_pool_worker() -> None:
    """A pool's per-pod worker (docs/autoscaling.md) is owned by its pod: the claim
    API's lookup says which, so only that pod's token reads the worker's claims; a
    worker no pod owns says none, and an owner changed (by a person) is followed."""
    h = Harness()
    await fleet(h)
    h.kube.edit(
        "agentworkers",
        NS,
        "w1",
        lambda b: b["metadata"].__setitem__(
            "ownerReferences",
            [{"apiVersion": "v1", "kind": "Pod", "name": "w1", "uid": "pod-uid-1"}],
        ),
    )
    submit(h, TEAM_A, "a1")
    await h.settle()
    lease = protocol.cross_task_lease_name(TEAM_A, "a1")
    ref = h.controller.claim_ref(NS, lease)
    assert ref is not None and (ref.worker, ref.worker_pod_uid) == ("w1", "pod-uid-1")
    h.kube.edit("agentworkers", NS, "w1", lambda b: b["metadata"].pop("ownerReferences"))
    await h.settle()
    ref = h.controller.claim_ref(NS, lease)
    assert ref is not None and ref.worker_pod_uid is None


@run
async def test_a_task_whose_claim_lease_name_would_not_fit_is_held_and_says_why() -> None:
    """A task named past the CRD's 63 characters (its rule bypassed: an older CRD, a
    copy without it) would get a shortened Lease name across namespaces that names no
    task (``Store.xleases`` and the sidecar read the task from the name): it is never
    granted, and its condition says why; a long-named task whose queue's workers are
    in its own namespace is not affected (its Lease is owned by it)."""
    h = Harness()
    await fleet(h)
    h.queue(queue("qpool").selects().workers_in(NS))
    long_name = "t" * (253 - len(protocol.XTASK_LEASE_PREFIX) - len(TEAM_A))  # 1 too many
    assert not protocol.cross_task_lease_fits(TEAM_A, long_name)
    assert protocol.cross_task_lease_fits(TEAM_A, long_name[:-1])
    assert protocol.cross_task_lease_fits("n" * 63, "t" * 63)  # what the CRDs admit
    submit(h, TEAM_A, long_name)
    submit(h, TEAM_A, "a1")
    h.kube.put(
        "agenttasks",
        task("x" * 250).requires("llm").queue("qpool").namespace(NS).obj(),
    )
    await h.settle()
    st = status(h, TEAM_A, long_name)
    assert st.get("phase", "Pending") == "Pending" and not st.get("worker"), st
    (cond,) = [c for c in st.get("conditions") or [] if c["type"] == "Queued"]
    assert (cond["status"], cond["reason"]) == ("False", "TaskNameTooLong"), cond
    assert "253" in cond["message"]
    assert status(h, TEAM_A, "a1")["phase"] == "Assigned"
    assert status(h, NS, "x" * 250)["phase"] == "Assigned"
    assert not [key for key in h.controller.store.xleases if key == (TEAM_A, long_name)]


@run
async def test_a_foreign_claim_whose_holder_stops_renewing_is_reclaimed() -> None:
    h = Harness()
    await fleet(h, slots=1, workers=2)
    submit(h, TEAM_A, "a1", leaseDurationSeconds=10)
    await h.settle()
    first = status(h, TEAM_A, "a1")
    assert first["phase"] == "Assigned"
    h.clock.advance(11)  # no renewal: the claim expires
    await h.settle()
    again = status(h, TEAM_A, "a1")
    assert again["reclaims"] == 1
    # Granted again at once, to the other worker (a re-dispatch avoids the failed one).
    assert again["phase"] == "Assigned"
    assert again["worker"] != first["worker"]
    assert again["workerNamespace"] == NS
    assert again["fencingToken"] > first["fencingToken"]
    lease = xlease(h, TEAM_A, "a1")
    assert lease is not None
    assert lease["spec"]["holderIdentity"] == again["worker"]


@run
async def test_deleting_a_foreign_task_deletes_its_lease() -> None:
    h = Harness()
    await fleet(h)
    submit(h, TEAM_A, "a1")
    await h.settle()
    assert xlease(h, TEAM_A, "a1") is not None
    h.kube.remove("agenttasks", TEAM_A, "a1")  # no owner reference: no collector
    await h.settle()
    assert xlease(h, TEAM_A, "a1") is None
    assert h.controller.store.xleases == {}
    assert h.controller.cores.loaded == {}


@run
async def test_an_orphan_lease_found_after_a_rebuild_is_checked_with_one_read() -> None:
    h = Harness()
    await fleet(h)
    submit(h, TEAM_A, "a1")
    await h.settle()
    # The operator did not see the task go (it was away): its Lease is an orphan.
    with_lease = xlease(h, TEAM_A, "a1")
    assert with_lease is not None
    h.kube.objects.pop(("agenttasks", TEAM_A, "a1"))
    reads = h.kube.calls["get_task"]
    h.controller.follower.rebuild(urgent=False)  # a resync: the store still holds the task
    await h.settle()
    assert xlease(h, TEAM_A, "a1") is not None  # in the store: not judged
    # A Lease whose task the store never saw (the watch ran ahead, or a relist) is read.
    h.controller.store.tasks.pop((TEAM_A, "a1"))
    h.controller.indexes.rebuild(h.controller.store)
    h.controller.cores.rebuild()
    h.controller.follower.rebuild(urgent=False)
    await h.settle()
    assert h.kube.calls["get_task"] == reads + 1
    assert xlease(h, TEAM_A, "a1") is None


@run
async def test_a_task_of_the_pool_and_foreign_tasks_share_the_workers() -> None:
    h = Harness()
    await fleet(h, slots=3)
    h.queue(queue("qp").selects().workers_in(NS))
    h.task(task("p1").requires("llm").queue("qp"))
    submit(h, TEAM_A, "a1")
    submit(h, TEAM_B, "b1")
    submit(h, TEAM_B, "b2")  # no room: waits in the pool's lane of qb
    await h.settle()
    assert h.phase("p1") == "Assigned"
    assert h.lease("p1") is not None  # the pool's own task: as ever
    assert h.status("p1").get("workerNamespace") is None
    assigned = [n for n in ("b1", "b2") if status(h, TEAM_B, n)["phase"] == "Assigned"]
    assert len(assigned) == 1  # three slots: p1, a1 and one of team-b's
    await h.run_for(31, step=5, renew=("p1",))
    assert sorted(h.worker_status("w1")["assignedTasks"]) == [
        "p1",
        "team-a/a1",
        f"team-b/{assigned[0]}",
    ]


@run
async def test_an_operator_confined_to_some_namespaces_says_namespace_not_watched() -> None:
    h = Harness(namespaces=(TEAM_A,))
    await fleet(h)
    submit(h, TEAM_A, "a1")
    await h.settle()
    st = status(h, TEAM_A, "a1")
    queued = next(c for c in st["conditions"] if c["type"] == "Queued")
    assert (queued["status"], queued["reason"]) == ("False", "NamespaceNotWatched")
    assert st["phase"] == "Pending"


@run
async def test_a_new_leader_rebuilds_foreign_claims_from_the_records() -> None:
    h = Harness()
    await fleet(h, slots=2)
    submit(h, TEAM_A, "a1")
    submit(h, TEAM_B, "b1")
    await h.settle()
    core = h.controller.cores.of(NS)
    held = core.holds()
    assert held == {"team-a~a1": "w1", "team-b~b1": "w1"}
    # Leadership lost and taken again: every index and core rebuilt from the records
    # (the invariants check each step), the foreign claims loaded where their worker is.
    h.controller.set_leading(False)
    h.controller.set_leading(True)
    await h.settle()
    assert h.controller.cores.of(NS).holds() == held
    assert h.controller.cores.loaded == {(TEAM_A, "a1"): NS, (TEAM_B, "b1"): NS}
    # The holder finishes one: released from the pool's core, its cost served.
    renew(h, TEAM_A, "a1")
    await h.settle()
    report(h, TEAM_A, "a1", outcome="Succeeded", result={})
    await h.settle()
    assert status(h, TEAM_A, "a1")["phase"] == "Succeeded"
    assert h.controller.cores.of(NS).holds() == {"team-b~b1": "w1"}
    assert h.controller.cores.of(NS).worker_state("w1").served_cost == 1
    assert (TEAM_A, "a1") not in h.controller.cores.loaded


@run
async def test_a_worker_that_leaves_hands_back_its_foreign_claims() -> None:
    h = Harness()
    await fleet(h, slots=2)
    submit(h, TEAM_A, "a1")
    await h.settle()
    assert h.controller.cores.loaded == {(TEAM_A, "a1"): NS}
    h.kube.remove("agentworkers", NS, "w1")  # its claims decided again, from the pool's core
    await h.settle()
    assert h.controller.cores.loaded == {}
    assert status(h, TEAM_A, "a1")["phase"] in ("Assigned", "Running")  # its Lease decides


@run
async def test_a_foreign_grant_of_unknown_outcome_holds_its_slot_in_the_pools_core() -> None:
    h = Harness()
    await fleet(h, slots=1)
    # The grant's status write lands, but its answer is lost (a timeout).
    tasks = lambda args: args[0] == "agenttasks"  # noqa: E731
    h.kube.inject("patch_status", KubeError("timed out"), applied=True, when=tasks)
    submit(h, TEAM_A, "a1")
    await h.settle()
    st = status(h, TEAM_A, "a1")
    assert (st["phase"], st["workerNamespace"]) == ("Assigned", NS)
    # The newer view of the task said it landed: loaded in the pool's core, its Lease made.
    assert h.controller.cores.of(NS).holds() == {"team-a~a1": "w1"}
    assert h.controller.cores.loaded == {(TEAM_A, "a1"): NS}
    assert xlease(h, TEAM_A, "a1") is not None
    # A grant lost before it landed gives the slot back (the pool's core, not the team's).
    submit(h, TEAM_B, "b1")
    h.kube.inject("patch_status", KubeError("timed out"), when=tasks)
    h.kube.edit("agentworkers", NS, "w1", lambda b: b["spec"].__setitem__("maxInFlight", 2))
    await h.settle()
    await h.advance(31)  # the doubt's end: the slot back, granted again
    assert h.controller.stats.unknown == 2
    assert status(h, TEAM_B, "b1")["phase"] == "Assigned"
    assert h.controller.cores.of(NS).holds() == {"team-a~a1": "w1", "team-b~b1": "w1"}


def forge(h: Harness, namespace: str, name: str, **annotations: str) -> None:
    """A Lease named like a claim's, created by someone else in ``namespace``."""
    h.kube.put(
        "leases",
        {
            "metadata": {
                "name": name,
                "namespace": namespace,
                "labels": {protocol.LABEL_LEASE_KIND: protocol.LEASE_KIND_TASK},
                "annotations": annotations,
            },
            "spec": {"holderIdentity": "mallory"},
        },
    )


@run
async def test_a_forged_lease_in_another_namespace_is_not_the_claims() -> None:
    h = Harness()
    await fleet(h)
    submit(h, TEAM_A, "a1")
    await h.settle()
    first = status(h, TEAM_A, "a1")
    assert first["phase"] == "Assigned"
    # A user of team-b names a Lease of its own namespace after team-a's claim.
    forged = protocol.cross_task_lease_name(TEAM_A, "a1")
    forge(h, TEAM_B, forged)
    await h.settle()
    renew(h, TEAM_A, "a1")
    await h.settle()
    st = status(h, TEAM_A, "a1")
    # The attempt goes on: not failed as LeaseTampered, no second grant.
    assert (st["phase"], st["fencingToken"]) == ("Running", first["fencingToken"])
    assert not st.get("reclaims")
    assert xlease(h, TEAM_A, "a1") is not None
    assert h.kube.get("leases", TEAM_B, forged) is not None  # not ours to delete
    # The real Lease is still the claim's: a report on it ends the task, and it is deleted.
    report(h, TEAM_A, "a1", outcome="Succeeded", result={})
    await h.settle()
    assert status(h, TEAM_A, "a1")["phase"] == "Succeeded"
    assert xlease(h, TEAM_A, "a1") is None


@run
async def test_a_forged_cross_lease_is_never_a_same_namespace_claims() -> None:
    h = Harness()
    await fleet(h)
    h.queue(queue("qp").selects().workers_in(NS))
    h.task(task("p1").requires("llm").queue("qp"))
    await h.settle()
    assert h.phase("p1") == "Assigned"
    token = h.status("p1")["fencingToken"]
    # Its own Lease goes (someone deleted it), and a Lease named as if p1 were a task
    # of another namespace's claim appears in team-b.
    h.kube.hold_events()
    h.kube.remove("leases", NS, protocol.task_lease_name("p1"))
    forge(h, TEAM_B, protocol.cross_task_lease_name(NS, "p1"))
    h.kube.deliver()
    await h.settle()
    # The grant's Lease is written again (as for any missing Lease), nothing failed.
    assert h.phase("p1") == "Assigned"
    assert h.status("p1")["fencingToken"] == token
    assert not h.status("p1").get("reclaims")
    assert h.lease("p1") is not None
    assert h.kube.get("leases", TEAM_B, protocol.cross_task_lease_name(NS, "p1")) is not None


@run
async def test_the_index_of_cross_leases_keeps_every_lease_of_a_task() -> None:
    h = Harness()
    await fleet(h)
    submit(h, TEAM_A, "a1")
    await h.settle()
    name = protocol.cross_task_lease_name(TEAM_A, "a1")
    forge(h, TEAM_B, name)
    await h.settle()
    assert h.controller.store.xleases == {(TEAM_A, "a1"): {(NS, name), (TEAM_B, name)}}
    h.kube.remove("leases", TEAM_B, name)  # the forger's goes: the real one still indexed
    await h.settle()
    assert h.controller.store.xleases == {(TEAM_A, "a1"): {(NS, name)}}
    # Deleting the task deletes its claim's Lease.
    h.kube.remove("agenttasks", TEAM_A, "a1")
    await h.settle()
    assert xlease(h, TEAM_A, "a1") is None
    assert h.controller.store.xleases == {}


@run
async def test_an_earlier_claims_lease_is_deleted_after_the_reclaim_but_no_forgery() -> None:
    h = Harness()
    await fleet(h, slots=1)
    submit(h, TEAM_A, "a1", leaseDurationSeconds=10)
    await h.settle()
    name = protocol.cross_task_lease_name(TEAM_A, "a1")
    forge(h, TEAM_B, name)  # no UID of the task: never taken for its Lease
    # The reclaim's delete of the expired claim's Lease finds it changed (409): the task,
    # Pending now with no workerNamespace, still finds it by its name and UID.
    h.kube.inject("delete_lease", Status.CONFLICT, when=lambda args: args[0] == NS)
    h.kube.hold_events()
    h.kube.remove("agentworkers", NS, "w1")  # no worker to grant it again to
    h.clock.advance(11)
    h.kube.deliver()
    await h.settle()
    await h.advance(5)
    st = status(h, TEAM_A, "a1")
    assert (st["phase"], st.get("workerNamespace")) == ("Pending", None)
    assert st["reclaims"] == 1
    assert h.kube.calls["delete_lease"] == 2  # refused once, then deleted
    assert xlease(h, TEAM_A, "a1") is None
    assert h.kube.get("leases", TEAM_B, name) is not None


def in_pool(args: tuple[Any, ...]) -> bool:
    return bool(args[0] == NS)


@run
async def test_a_claim_whose_pool_namespace_is_terminating_is_reclaimed() -> None:
    h = Harness()
    await fleet(h, slots=1)
    submit(h, TEAM_A, "a1", leaseDurationSeconds=10)
    await h.settle()
    assert status(h, TEAM_A, "a1")["phase"] == "Assigned"
    # The pool namespace is deleted: its contents go, and nothing new may be created in
    # it (403 "being terminated") -- the grant's Lease cannot be written again.
    h.kube.inject("create_lease", Status.FORBIDDEN, times=10_000, when=in_pool)
    h.kube.remove("agentworkers", NS, "w1")
    h.kube.remove("leases", NS, protocol.worker_lease_name("w1"))
    h.kube.remove("leases", NS, protocol.cross_task_lease_name(TEAM_A, "a1"))
    await h.settle()
    assert status(h, TEAM_A, "a1")["phase"] == "Assigned"  # the write is tried again
    await h.run_for(12, step=1)
    st = status(h, TEAM_A, "a1")
    # As an expired claim: the attempt failed and counted, the task queued again.
    assert (st["phase"], st["reclaims"]) == ("Pending", 1)
    assert st["error"]["reason"] == "LeaseUnwritable"
    assert "LeaseUnwritable" in h.kube.reasons("a1")
    calls = h.kube.calls["create_lease"]
    await h.run_for(120, step=10)
    assert h.kube.calls["create_lease"] == calls  # no retry loop once reclaimed


@run
async def test_a_claim_whose_pool_namespace_is_gone_is_reclaimed_and_granted_again() -> None:
    h = Harness()
    await fleet(h, slots=1, workers=2)
    submit(h, TEAM_A, "a1", leaseDurationSeconds=10)
    await h.settle()
    first = status(h, TEAM_A, "a1")
    # The Lease goes and its re-create answers 404: the namespace is not found.
    h.kube.inject("create_lease", Status.GONE, times=100, when=in_pool)
    h.kube.remove("leases", NS, protocol.cross_task_lease_name(TEAM_A, "a1"))
    await h.settle()
    assert status(h, TEAM_A, "a1")["phase"] == "Assigned"
    await h.run_for(12, step=1)
    st = status(h, TEAM_A, "a1")
    assert st["reclaims"] == 1
    assert st["history"][-1]["reason"] == "LeaseUnwritable"
    assert st["fencingToken"] > first["fencingToken"]


@run
async def test_an_expired_foreign_claim_makes_the_pool_worker_suspect() -> None:
    h = Harness()
    await fleet(h, slots=1)
    # A worker of the team's own namespace with the pool worker's name.
    h.kube.put(
        "agentworkers",
        {
            "metadata": {"name": "w1", "namespace": TEAM_A},
            "spec": {"capabilities": ["llm"], "maxInFlight": 1, "weight": 1.0},
        },
    )
    submit(h, TEAM_A, "a1", leaseDurationSeconds=10)
    await h.settle()
    assert status(h, TEAM_A, "a1")["worker"] == "w1"
    h.clock.advance(11)  # the claim expires: its holder, the pool's w1, is suspect
    await h.settle()
    workers = h.controller.store.workers
    assert workers[(NS, "w1")].suspect_since is not None
    assert workers[(TEAM_A, "w1")].suspect_since is None
    st = status(h, TEAM_A, "a1")
    assert (st["phase"], st["reclaims"]) == ("Pending", 1)  # not granted to it again yet
    h.kube.remove("agentworkers", TEAM_A, "w1")  # (its metric series go with it)
    await h.settle()


@run
async def test_the_oldest_pending_gauge_counts_foreign_tasks() -> None:
    from prometheus_client import REGISTRY

    h = Harness()
    await fleet(h, slots=1)
    submit(h, TEAM_A, "a1")
    submit(h, TEAM_A, "a2")  # no room: waits in the pool's lane
    await h.run_for(20, step=2)
    age = REGISTRY.get_sample_value(
        "agentq_oldest_pending_age_seconds", {"namespace": NS, "capabilities": "llm"}
    )
    assert age is not None and age >= 15


class OldLanesLast(set):  # type: ignore[type-arg]
    """A set of lanes that yields the pool's last: the order a hash may give."""

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(sorted(super().__iter__(), key=lambda lane: lane[0] == NS))


@run
async def test_a_queue_whose_worker_namespace_changes_keeps_its_pending_count() -> None:
    h = Harness()
    await fleet(h, slots=1)
    submit(h, TEAM_A, "a1")
    submit(h, TEAM_A, "a2")  # no room: waits in the pool's lane of qa
    await h.settle()
    queue_index = h.controller.indexes.queue
    queue_index.touched = OldLanesLast(queue_index.touched)
    # The queue's workers move to another namespace: a2 moves to that lane. The old
    # lane's count (0), applied after the new one's, must not stall the queue (the
    # invariants compare the tree's count with its lane's after every step).
    h.namespace("pool2")
    h.queue(queue("qa").selects(team="a").workers_in("pool2"))
    await h.settle()
    tree = h.controller.cores.queues.tree
    assert tree.queue_state("qa").pending == 1


@run
async def test_a_lease_naming_a_namespace_we_may_not_read_is_asked_about_once() -> None:
    h = Harness()
    await fleet(h)
    name = protocol.cross_task_lease_name("secret", "t1")
    forge(h, TEAM_B, name, **{protocol.ANNOTATION_TASK_UID: "u"})
    await h.settle()
    secret = lambda args: args[0] == "secret"  # noqa: E731
    h.kube.inject("get_task", Status.FORBIDDEN, times=100, when=secret)
    reads = h.kube.calls["get_task"]
    for _ in range(3):  # resyncs
        h.controller.follower.rebuild(urgent=False)
        await h.settle()
    assert h.kube.calls["get_task"] == reads + 1
    # The Lease changes: judged again, once.
    h.kube.edit("leases", TEAM_B, name, lambda b: b["spec"].__setitem__("holderIdentity", "x"))
    await h.settle()
    for _ in range(2):
        h.controller.follower.rebuild(urgent=False)
        await h.settle()
    assert h.kube.calls["get_task"] == reads + 2
    assert h.kube.get("leases", TEAM_B, name) is not None


@run
async def test_a_forged_lease_of_a_finished_task_is_left_until_the_task_goes() -> None:
    h = Harness()
    await fleet(h)
    submit(h, TEAM_A, "a1")
    await h.settle()
    renew(h, TEAM_A, "a1")
    await h.settle()
    report(h, TEAM_A, "a1", outcome="Succeeded", result={})
    await h.settle()
    assert status(h, TEAM_A, "a1")["phase"] == "Succeeded"
    assert (TEAM_A, "a1") not in h.controller.store.tasks  # settled: no record kept
    name = protocol.cross_task_lease_name(TEAM_A, "a1")
    forge(h, TEAM_B, name)  # names a task that is there (finished): not ours to delete
    await h.settle()
    assert h.kube.get("leases", TEAM_B, name) is not None
    h.kube.remove("agenttasks", TEAM_A, "a1")  # the task is gone: so is every agentq
    await h.settle()  # Lease named after it
    assert h.kube.get("leases", TEAM_B, name) is None
