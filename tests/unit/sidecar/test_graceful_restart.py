"""A sidecar stopped gracefully (SIGTERM: it releases the worker Lease) and started
again in the same pod takes its claims back, as after a crash; in another pod it
does not serve them (their agent may still be running with the same tokens).

The release cleared ``holderIdentity``, and that was all the restarted container
could go by: holder None is not its identity, so it took the Lease over as if from
another pod. Every claim was inherited: a revoked one was answered 409 LeaseLost
(no fenceToken, so the agent's sinks were not fenced) and its Lease never let go
(the operator waited its whole duration), and every other one was lost. A
liveness-probe restart of the sidecar container did this. The released Lease now
names the identity that released it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from agentq import GROUP, VERSION, claims, protocol
from agentq.sidecar.kubeapi import custom_path, lease_path
from agentq.views import lease_view, worker_view
from harness import run
from sidecar_fakes import NS, FakeApi, Sidecar, agent, agent_task, task_lease, wait_for

WORKER_LEASE = lease_path(NS, "agentq-worker-w")


def _claims(api: FakeApi) -> dict[str, Any]:
    """Two claims of worker w: ``job`` (token 7) revoked by the operator (its task
    cancelled), ``other`` (token 3) running."""
    revoked = task_lease("job", token=7)
    revoked["metadata"]["annotations"][protocol.ANNOTATION_REVOKED] = protocol.REVOKE_CANCELLED
    api.put(lease_path(NS, protocol.task_lease_name("job")), revoked)
    api.put(lease_path(NS, protocol.task_lease_name("other")), task_lease("other", token=3))
    for task in ("job", "other"):
        api.objects[custom_path(GROUP, VERSION, NS, "agenttasks", task)] = agent_task(task)
    return api.objects


async def _stopped_gracefully(api: FakeApi) -> None:
    """pod-1's sidecar held the worker Lease, then got SIGTERM: it released it."""
    first = Sidecar(api, identity="pod-1")
    await first.keeper.step()
    assert first.keeper.holding
    _claims(api)
    assert await first.keeper.release()
    released = api.objects[WORKER_LEASE]
    # What the operator sees is unchanged: the worker went at once.
    assert released["spec"]["holderIdentity"] is None
    assert released["spec"]["leaseDurationSeconds"] == 1
    worker = worker_view(
        {"metadata": {"name": "w", "namespace": NS}, "spec": {"capabilities": ["llm"]}}
    )
    readiness = claims.readiness(
        worker, lease_view(released), fresh=True, unlabelled=False, suspect=False
    )
    assert readiness[0] is claims.Readiness.LEASE_RELEASED


@contextlib.asynccontextmanager
async def _serving(sidecar: Sidecar) -> AsyncIterator[None]:
    """The sidecar takes the worker Lease, lists its task Leases and renews."""
    await sidecar.keeper.step()
    assert sidecar.keeper.holding
    stop = asyncio.Event()
    renewals = asyncio.create_task(sidecar.renewer.run(stop))
    try:
        async with sidecar.watching():
            await wait_for(lambda: sidecar.watcher.synced)
            yield
    finally:
        stop.set()
        sidecar.changes.notify()
        await renewals


@run
async def test_a_restart_in_the_same_pod_after_a_release_takes_the_claims_back() -> None:
    api = FakeApi()
    await _stopped_gracefully(api)
    again = Sidecar(api, identity="pod-1")  # the same pod's sidecar container, restarted
    client = await agent(again)
    try:
        async with _serving(again):
            listed = again.attempts
            await wait_for(lambda: "other" in listed.current or bool(listed.inherited))
            assert again.attempts.inherited == {}  # not taken for another pod's
            assert again.keeper.serve_from_rv == 0
            # The revoked claim's Lease is let go: the operator ends the task at once.
            job = lease_path(NS, protocol.task_lease_name("job"))
            await wait_for(lambda: api.objects[job]["spec"]["holderIdentity"] is None)
            beat = await client.post("/v1/assignments/job/heartbeat", json={"token": 7})
            body = await beat.json()
            assert (beat.status, body["error"]) == (409, "Cancelled")
            assert body["fenceToken"] == 8
            # The running claim is still this worker's, renewed for its agent.
            await wait_for(lambda: again.attempts.current["other"].state == "active")
            beat = await client.post("/v1/assignments/other/heartbeat", json={"token": 3})
            assert beat.status == 200, await beat.text()
        worker = api.objects[WORKER_LEASE]
        assert worker["spec"]["holderIdentity"] == "pod-1"
        assert protocol.ANNOTATION_RELEASED_BY not in worker["metadata"]["annotations"]
    finally:
        await client.close()


@run
async def test_another_pod_after_a_release_does_not_serve_the_claims() -> None:
    api = FakeApi()
    await _stopped_gracefully(api)
    other = Sidecar(api, identity="pod-2")  # the worker's next pod
    client = await agent(other)
    try:
        async with _serving(other):
            assert other.keeper.serve_from_rv > 0
            await wait_for(lambda: len(other.attempts.inherited) == 2)
            assert other.attempts.current == {}
            for task, token in (("job", 7), ("other", 3)):
                beat = await client.post(f"/v1/assignments/{task}/heartbeat", json={"token": token})
                assert (beat.status, (await beat.json())["error"]) == (409, "LeaseLost")
        worker = api.objects[WORKER_LEASE]
        assert worker["spec"]["holderIdentity"] == "pod-2"
        assert protocol.ANNOTATION_RELEASED_BY not in worker["metadata"]["annotations"]
    finally:
        await client.close()


@run
async def test_a_release_by_another_pod_is_not_taken_for_our_own() -> None:
    """pod-2 took the Lease over from pod-1 and released it in turn: a sidecar of pod-1
    finding it released does not adopt what pod-2 held."""
    api = FakeApi()
    await _stopped_gracefully(api)
    second = Sidecar(api, identity="pod-2")
    await second.keeper.step()
    assert await second.keeper.release()
    assert api.objects[WORKER_LEASE]["metadata"]["annotations"] == {
        protocol.ANNOTATION_RELEASED_BY: "pod-2"
    }
    first = Sidecar(api, identity="pod-1")
    await first.keeper.step()
    assert first.keeper.holding and first.keeper.serve_from_rv > 0
