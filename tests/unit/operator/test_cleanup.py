"""Finished tasks are deleted ttlSecondsAfterFinished after they finished, and the operator
keeps no record of them meanwhile: one small entry each, at most MAX_FINISHED."""

from __future__ import annotations

import asyncio
import gc
import tracemalloc
from typing import Any

from agentq import protocol
from agentq.operator.fake import Hang
from agentq.operator.port import KubeError
from agentq.operator.records import TOMBSTONE_SECONDS
from builders import task
from harness import NS, Harness, run


def finished(name: str, *, at: str = "2026-01-01T00:00:00Z", **spec: Any) -> dict[str, Any]:
    body = task(name).requires("llm").obj()
    body["metadata"]["namespace"] = NS
    body["spec"].update(spec)
    body["status"] = {"phase": "Succeeded", "finishedAt": at, "fencingToken": 1}
    return body


async def drain(h: Harness) -> None:
    """Steps until every delete that is due is made (settle stops after 50 steps)."""
    c = h.controller
    for _ in range(5000):
        c.step()
        if c.writes:
            await asyncio.gather(*list(c.writes), return_exceptions=True)
            continue
        due = c.cleanup.next_due()
        if not c.cleanup.deleting and (due is None or due > h.clock.monotonic()):
            await h.settle()
            return
    raise AssertionError("the cleanup did not drain")


def tasks_left(h: Harness) -> int:
    return sum(1 for (plural, *_) in h.kube.objects if plural == "agenttasks")


@run
async def test_a_finished_task_and_its_lease_go_after_its_ttl() -> None:
    h = Harness()
    await h.running(task("t").requires("llm").lease(30).ttl(60), lease_seconds=100_000)
    h.report("t", outcome="Succeeded", result={"ok": True})
    await h.settle()
    assert h.phase("t") == "Succeeded"
    assert (NS, "t") not in h.controller.store.tasks, "no record of a finished task"
    await h.advance(59)
    assert h.kube.get("agenttasks", NS, "t") is not None
    await h.advance(2)
    assert h.kube.get("agenttasks", NS, "t") is None
    assert h.lease("t") is None
    assert len(h.controller.cleanup) == 0


@run
async def test_the_operator_default_ttl_applies_and_zero_deletes_at_once() -> None:
    h = Harness(ttl_after_finished=100)
    now = h.clock.now().isoformat()
    h.kube.put("agenttasks", finished("default", at=now))
    h.kube.put("agenttasks", finished("zero", at=now, ttlSecondsAfterFinished=0))
    await h.settle()
    assert h.kube.get("agenttasks", NS, "zero") is None
    await h.advance(99)
    assert h.kube.get("agenttasks", NS, "default") is not None
    await h.advance(2)
    assert h.kube.get("agenttasks", NS, "default") is None


@run
async def test_a_task_finished_long_ago_is_deleted_at_once_and_a_clock_step_back_holds_none() -> (
    None
):
    h = Harness(ttl_after_finished=100)
    h.kube.put("agenttasks", finished("old", at="2020-01-01T00:00:00Z"))
    h.clock.jump_wall(-10 * 365 * 86400)  # our wall clock stepped back ten years
    h.kube.put("agenttasks", finished("new", at=h.clock.now().isoformat()))
    h.clock.jump_wall(+10 * 365 * 86400)
    await h.settle()
    assert h.kube.get("agenttasks", NS, "old") is None
    await h.advance(101)
    assert h.kube.get("agenttasks", NS, "new") is None, "held no longer than its TTL"


@run
async def test_a_requeued_task_is_not_deleted_by_its_old_ttl() -> None:
    h = Harness(ttl_after_finished=10)
    h.worker("w1", "llm", lease_seconds=100_000)
    body = finished("t", at=h.clock.now().isoformat())
    body["status"]["phase"] = "Failed"
    h.kube.put("agenttasks", body)
    await h.settle()
    assert len(h.controller.cleanup) == 1
    h.kube.edit(
        "agenttasks",
        NS,
        "t",
        lambda b: (
            b["metadata"]
            .setdefault("annotations", {})
            .__setitem__(protocol.ANNOTATION_REQUEUE, "again")
        ),
    )
    await h.settle()
    assert h.phase("t") == "Assigned"
    await h.run_for(15)
    assert h.kube.get("agenttasks", NS, "t") is not None
    assert len(h.controller.cleanup) == 0


@run
async def test_a_finished_task_changed_since_it_was_seen_is_deleted_as_it_is_now() -> None:
    h = Harness(ttl_after_finished=10)
    h.kube.put("agenttasks", finished("t", at=h.clock.now().isoformat()))
    await h.settle()
    h.kube.hold_events()  # the change is not seen before the delete goes out
    h.kube.edit(
        "agenttasks", NS, "t", lambda b: b["metadata"].setdefault("labels", {}).update(a="b")
    )
    await h.advance(11)
    assert h.kube.get("agenttasks", NS, "t") is not None, "precondition: not what was seen"
    h.kube.deliver()
    await h.advance(1)
    assert h.kube.get("agenttasks", NS, "t") is None


@run
async def test_more_finished_tasks_than_the_limit_are_all_deleted_in_turn() -> None:
    h = Harness(ttl_after_finished=10, max_finished=100)
    now = h.clock.now().isoformat()
    for i in range(150):
        h.kube.put("agenttasks", finished(f"t{i:03d}", at=now))
    await h.settle()
    cleanup = h.controller.cleanup
    assert len(cleanup) == 100 and cleanup.overflowed

    async def relist() -> None:  # the watch's LIST, as main wires it
        for (plural, _, _), body in list(h.kube.objects.items()):
            if plural == "agenttasks":
                h.controller.observe("agenttasks", "MODIFIED", dict(body))

    cleanup.relist = relist
    h.clock.advance(11)
    await drain(h)
    h.clock.advance(601)  # the relist comes at most every RELIST_SECONDS
    await drain(h)
    h.clock.advance(11)
    await drain(h)
    assert tasks_left(h) == 0 and len(cleanup) == 0


@run
async def test_the_memory_of_ten_thousand_finished_tasks_is_small_and_given_back() -> None:
    h = Harness(ttl_after_finished=60)
    await h.settle()
    now = h.clock.now().isoformat()
    bodies = [finished(f"t{i:05d}", at=now) for i in range(10_000)]
    for i, body in enumerate(bodies):
        body["metadata"].update(uid=f"uid-{i}", resourceVersion=str(1000 + i))
    # The operator's memory: not the in-memory API server's, nor this test's bodies.
    operator = [tracemalloc.Filter(False, "*/fake.py"), tracemalloc.Filter(False, __file__)]
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        start = tracemalloc.take_snapshot().filter_traces(operator)
        for body in bodies:  # as the watch delivers them
            h.controller.observe("agenttasks", "ADDED", body)
        h.controller.step()
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
        assert len(h.controller.store.tasks) == 0, "no record of a finished task"
        assert len(h.controller.cleanup) == 10_000
        # One cleanup entry and one tombstone each.
        assert held < 10_000 * 800, f"{held / 10_000:.0f} bytes per finished task"

        for body in bodies:  # the API server holds them too, for the deletes to find
            h.kube.objects[("agenttasks", NS, body["metadata"]["name"])] = body
        h.clock.advance(61)
        await drain(h)
        assert tasks_left(h) == 0
        c = h.controller
        assert len(c.cleanup) == 0 and not c.cleanup._heap and len(c.store) == 0
        # A tombstone outlives any late reply (TOMBSTONE_SECONDS), then it goes too:
        # a steady rate of tasks finished and deleted holds the memory of a few
        # minutes' worth of them, not of the last 10,000.
        for _ in range(2):
            await h.advance(TOMBSTONE_SECONDS + 1)
        assert len(c.store.task_tombstones) == 0
        gc.collect()
        after = tracemalloc.take_snapshot().filter_traces(operator)
    finally:
        tracemalloc.stop()
    # What is left is the capacity of the cleanup's dict (a dict keeps its table).
    kept = sum(stat.size_diff for stat in after.compare_to(start, "filename"))
    assert kept < 10_000 * 50, f"{kept / 10_000:.0f} bytes per deleted task kept"


@run
async def test_a_status_forged_finished_loses_its_lease_then_leaves_the_store() -> None:
    """A finished task is kept only while its claim's Lease is to be deleted (the holder's
    next write then finds nothing): a status forged to Succeeded under a running claim."""
    h = Harness()
    await h.running(task("t").requires("llm"), lease_seconds=100_000)
    h.kube.edit("agenttasks", NS, "t", lambda b: b["status"].update(phase="Succeeded"))
    await h.settle()
    assert h.lease("t") is None, "the claim's Lease goes"
    assert (NS, "t") not in h.controller.store.tasks
    assert h.controller.cleanup.holds(
        (NS, "t"), h.kube.get("agenttasks", NS, "t")["metadata"]["uid"]
    )


@run
async def test_a_lease_seen_after_its_finished_task_is_deleted() -> None:
    h = Harness()
    h.kube.put("agenttasks", finished("t", at=h.clock.now().isoformat()))
    await h.settle()
    uid = h.kube.get("agenttasks", NS, "t")["metadata"]["uid"]
    h.kube.put(
        "leases",
        {
            "metadata": {
                "name": protocol.task_lease_name("t"),
                "namespace": NS,
                "labels": {protocol.LABEL_LEASE_KIND: "task", protocol.LABEL_TASK: "t"},
                "annotations": {protocol.ANNOTATION_TOKEN: "1", protocol.ANNOTATION_TASK_UID: uid},
            },
            "spec": {"holderIdentity": "w1", "leaseDurationSeconds": 30},
        },
    )
    await h.settle()
    assert h.lease("t") is None


@run
async def test_a_steady_rate_of_tasks_run_finished_and_deleted_holds_the_memory_flat() -> None:
    """``make soak`` in small: 2.5 tasks a second, each granted, renewed, Succeeded and
    deleted by its TTL (30 s). Once the first TTL period (and a tombstone's life) is
    over, what the operator holds stays as it is: no per-task leftover."""
    h = Harness()
    h.worker("w1", "llm", max_in_flight=100, lease_seconds=100_000)
    await h.settle()
    made = 0

    async def ten_seconds() -> None:
        nonlocal made
        names = [f"s{made + i:07d}" for i in range(25)]
        made += len(names)
        for name in names:
            h.task(task(name).requires("llm").lease(30).ttl(30))
        await h.settle()
        for name in names:
            h.renew(name)
        await h.settle()
        for name in names:
            h.report(name, outcome="Succeeded", result={"ok": True})
        await h.settle()
        for key in [k for k in h.kube.objects if k[0] == "events"]:
            del h.kube.objects[key]  # the API server's --event-ttl
        h.renew_worker("w1")
        await h.advance(10)

    c = h.controller
    gc.collect()
    tracemalloc.start()  # from the start: what the window frees counts too
    try:
        for _ in range(14):  # the first TTL period, and a tombstone's longest life
            await ten_seconds()
        gc.collect()
        before = tracemalloc.get_traced_memory()[0]
        for _ in range(24):  # 600 tasks more; whole periods of the tombstones' aging
            await ten_seconds()
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert tasks_left(h) <= 4 * 25, "deleted by their TTL"
    assert len(c.store.tasks) == 0 and len(c.cleanup) <= 4 * 25
    # Two periods of deletions at most.
    assert len(c.store.task_tombstones) <= 2 * TOMBSTONE_SECONDS * 2.5 + 25
    assert grown < 600 * 40, f"{grown / 600:.0f} bytes per task kept"


@run
async def test_a_task_naming_budgets_is_kept_a_minute_after_it_finished_whatever_its_ttl() -> None:
    # A new leader restores a budget's last minute from its tasks' statuses
    # (docs/budgets.md): the task's usage counts for 61 s after its end.
    h = Harness()
    now = h.clock.now().isoformat()
    h.kube.put("agenttasks", finished("plain", at=now, ttlSecondsAfterFinished=0))
    h.kube.put(
        "agenttasks",
        finished("spent", at=now, ttlSecondsAfterFinished=0, budgets=[{"name": "openai"}]),
    )
    await h.settle()
    assert h.kube.get("agenttasks", NS, "plain") is None
    await h.advance(60)
    assert h.kube.get("agenttasks", NS, "spent") is not None
    await h.advance(2)
    assert h.kube.get("agenttasks", NS, "spent") is None


@run
async def test_a_ttl_raised_after_the_task_finished_holds_it_longer() -> None:
    """docs/api.md: a TTL changed on a finished task applies at once, either way."""
    h = Harness(ttl_after_finished=100)
    h.kube.put(
        "agenttasks", finished("up", at=h.clock.now().isoformat(), ttlSecondsAfterFinished=60)
    )
    h.kube.put(
        "agenttasks", finished("down", at=h.clock.now().isoformat(), ttlSecondsAfterFinished=600)
    )
    await h.settle()
    await h.advance(10)
    h.kube.edit("agenttasks", NS, "up", lambda b: b["spec"].update(ttlSecondsAfterFinished=86400))
    h.kube.edit("agenttasks", NS, "down", lambda b: b["spec"].update(ttlSecondsAfterFinished=30))
    await h.settle()
    await h.advance(25)  # 35 s after they finished
    assert h.kube.get("agenttasks", NS, "down") is None, "a lowered TTL applies at once"
    await h.advance(60)  # 95 s: past the first TTL of "up"
    assert h.kube.get("agenttasks", NS, "up") is not None, "a raised TTL applies at once"
    await h.advance(86400 - 95 + 2)
    assert h.kube.get("agenttasks", NS, "up") is None


def raise_the_ttl_as_the_delete_goes_out(h: Harness, *, answer_lost: bool = False) -> list[str]:
    """The first delete of a task raises its TTL to an hour, and has the controller take
    that event in, before the delete is answered (or its answer is lost); returns the
    names it did so for."""
    real = h.kube.delete_task
    raced: list[str] = []

    async def racing(namespace: str, name: str, uid: str, resource_version: str) -> Any:
        if not raced:
            raced.append(name)
            h.kube.edit(
                "agenttasks", NS, name, lambda b: b["spec"].update(ttlSecondsAfterFinished=3600)
            )
            h.controller.step()  # its event is taken in before the delete's answer
            assert h.controller.cleanup.entries[(NS, name)].deleting
            if answer_lost:
                raise KubeError("timeout")
        return await real(namespace, name, uid, resource_version)

    h.kube.delete_task = racing  # type: ignore[method-assign]
    return raced


@run
async def test_a_ttl_raised_while_its_delete_is_out_is_honoured() -> None:
    """The TTL raised, and its event seen, while the delete is on its way: the delete is
    refused (an older resourceVersion) and the task is due by its new TTL, not deleted
    again at once."""
    h = Harness(ttl_after_finished=10)
    h.kube.put("agenttasks", finished("t", at=h.clock.now().isoformat()))
    await h.settle()
    raced = raise_the_ttl_as_the_delete_goes_out(h)
    await h.advance(11)
    assert raced == ["t"]
    assert h.kube.get("agenttasks", NS, "t") is not None, "precondition: not what was seen"
    await h.advance(60)
    assert h.kube.get("agenttasks", NS, "t") is not None, "held by its new TTL"
    await h.advance(3600)
    assert h.kube.get("agenttasks", NS, "t") is None


@run
async def test_a_delete_cut_off_by_a_lost_lead_is_made_when_the_lead_comes_back() -> None:
    """The delete hangs (an API server outage), the replica loses the lead (its requests
    are cancelled) and leads again: the task is still deleted."""
    h = Harness(ttl_after_finished=10)
    h.kube.put("agenttasks", finished("t", at=h.clock.now().isoformat()))
    await h.settle()
    c = h.controller
    h.kube.inject("delete_task", Hang())
    h.clock.advance(11)
    await h.steps(3)
    assert c.cleanup.deleting == 1
    c.set_leading(False)
    for _ in range(3):
        await asyncio.sleep(0)
    assert c.cleanup.deleting == 0
    c.set_leading(True)
    await h.settle()
    await h.advance(5)
    assert h.kube.get("agenttasks", NS, "t") is None


def finish_and_delete(h: Harness, count: int, *, leading: bool) -> None:
    """``count`` finished tasks, each seen and then deleted (by a user, or by the leader
    this replica stands by for) long before its TTL."""
    c = h.controller
    now = h.clock.now().isoformat()
    for i in range(count):
        body = finished(f"t{i:05d}", at=now)
        body["metadata"].update(uid=f"u{i}", resourceVersion=str(10 + 2 * i))
        gone = {**body, "metadata": {**body["metadata"], "resourceVersion": str(11 + 2 * i)}}
        for kind, seen in (("ADDED", body), ("DELETED", gone)):
            c.observe("agenttasks", kind, seen)
            if leading:
                c.step()
            else:
                c.standby()


@run
async def test_the_timing_of_deletes_holds_no_more_than_the_finished_tasks_it_knows() -> None:
    """Tasks deleted before their TTL (by a user; by the leader, seen on a standby that
    deletes nothing) leave nothing behind: the heap of due times is bounded by the
    entries, not by every task seen within a TTL."""
    for leading in (True, False):
        h = Harness(ttl_after_finished=43200)
        await h.settle()
        if not leading:
            h.controller.set_leading(False)
        finish_and_delete(h, 5000, leading=leading)
        cleanup = h.controller.cleanup
        assert len(cleanup) == 0
        assert len(cleanup._heap) <= 2 * len(cleanup) + 1024, (leading, len(cleanup._heap))


@run
async def test_a_ttl_raised_while_its_delete_is_out_then_lost_is_honoured() -> None:
    """As above, the delete's answer lost (unknown outcome): tried again when the new TTL
    says, not a second later."""
    h = Harness(ttl_after_finished=10)
    h.kube.put("agenttasks", finished("t", at=h.clock.now().isoformat()))
    await h.settle()
    raced = raise_the_ttl_as_the_delete_goes_out(h, answer_lost=True)
    await h.advance(11)
    assert raced == ["t"]
    await h.advance(120)
    assert h.kube.get("agenttasks", NS, "t") is not None, "held by its new TTL"
    await h.advance(3600)
    assert h.kube.get("agenttasks", NS, "t") is None
