"""The controller loop against the in-memory API server: what it writes, and what it does not.

Each test drives real decisions through the ``Kube`` port with a fake clock; faults
(409, 404, lost replies) are injected into single calls.
"""

from __future__ import annotations

from agentq import protocol
from agentq.operator.port import KubeError, Status
from builders import task
from harness import NS, Harness, run


@run
async def test_a_grant_is_three_writes_and_renewals_are_none() -> None:
    h = Harness()
    h.worker("w1", "llm")
    h.worker("w2", "gpu")
    for i in range(10):
        h.task(task(f"t{i}").requires("llm"))
    h.task(task("g").requires("gpu"))
    await h.settle()
    assert all(h.status(f"t{i}")["worker"] == "w1" for i in range(10))
    assert h.status("g")["worker"] == "w2"
    writes = dict(h.kube.writes)
    # One status CAS, one Lease create, one Event per grant (+ a token block, + worker status).
    assert writes["agenttasks/status PATCH"] == 11
    assert writes["leases POST"] == 11 + 1
    assert writes["events POST"] == 11
    assert writes.get("agentworkers/status PATCH", 0) <= 2

    h.clock.advance(0.5)
    for i in range(10):
        h.renew(f"t{i}")  # first renewal: Running
    await h.settle()
    assert all(h.phase(f"t{i}") == "Running" for i in range(10))
    before = dict(h.kube.writes)
    decisions = h.controller.stats.decisions
    for _ in range(20):
        h.clock.advance(1)
        for i in range(10):
            h.renew(f"t{i}")
        await h.settle()
    assert {k: v for k, v in h.kube.writes.items() if k != "agentworkers/status PATCH"} == {
        k: v for k, v in before.items() if k != "agentworkers/status PATCH"
    }, "a renewal must cost the operator no write"
    assert h.controller.stats.decisions == decisions, "nor a decision"
    assert all(h.phase(f"t{i}") == "Running" for i in range(10))


@run
async def test_a_renewal_that_moves_progress_is_copied_at_most_every_interval() -> None:
    h = Harness(progress_status_interval=10.0)
    h.worker("w1", "llm")
    h.task(task("t").requires("llm"))
    await h.advance(0.5)
    h.renew("t", progress="p0")
    await h.settle()
    assert h.status("t")["progress"] == "p0"
    patches = h.kube.writes["agenttasks/status PATCH"]
    for i in range(1, 20):
        await h.advance(1)
        h.renew("t", progress=f"p{i}")
        await h.settle()
    # 19 changes of progress in 19 s: copied at most twice more.
    assert h.kube.writes["agenttasks/status PATCH"] - patches <= 2
    await h.advance(10)
    assert h.status("t")["progress"] == "p19"


@run
async def test_a_lost_race_on_a_grant_gives_the_decision_back() -> None:
    h = Harness()
    h.worker("w1", "llm", max_in_flight=1)
    h.kube.inject("patch_status", Status.CONFLICT, when=lambda a: a[0] == "agenttasks")
    h.task(task("t").requires("llm"))
    await h.settle()
    assert h.status("t").get("worker") is None
    assert h.controller.stats.conflicts == 1
    scheduler = h.core()
    assert scheduler.worker_state("w1").in_flight == 0, "the aborted grant left no load"
    h.kube.edit("agenttasks", NS, "t", lambda b: b["metadata"].setdefault("labels", {}))
    await h.settle()  # the next event about the task decides again
    assert h.status("t")["worker"] == "w1"
    assert len([n for (p, _, n) in h.kube.objects if p == "leases" and "task" in n]) == 1


@run
async def test_a_grant_whose_reply_is_lost_is_finished_from_what_the_watch_shows() -> None:
    h = Harness()
    h.worker("w1", "llm")
    # The status write happens, its reply does not arrive.
    h.kube.inject(
        "patch_status", KubeError("timeout"), applied=True, when=lambda a: a[0] == "agenttasks"
    )
    h.task(task("t").requires("llm"))
    await h.settle()
    status = h.status("t")
    assert status["phase"] == "Assigned" and status["worker"] == "w1"
    lease = h.lease("t")
    assert lease is not None, "the grant's Lease was written from the watch's view"
    assert protocol.lease_token(lease["metadata"]["annotations"]) == status["fencingToken"]
    assert h.core().worker_state("w1").in_flight == 1
    assert h.controller.stats.unknown == 1


@run
async def test_a_lease_create_that_times_out_is_repaired() -> None:
    h = Harness()
    h.worker("w1", "llm")
    h.kube.inject("create_lease", KubeError("timeout"), when=lambda a: "task" in str(a[1]))
    h.task(task("t").requires("llm"))
    await h.settle()
    assert h.controller.stats.unknown == 1
    # Decided again on the status the grant wrote: the Lease is missing, so it is written.
    lease = h.lease("t")
    assert lease is not None and lease["spec"]["holderIdentity"] == "w1"
    assert h.kube.calls["create_lease"] == 3  # token block, the lost one, the repair


@run
async def test_a_task_deleted_while_its_grant_is_written_gets_no_lease() -> None:
    h = Harness()
    h.worker("w1", "llm")
    h.kube.inject("patch_status", Status.GONE, when=lambda a: a[0] == "agenttasks")
    h.task(task("t").requires("llm"))
    await h.settle()
    assert h.lease("t") is None
    assert h.core().worker_state("w1").in_flight == 0


@run
async def test_reclaims_confirm_with_a_read_and_a_stalled_watch_reclaims_nothing() -> None:
    h = Harness()
    h.worker("w1", "llm", lease_seconds=1000)
    for i in range(5):
        h.task(task(f"t{i}").requires("llm").lease(10))
    await h.advance(0.5)
    for i in range(5):
        h.renew(f"t{i}")
    await h.settle()
    # The watch stalls; the holders keep renewing; the operator sees nothing for 15 s.
    h.kube.hold_events()
    for _ in range(30):
        h.clock.advance(0.5)
        for i in range(5):
            h.renew(f"t{i}")
        await h.settle()
    assert all(h.phase(f"t{i}") == "Running" for i in range(5))
    assert h.controller.stats.confirm_reads >= 5
    assert h.controller.stats.expiries_dropped >= 5
    h.kube.deliver()
    await h.settle()
    assert all(h.status(f"t{i}").get("reclaims", 0) == 0 for i in range(5))


@run
async def test_a_stalled_operator_gives_leases_the_stalled_time_back() -> None:
    h = Harness()
    h.worker("w1", "llm", lease_seconds=1000)
    h.task(task("t").requires("llm").lease(3))
    await h.advance(0.5)
    h.renew("t")
    await h.settle()
    h.clock.advance(8)  # SIGSTOP for 8 s: nothing observed, nothing decided
    h.controller.note_stall(8)
    h.renew("t")  # the renewals made meanwhile arrive now
    await h.settle()
    assert h.phase("t") == "Running"
    assert h.controller.stats.confirm_reads == 0, "nothing even looked expired"
    await h.advance(3.5)  # and a holder that really stopped is still reclaimed
    assert h.phase("t") == "Pending" and h.status("t")["reclaims"] == 1


@run
async def test_no_expiry_is_judged_while_a_watch_is_down() -> None:
    from agentq.operator.health import WatchHealth

    health = WatchHealth(["leases"])
    health.set("leases", True)
    h = Harness(health=health)
    h.worker("w1", "llm", lease_seconds=1000)
    h.task(task("t").requires("llm").lease(3))
    await h.advance(0.5)
    h.renew("t")
    await h.settle()
    health.set("leases", False)
    await h.advance(10)
    assert h.phase("t") == "Running", "expiry judged on a watch that was down"
    health.set("leases", True)
    await h.settle()
    assert h.phase("t") == "Pending", "once current again, a dead holder is reclaimed"


@run
async def test_expiry_is_judged_by_the_tasks_lease_duration_not_the_leases_own() -> None:
    h = Harness()
    h.worker("w1", "llm", lease_seconds=1000)
    h.task(task("t").requires("llm").lease(5))
    await h.settle()
    h.kube.edit(
        "leases",
        NS,
        protocol.task_lease_name("t"),
        lambda b: b["spec"].__setitem__("leaseDurationSeconds", 86400),
    )
    await h.advance(0.5)
    h.renew("t")
    await h.settle()
    await h.advance(5.5)
    assert h.status("t")["reclaims"] == 1


@run
async def test_a_lease_replace_that_loses_a_race_is_retried_as_a_clean_create() -> None:
    """A replace answered 409 is retried as a create: without the resourceVersion the
    replace carried (the API server answers such a create with a 500)."""
    from agentq import views

    h = Harness()
    h.worker("w1", "llm", lease_seconds=1000)
    h.task(task("t").requires("llm"))
    await h.settle()
    old = h.lease("t")
    assert old is not None
    old["metadata"]["annotations"][protocol.ANNOTATION_TOKEN] = "0"  # not a token we wrote
    stale = views.lease_view(old)
    h.kube.remove("leases", NS, protocol.task_lease_name("t"))
    h.kube.inject("replace_lease", Status.CONFLICT)
    created: list[dict] = []
    original = h.kube.create_lease

    async def create(namespace: str, body: dict) -> object:
        created.append(dict(body["metadata"]))
        return await original(namespace, body)

    h.kube.create_lease = create  # type: ignore[method-assign]
    task_view = h.record("t").view
    await h.controller.leases.write_grant(task_view, stale)
    assert created and all("resourceVersion" not in meta for meta in created)
    assert h.lease("t") is not None


@run
async def test_a_worker_status_write_lost_to_an_api_server_outage_is_written_again() -> None:
    h = Harness()
    h.kube.inject(
        "patch_status", KubeError("connection refused"), when=lambda a: a[0] == "agentworkers"
    )
    h.worker("w1", "llm")
    await h.settle()
    assert h.kube.calls["patch_status"] >= 1 and not h.worker_status("w1")
    await h.run_for(h.config.worker_status_interval + 2)
    assert h.worker_status("w1").get("phase") == "Ready"
