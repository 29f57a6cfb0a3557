"""Paths of the sidecar that ended with nothing left to look at its state again.

The family of tests/unit/operator/test_event_order.py, in the sidecar: a write
can end in several ways (done, refused, unknown outcome, an unexpected
exception), the agent can ask before the sidecar knows its attempts, and each
path must leave the attempt renewable, ended cleanly, or answered with a status
that tells the agent to try again. Each test here failed on the sidecar as it
was; found by reviewing the sidecar for that family. The API server is a small
in-memory fake (``FakeApi``); the clock is a ``FakeClock``.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from agentq import protocol
from agentq.sidecar.attempts import AgentError
from agentq.sidecar.kubeapi import ApiError, lease_path
from harness import run
from sidecar_fakes import (
    COMPLETE,
    NS,
    SECRET,
    TASK_PATH,
    FakeApi,
    Sidecar,
    agent,
    agent_task,
    task_lease,
    wait_for,
)


@run
async def test_a_report_posted_before_the_sidecar_knows_its_attempts_is_asked_again() -> None:
    """A restarted sidecar (same pod) knows no attempt until it holds the worker Lease,
    has listed the task Leases and read each task. A report the agent posted in that
    window was answered 404 UnknownTask -- which the agent client does not retry -- so
    finished work was dropped and the task reclaimed. It is a 503 NotReady (retry)."""
    sidecar = Sidecar()
    client = await agent(sidecar)
    try:
        sent = await client.post(COMPLETE, json={"token": 7, "result": 1})
        assert (sent.status, (await sent.json())["error"]) == (503, "NotReady")
        beat = await client.post("/v1/assignments/job/heartbeat", json={"token": 7})
        assert (beat.status, (await beat.json())["error"]) == (503, "NotReady")
        sidecar.hold_worker_lease()
        lease = sidecar.api.put(lease_path(NS, "agentq-task-job"), task_lease())
        pending = sidecar.attempts.observe(lease, sidecar.clock.monotonic())
        assert pending is not None  # listed, its task not read yet
        sent = await client.post(COMPLETE, json={"token": 7, "result": 1})
        assert (sent.status, (await sent.json())["error"]) == (503, "NotReady")
        assert sidecar.attempts.activate(
            pending, uid="uid-1", payload=None, lease_seconds=30, heartbeat_seconds=10
        )
        sent = await client.post(COMPLETE, json={"token": 7, "result": 1})
        assert sent.status == 200
        # A task never granted here is still a 404 once the sidecar serves.
        sent = await client.post("/v1/assignments/other/complete", json={"token": 7})
        assert sent.status == 404
    finally:
        await client.close()


@run
async def test_a_renewal_that_raises_unexpectedly_is_retried_after_a_pause() -> None:
    """A renewal that raised anything but an ApiError (a credential refresh that failed,
    say) ended its task with the exception unobserved and no retry time: the loop
    scheduled it again at once, a busy loop of API requests for as long as the cause
    lasted. It is a failed write: retried after the usual pause."""
    sidecar = Sidecar()
    sidecar.hold_worker_lease()
    attempt = sidecar.grant()
    sidecar.clock.advance(1.0)  # past the first renewal's grace after the grant
    sidecar.keeper.confirmed_at = sidecar.clock.monotonic()
    sidecar.attempts.beat("job", 7, None, sidecar.clock.monotonic())
    sidecar.api.fail("PUT", lease_path(NS), RuntimeError("token file unreadable"), times=1000)
    stop = asyncio.Event()
    loop = asyncio.create_task(sidecar.renewer.run(stop))
    try:
        await asyncio.sleep(0.2)
        assert sidecar.api.requests[("PUT", "leases")] == 1
        sidecar.api.faults.clear()
        sidecar.clock.advance(1.0)
        sidecar.keeper.confirmed_at = sidecar.clock.monotonic()
        sidecar.attempts.beat("job", 7, None, sidecar.clock.monotonic())
        sidecar.changes.notify()
        await wait_for(lambda: attempt.renewed_at is not None)
    finally:
        stop.set()
        sidecar.changes.notify()
        await loop


@run
async def test_a_task_read_that_raises_unexpectedly_is_read_again() -> None:
    """The read of a newly granted task runs in a task of its own; anything but an
    ApiError ended it silently and the attempt stayed pending for good: never offered
    to the agent, its lease ran out and the operator counted a reclaim."""
    sidecar = Sidecar()
    sidecar.hold_worker_lease()
    sidecar.api.objects[TASK_PATH] = agent_task()
    sidecar.api.put(lease_path(NS, "agentq-task-job"), task_lease())
    sidecar.api.fail("GET", TASK_PATH, RuntimeError("token file unreadable"))
    sidecar.watcher.resume()
    async with sidecar.watching():
        await wait_for(lambda: [a.task for a in sidecar.attempts.listing()] == ["job"])


@run
async def test_a_takeover_whose_write_had_an_unknown_outcome_does_not_serve_inherited_leases() -> (
    None
):
    """Taking the worker Lease over from another pod serves only task Leases written
    after the takeover: the other pod's agent may still work on the older ones with
    the same fencing token. When the takeover's write timed out but happened, the next
    round found this sidecar the holder and took that for a restart in the same pod
    (adopt): the other pod's task Leases were served here too, two agents on one token."""
    api = FakeApi()
    worker_path = lease_path(NS, "agentq-worker-w")
    api.put(
        worker_path,
        {
            "metadata": {"name": "agentq-worker-w", "namespace": NS},
            "spec": {"holderIdentity": "old-pod", "leaseDurationSeconds": 15},
        },
    )
    inherited = api.put(lease_path(NS, "agentq-task-job"), task_lease(token=5))
    sidecar = Sidecar(api, identity="new-pod")
    await sidecar.keeper.step()
    assert not sidecar.keeper.holding  # held by old-pod: wait out its duration
    sidecar.clock.advance(16)
    api.fail("PUT", worker_path, ApiError(0, "timeout"), applied=True)
    with pytest.raises(ApiError):
        await sidecar.keeper.step()
    await sidecar.keeper.step()
    assert sidecar.keeper.holding
    now = sidecar.clock.monotonic()
    assert (
        sidecar.attempts.resync([inherited], now, serve_from_rv=sidecar.keeper.serve_from_rv) == []
    )
    with pytest.raises(AgentError) as told:
        sidecar.attempts.find("job", 5)
    assert "took the worker Lease over" in told.value.message
    # Granted again after the takeover (a new token): served here.
    granted = api.put(lease_path(NS, "agentq-task-job"), task_lease(token=6))
    assert sidecar.attempts.observe(granted, now, serve_from_rv=sidecar.keeper.serve_from_rv)


@run
async def test_a_report_whose_write_had_an_unknown_outcome_is_acknowledged_when_sent_again() -> (
    None
):
    """The report's write timed out but happened; the agent was told 503 and sent it
    again, as told. Meanwhile the operator had committed it and deleted the Lease: the
    retry was answered 409 LeaseLost, so the agent believed the task it had finished
    was taken from it (the task had Succeeded with its result). The watch showed the
    report on the Lease before the delete; the retry is now acknowledged."""
    sidecar = Sidecar()
    sidecar.hold_worker_lease()
    sidecar.grant()
    sidecar.attempts.beat("job", 7, None, sidecar.clock.monotonic())
    client = await agent(sidecar)
    try:
        sidecar.api.fail("PUT", lease_path(NS), ApiError(0, "timeout"), applied=True)
        sent = await client.post(COMPLETE, json={"token": 7, "result": {"a": 1}})
        assert sent.status == 503
        lease = sidecar.lease()
        assert protocol.ANNOTATION_REPORT in lease["metadata"]["annotations"]
        sidecar.attempts.observe(lease, sidecar.clock.monotonic())  # the watch: MODIFIED
        sidecar.attempts.deleted(lease)  # the operator committed it: DELETED
        sent = await client.post(COMPLETE, json={"token": 7, "result": {"a": 1}})
        assert sent.status == 200, await sent.json()
        sent = await client.post(COMPLETE, json={"token": 7, "result": {"a": 2}})
        assert sent.status == 409  # a different report is still refused
    finally:
        await client.close()


@run
async def test_a_listing_answered_after_the_worker_lease_was_lost_is_not_applied() -> None:
    """The worker Lease was lost while the watch's listing was on its way: the listing
    was applied after every attempt had ended, so the attempts it showed were set up
    again, with the worker Lease not held. Taken over again later (from the pod that
    held it meanwhile), the next listing found them already known and kept them
    although they were written before the takeover: served here while the other pod's
    agent may have worked on them with the same token."""
    sidecar = Sidecar()
    sidecar.api.objects[TASK_PATH] = agent_task()
    sidecar.api.put(lease_path(NS, "agentq-task-job"), task_lease(token=5))

    def lose_during_the_listing(method: str, path: str) -> None:
        if method == "GET" and path == lease_path(NS):
            sidecar.api.before = lambda method, path: None
            sidecar.keeper.holding = False
            sidecar.lost("the worker Lease is now held by pod-2")

    sidecar.api.before = lose_during_the_listing
    sidecar.hold_worker_lease()
    sidecar.watcher.resume()
    async with sidecar.watching():
        await wait_for(lambda: sidecar.api.requests[("GET", "leases")] == 1)
        await asyncio.sleep(0.05)  # the task read, if the listing was applied
        # pod-2 held the worker Lease meanwhile; it runs out and this sidecar takes it.
        worker = sidecar.api.put(lease_path(NS, "agentq-worker-w"), {"metadata": {}})
        sidecar.keeper.serve_from_rv = int(worker["metadata"]["resourceVersion"])
        sidecar.hold_worker_lease()
        sidecar.watcher.resume()
        await wait_for(lambda: sidecar.api.requests[("GET", "leases")] == 2)
        await wait_for(lambda: sidecar.watcher.synced)
        assert sidecar.attempts.listing() == []
        with pytest.raises(AgentError) as told:
            sidecar.attempts.find("job", 5)
        assert "took the worker Lease over" in told.value.message


@run
async def test_a_watch_event_that_arrives_with_the_loss_of_the_worker_lease_is_not_applied() -> (
    None
):
    """The worker Lease was lost while a watch event was arriving: the event and the
    request to stop watching were both ready when the watch loop woke, and the event
    was applied first, setting up an attempt after every attempt had ended, with the
    worker Lease not held (the same harm as a late listing: once the worker Lease was
    taken over again, that attempt was served although its Lease is older than the
    takeover)."""
    sidecar = Sidecar()
    sidecar.api.objects[TASK_PATH] = agent_task()
    sidecar.hold_worker_lease()
    sidecar.watcher.resume()
    async with sidecar.watching():
        await wait_for(lambda: sidecar.api.requests[("WATCH", "leases")] == 1)
        granted = sidecar.api.put(lease_path(NS, "agentq-task-job"), task_lease(token=5))
        sidecar.api.events.put_nowait({"type": "ADDED", "object": granted})
        sidecar.keeper.holding = False
        sidecar.lost("the worker Lease is now held by pod-2")
        await asyncio.sleep(0.05)
        assert "job" not in sidecar.attempts.current


@run
async def test_renewals_wait_for_the_worker_lease_without_polling() -> None:
    """While the worker Lease's renewal is late, nothing is renewed; the loop asked again
    every 5 ms (about 200 times a second for as long as the API server was away, in every
    sidecar). It waits for the keeper to say the worker Lease is confirmed again, and then
    renews at once."""
    sidecar = Sidecar()
    worker = sidecar.api.put(lease_path(NS, "agentq-worker-w"), {"metadata": {}, "spec": {}})
    sidecar.hold_worker_lease()
    sidecar.keeper.lease = worker
    sidecar.grant()
    sidecar.clock.advance(16)  # the worker Lease (15 s) lapsed; the claim's renewal is due
    sidecar.attempts.beat("job", 7, None, sidecar.clock.monotonic())  # the agent is alive
    assert not sidecar.keeper.held(sidecar.clock.monotonic())
    turns = 0
    wait = sidecar.changes.wait

    async def counted(timeout: float) -> bool:
        nonlocal turns
        turns += 1
        return await wait(timeout)

    sidecar.changes.wait = counted  # type: ignore[method-assign]
    stop = asyncio.Event()
    loop = asyncio.create_task(sidecar.renewer.run(stop))
    try:
        await asyncio.sleep(0.2)
        assert turns <= 2, f"{turns} turns of the renewal loop in 0.2 s"
        assert sidecar.api.requests[("PUT", "leases")] == 0
        await sidecar.keeper._renew()  # the worker Lease is confirmed again
        await wait_for(lambda: sidecar.api.requests[("PUT", "leases")] == 2, seconds=0.1)
    finally:
        stop.set()
        sidecar.changes.notify()
        await asyncio.gather(loop, return_exceptions=True)


@run
async def test_the_api_refuses_calls_without_the_secret_and_health_needs_none() -> None:
    """Every API path wants the pod's secret (unknown paths too: nothing is learnt
    without it), a loopback Host and a JSON body; metrics and health answer on their
    own app without the secret, and the API app no longer serves /metrics."""
    sidecar = Sidecar()
    sidecar.hold_worker_lease()
    sidecar.grant()
    bare: TestClient[Any, Any] = TestClient(TestServer(sidecar.agent_api.app()))
    await bare.start_server()
    health: TestClient[Any, Any] = TestClient(TestServer(sidecar.agent_api.health_app()))
    await health.start_server()
    good = {"Authorization": f"Bearer {SECRET}"}
    try:
        for method, path in (("GET", "/v1/assignments"), ("GET", "/nope"), ("POST", COMPLETE)):
            answer = await bare.request(method, path, json={"token": 7})
            body = await answer.json()
            assert (answer.status, body["error"]) == (401, "Unauthorized"), (path, body)
            assert answer.headers["WWW-Authenticate"].startswith("Bearer")
        answer = await bare.get("/v1/status", headers={**good, "Host": "rebound.example"})
        assert (answer.status, (await answer.json())["error"]) == (403, "HostNotAllowed")
        answer = await bare.post(COMPLETE, data="token=7", headers=good)
        assert (answer.status, (await answer.json())["error"]) == (415, "UnsupportedMediaType")
        assert sidecar.attempts.current["job"].state != "reported"
        answer = await bare.get("/v1/assignments/job", headers=good)
        assert answer.status == 200
        assert (await bare.get("/metrics", headers=good)).status == 404
        for path in ("/metrics", "/healthz", "/readyz"):
            assert (await health.get(path)).status == 200, path
        assert (await health.get("/v1/assignments")).status == 404
    finally:
        await bare.close()
        await health.close()


@run
async def test_drain_marks_the_worker_lease_and_keeps_renewing_claims() -> None:
    """POST /v1/drain (the agent got SIGTERM: a scale-down) renews the worker Lease at once
    with agentq.dev/draining=true and keeps it so; the task Leases stay renewable; a
    takeover by a new pod never carries the mark."""
    api = FakeApi()
    sidecar = Sidecar(api)
    await sidecar.keeper.step()  # creates the worker Lease
    assert sidecar.keeper.holding
    worker_path = lease_path(NS, "agentq-worker-w")
    assert protocol.ANNOTATION_DRAINING not in (
        api.objects[worker_path]["metadata"].get("annotations") or {}
    )
    client = await agent(sidecar)
    stop = asyncio.Event()
    loop = asyncio.create_task(sidecar.keeper.run(stop))
    try:
        answer = await client.post("/v1/drain", json={})
        assert answer.status == 202 and (await answer.json())["draining"] is True
        await wait_for(
            lambda: (
                (api.objects[worker_path]["metadata"].get("annotations") or {}).get(
                    protocol.ANNOTATION_DRAINING
                )
                == "true"
            )
        )
        status = await (await client.get("/v1/status")).json()
        assert status["draining"] is True and status["workerLeaseHeld"] is True
    finally:
        stop.set()
        await loop
        await client.close()
    # Renewals go on carrying it; the worker Lease is still ours (claims renewable).
    await sidecar.keeper.step()
    assert api.objects[worker_path]["metadata"]["annotations"][protocol.ANNOTATION_DRAINING]
    assert sidecar.keeper.held(sidecar.clock.monotonic())
    # Another pod taking the Lease over starts undrained.
    other = Sidecar(api, identity="pod-2")
    await other.keeper.step()
    other.clock.advance(16)
    await other.keeper.step()
    assert other.keeper.holding
    assert protocol.ANNOTATION_DRAINING not in (
        api.objects[worker_path]["metadata"].get("annotations") or {}
    )
