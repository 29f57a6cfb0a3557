"""Expiries confirmed in batches, and the ended attempt's Lease deleted off the decision path.

A worker that dies takes every claim it held with it; the reclaims must not queue a
read per Lease in front of their own writes, and must still never reclaim a claim
whose holder renewed where the operator could not see it (a stalled watch).
"""

from __future__ import annotations

import asyncio

from agentq import protocol
from agentq.operator.confirm import found, selector
from agentq.operator.fake import Held
from agentq.operator.port import KubeError, Reply, Status
from builders import task
from harness import NS, Harness, run

N = 20


async def held_by_w1(h: Harness, n: int = N, lease: int = 3) -> None:
    h.worker("w1", "llm", lease_seconds=1000, max_in_flight=n)
    for i in range(n):
        h.task(task(f"t{i}").requires("llm").lease(lease).backoff(initial=0))
    await h.advance(0.5)
    for i in range(n):
        h.renew(f"t{i}")
    await h.settle()
    assert all(h.phase(f"t{i}") == "Running" for i in range(n))


@run
async def test_the_claims_of_a_worker_that_died_are_confirmed_with_one_list() -> None:
    h = Harness()
    await held_by_w1(h)
    gets = h.kube.calls["get_lease"]
    await h.advance(4)  # w1's agent died: nothing renews
    assert all(h.status(f"t{i}").get("reclaims") == 1 for i in range(N))
    assert h.controller.stats.confirm_reads == N
    assert h.kube.calls["list_leases"] == 1, h.kube.calls
    assert h.kube.calls["get_lease"] == gets, "no read per Lease"


@run
async def test_a_single_expiry_is_confirmed_with_a_get() -> None:
    h = Harness()
    await held_by_w1(h, n=1)
    gets = h.kube.calls["get_lease"]
    await h.advance(4)
    assert h.status("t0").get("reclaims") == 1
    assert h.kube.calls["list_leases"] == 0
    assert h.kube.calls["get_lease"] == gets + 1


@run
async def test_a_stalled_watch_reclaims_only_the_claims_whose_holders_stopped() -> None:
    h = Harness()
    await held_by_w1(h, n=10, lease=10)
    h.kube.hold_events()  # the operator sees nothing from here on
    alive = [f"t{i}" for i in range(5)]
    for _ in range(30):  # 15 s: half the holders keep renewing, half stopped
        h.clock.advance(0.5)
        for name in alive:
            h.renew(name)
        await h.settle()
    # The lists showed the live holders' renewals: no reclaim of theirs.
    assert all(h.phase(n) == "Running" and not h.status(n).get("reclaims") for n in alive)
    assert all(h.status(f"t{i}").get("reclaims") == 1 for i in range(5, 10))
    assert h.controller.stats.expiries_dropped >= 5
    assert h.kube.calls["list_leases"] >= 1
    h.kube.deliver()
    await h.settle()
    assert all(not h.status(n).get("reclaims") for n in alive)


@run
async def test_a_lease_the_list_does_not_show_is_read_alone() -> None:
    h = Harness()
    await held_by_w1(h, n=4)
    h.kube.hold_events()
    # Someone deletes one Lease; the operator does not see it (the watch is stalled).
    h.kube.remove("leases", NS, protocol.task_lease_name("t0"))
    gets = h.kube.calls["get_lease"]
    await h.advance(4)
    assert h.kube.calls["list_leases"] == 1
    assert h.kube.calls["get_lease"] == gets + 1, "the missing one, and only it, read alone"
    assert all(h.status(f"t{i}").get("reclaims") == 1 for i in range(1, 4))
    h.kube.deliver()
    await h.settle()
    # A claim whose Lease vanished is given its Lease back (the grant is repaired)...
    assert h.phase("t0") == "Running" and h.lease("t0") is not None
    await h.advance(4)
    assert h.status("t0").get("reclaims") == 1  # ...and reclaimed once nobody renews it


@run
async def test_a_failed_list_falls_back_to_a_read_per_lease() -> None:
    h = Harness()
    await held_by_w1(h, n=5)
    h.kube.inject("list_leases", Status.INVALID)
    gets = h.kube.calls["get_lease"]
    await h.advance(4)
    assert all(h.status(f"t{i}").get("reclaims") == 1 for i in range(5))
    assert h.kube.calls["get_lease"] == gets + 5


@run
async def test_a_list_with_an_unknown_outcome_is_retried() -> None:
    h = Harness()
    await held_by_w1(h, n=5)
    h.kube.inject("list_leases", KubeError("timeout"))
    await h.advance(4)
    assert all(h.phase(f"t{i}") == "Running" for i in range(5)), "nothing unconfirmed commits"
    assert h.controller.stats.unknown == 5
    await h.advance(1.5)
    assert all(h.status(f"t{i}").get("reclaims") == 1 for i in range(5))


@run
async def test_the_ended_attempts_lease_delete_holds_up_nothing() -> None:
    h = Harness()
    h.worker("w1", "llm", lease_seconds=1000)
    h.task(task("t").requires("llm").lease(3).backoff(initial=0))
    await h.advance(0.5)
    h.renew("t")
    await h.settle()
    old = h.lease("t")
    assert old is not None
    gate = asyncio.Event()
    h.kube.inject("delete_lease", Held(gate))
    h.worker("w2", "llm", lease_seconds=1000)
    h.clock.advance(4)  # w1's holder died; its Lease's delete is slow
    for _ in range(100):  # settle() would wait for the held delete: step by hand
        h.controller.step()
        await asyncio.sleep(0.005)
    assert h.kube.calls["delete_lease"] == 1 and h.kube.writes["leases DELETE"] == 0
    status = h.status("t")
    assert status["reclaims"] == 1 and status["worker"] == "w2", "re-dispatched meanwhile"
    lease = h.lease("t")
    assert lease is not None and lease["spec"]["holderIdentity"] == "w2"
    assert protocol.lease_token(lease["metadata"]["annotations"]) == status["fencingToken"]
    gate.set()  # the delete arrives late, conditioned on the old Lease: refused
    await h.settle()
    lease = h.lease("t")
    assert lease is not None and lease["spec"]["holderIdentity"] == "w2"
    assert h.kube.writes["leases DELETE"] == 0


@run
async def test_a_completed_tasks_lease_is_deleted() -> None:
    h = Harness()
    h.worker("w1", "llm")
    h.task(task("t").requires("llm"))
    await h.advance(0.5)
    h.renew("t")
    await h.settle()
    h.report("t", outcome="Succeeded", result={"ok": True})
    await h.settle()
    assert h.phase("t") == "Succeeded"
    assert h.lease("t") is None


def test_found_answers_only_for_the_names_asked_and_nothing_on_a_failed_list() -> None:
    items = [{"metadata": {"name": n, "resourceVersion": "7"}} for n in ("a", "b", "c")]
    replies = found(Reply(Status.OK, {"items": items}), {"a", "c", "z"})
    assert set(replies) == {"a", "c"}
    assert all(r.ok and r.body is not None for r in replies.values())
    assert found(Reply(Status.INVALID, None, "no"), {"a"}) == {}
    assert selector("w-1") == f"{protocol.LABEL_LEASE_KIND}=task,{protocol.LABEL_WORKER}=w-1"


@run
async def test_a_few_expiries_of_a_worker_with_many_claims_are_read_one_by_one() -> None:
    h = Harness()
    many = 40
    await held_by_w1(h, n=many)
    gets = h.kube.calls["get_lease"]
    # 38 of w1's 40 holders go on renewing; 2 stop: a LIST of 40 to confirm 2 is not worth it.
    await h.run_for(4, renew=tuple(f"t{i}" for i in range(2, many)))
    assert all(h.status(f"t{i}").get("reclaims") == 1 for i in range(2))
    assert all(not h.status(f"t{i}").get("reclaims") for i in range(2, many))
    assert h.kube.calls["list_leases"] == 0
    assert h.kube.calls["get_lease"] >= gets + 2


@run
async def test_expiries_that_come_while_a_workers_read_is_out_gather_into_one_read() -> None:
    """A dead worker's claims expire over the second its last renewals were spread over:
    while one read of its Leases is out, the next expiries wait for it and go together."""
    h = Harness()
    n = 40
    await held_by_w1(h, n=n, lease=3)
    gets = h.kube.calls["get_lease"]
    groups = [range(1, 14), range(14, 27), range(27, n)]
    for group in groups:  # the holders' last renewals, 0.2 s apart; t0's is the oldest
        h.clock.advance(0.2)
        for i in group:
            h.renew(f"t{i}")
    await h.settle()
    gate = asyncio.Event()
    h.kube.inject("get_lease", Held(gate))  # the first read (t0's) is slow

    async def steps() -> None:
        for _ in range(20):  # settle() would wait for the held read: step by hand
            h.controller.step()
            await asyncio.sleep(0.002)

    h.clock.advance(3 - 0.6)  # t0 expired
    await steps()
    assert h.kube.calls["get_lease"] == gets + 1
    for _ in groups:  # each group expires while t0's read is still out
        h.clock.advance(0.2)
        await steps()
    assert h.kube.calls["list_leases"] == 0, "waiting for the read that is out"
    gate.set()
    await h.settle()
    assert all(h.status(f"t{i}").get("reclaims") == 1 for i in range(n))
    assert h.kube.calls["list_leases"] == 1, h.kube.calls
    assert h.kube.calls["get_lease"] == gets + 1


@run
async def test_a_read_cancelled_before_it_ran_does_not_strand_the_next_leaders_expiries() -> None:
    """Leadership lost in the very step that queued a worker's confirming read: the read
    is cancelled before it runs. Back in the lead, the worker's next expiries are read."""
    h = Harness()
    await held_by_w1(h, n=2)
    h.clock.advance(4)  # both claims expired
    h.controller.step()  # decided
    await asyncio.sleep(0)  # the decisions ask for their read: it is spawned, not yet run
    assert h.controller.confirmer._open
    h.controller.set_leading(False)  # cancels every write, the read before it ran
    await asyncio.sleep(0)
    h.controller.set_leading(True)
    await asyncio.wait_for(h.settle(), timeout=10)  # stranded: the decisions wait forever
    assert all(h.status(f"t{i}").get("reclaims") == 1 for i in range(2)), h.kube.calls
