"""The agent's long poll for assignments (``GET /v1/assignments?wait=S``): what ends it.

``until=offers`` (what the Python client asks for) ends only when an attempt is
offered or withdrawn (revoked, lost) after the agent's ``version``, or when the
sidecar stops serving; the agent's own reports and heartbeats, and the end of an
attempt after its report, do not wake it. Without ``until`` any change of the
listing ends it, as before. The sidecar is the in-memory one of
tests/sidecar_fakes.py; polls are real HTTP requests to its aiohttp app.
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import ClientResponse
from aiohttp.test_utils import TestClient

from agentq import protocol
from agentq.sidecar.changes import Changes
from agentq.sidecar.kubeapi import lease_path
from harness import run
from sidecar_fakes import NS, Sidecar, agent

# Long enough that a poll still waiting after a few hundred milliseconds was not woken.
WAIT = "wait=30"
QUIET = 0.3


def poll(client: TestClient[Any, Any], query: str) -> asyncio.Task[ClientResponse]:
    return asyncio.create_task(client.get(f"/v1/assignments?{query}"))


async def answered(task: asyncio.Task[ClientResponse]) -> tuple[int, dict[str, Any]]:
    """The poll's answer, which must come promptly."""
    response = await asyncio.wait_for(task, timeout=3.0)
    return response.status, await response.json()


async def still_waiting(task: asyncio.Task[ClientResponse]) -> bool:
    await asyncio.sleep(QUIET)
    return not task.done()


async def serving() -> tuple[Sidecar, TestClient[Any, Any]]:
    sidecar = Sidecar()
    sidecar.hold_worker_lease()
    return sidecar, await agent(sidecar)


def revoke(sidecar: Sidecar, task: str = "job") -> None:
    """The operator revokes the claim (a cancel); the watch sees it."""
    lease = sidecar.lease(task)
    lease["metadata"]["annotations"][protocol.ANNOTATION_REVOKED] = protocol.REVOKE_CANCELLED
    stored = sidecar.api.put(lease_path(NS, protocol.task_lease_name(task)), lease)
    sidecar.attempts.observe(stored, sidecar.clock.monotonic())
    sidecar.changes.notify()


def offer(sidecar: Sidecar, task: str, token: int) -> None:
    sidecar.grant(task, token=token)
    sidecar.changes.notify()


@run
async def test_an_offers_poll_sleeps_through_reports_and_beats_and_wakes_on_an_offer() -> None:
    """The poll woke at every change of the listing: three times per task (offered,
    reported, ended), each time encoding every assignment for a client that wanted only
    new ones; half the sidecar's CPU per task was its agent's HTTP."""
    sidecar, client = await serving()
    try:
        offer(sidecar, "job", 7)
        status, first = await answered(poll(client, WAIT))
        assert status == 200 and [a["task"] for a in first["assignments"]] == ["job"]
        waiting = poll(client, f"{WAIT}&after={first['version']}&until=offers")
        assert await still_waiting(waiting)
        beat = await client.post("/v1/assignments/job/heartbeat", json={"token": 7})
        assert beat.status == 200
        attempt = sidecar.attempts.current["job"]
        now = sidecar.clock.monotonic()
        sidecar.attempts.reported(attempt, sidecar.lease(), '{"outcome": "Succeeded"}', now)
        sidecar.changes.notify()
        assert await still_waiting(waiting), "woken by the agent's own report"
        sidecar.attempts.deleted(sidecar.lease())  # the operator committed it
        sidecar.changes.notify()
        assert await still_waiting(waiting), "woken by the end of a reported attempt"
        offer(sidecar, "next", 8)
        status, second = await answered(waiting)
        assert status == 200 and [a["task"] for a in second["assignments"]] == ["next"]
    finally:
        await client.close()


@run
async def test_a_plain_poll_still_ends_at_any_change_of_the_listing() -> None:
    sidecar, client = await serving()
    try:
        offer(sidecar, "job", 7)
        _, first = await answered(poll(client, WAIT))
        waiting = poll(client, f"{WAIT}&after={first['version']}")
        assert await still_waiting(waiting)
        attempt = sidecar.attempts.current["job"]
        now = sidecar.clock.monotonic()
        sidecar.attempts.reported(attempt, sidecar.lease(), '{"outcome": "Succeeded"}', now)
        sidecar.changes.notify()
        status, second = await answered(waiting)
        assert status == 200 and second["assignments"][0]["state"] == "reported"
    finally:
        await client.close()


@run
async def test_an_offers_poll_wakes_on_a_revocation_and_the_agent_hears_409_cancelled() -> None:
    sidecar, client = await serving()
    try:
        offer(sidecar, "job", 7)
        _, first = await answered(poll(client, WAIT))
        waiting = poll(client, f"{WAIT}&after={first['version']}&until=offers")
        assert await still_waiting(waiting)
        revoke(sidecar)
        status, second = await answered(waiting)
        assert status == 200 and second["assignments"] == []  # withdrawn
        beat = await client.post("/v1/assignments/job/heartbeat", json={"token": 7})
        assert (beat.status, (await beat.json())["error"]) == (409, "Cancelled")
    finally:
        await client.close()


@run
async def test_an_offers_poll_wakes_when_an_offered_lease_is_lost() -> None:
    sidecar, client = await serving()
    try:
        offer(sidecar, "job", 7)
        _, first = await answered(poll(client, WAIT))
        waiting = poll(client, f"{WAIT}&after={first['version']}&until=offers")
        assert await still_waiting(waiting)
        sidecar.attempts.deleted(sidecar.lease())  # reclaimed before any report
        sidecar.changes.notify()
        status, second = await answered(waiting)
        assert status == 200 and second["assignments"] == []
        beat = await client.post("/v1/assignments/job/heartbeat", json={"token": 7})
        assert (beat.status, (await beat.json())["error"]) == (409, "LeaseLost")
    finally:
        await client.close()


@run
async def test_a_poll_ends_503_when_the_worker_lease_is_lost_even_with_nothing_offered() -> None:
    """Without assignments, losing the worker Lease changed nothing a poll waited on:
    it waited its whole ``wait`` before it was told the sidecar was not ready."""
    sidecar, client = await serving()
    try:
        for query in (WAIT, f"{WAIT}&after=0&until=offers", f"{WAIT}&after=0"):
            sidecar.hold_worker_lease()
            waiting = poll(client, query)
            assert await still_waiting(waiting)
            sidecar.keeper.holding = False  # what the keeper does when it loses it
            sidecar.lost("the Lease is held by another pod")
            sidecar.changes.notify()
            status, body = await answered(waiting)
            assert (status, body["error"]) == (503, "NotReady"), query
    finally:
        await client.close()


@run
async def test_a_poll_ends_503_at_shutdown() -> None:
    sidecar, client = await serving()
    try:
        waiting = poll(client, f"{WAIT}&after=0&until=offers")
        assert await still_waiting(waiting)
        sidecar.agent_api.stopping = True  # what Sidecar._shutdown does, then notifies
        sidecar.changes.notify()
        status, body = await answered(waiting)
        assert (status, body["error"]) == (503, "ShuttingDown")
    finally:
        await client.close()


@run
async def test_an_offer_made_before_the_poll_arrives_is_answered_at_once() -> None:
    """The offer lands between the agent's last answer and its next poll: the poll
    must not wait for a later one."""
    sidecar, client = await serving()
    try:
        offer(sidecar, "job", 7)
        _, first = await answered(poll(client, WAIT))
        offer(sidecar, "next", 8)
        status, second = await answered(
            poll(client, f"{WAIT}&after={first['version']}&until=offers")
        )
        assert status == 200
        assert [a["task"] for a in second["assignments"]] == ["job", "next"]
    finally:
        await client.close()


@run
async def test_a_version_from_an_earlier_start_of_the_sidecar_is_answered_at_once() -> None:
    """After a restart the sidecar counts from 0: a version above its own is from the
    sidecar before, and the agent must see what this one offers."""
    sidecar, client = await serving()
    try:
        offer(sidecar, "job", 7)
        status, body = await answered(poll(client, f"{WAIT}&after=500&until=offers"))
        assert status == 200 and [a["task"] for a in body["assignments"]] == ["job"]
    finally:
        await client.close()


@run
async def test_until_takes_change_or_offers_only() -> None:
    _, client = await serving()
    try:
        for query, status in (("until=offers", 200), ("until=change", 200), ("until=new", 400)):
            response = await client.get(f"/v1/assignments?{query}")
            assert response.status == status, query
    finally:
        await client.close()


@run
async def test_wait_until_checks_its_condition_before_it_waits() -> None:
    """The change and its notify happen before the waiter first runs: it must not wait
    for a next notify that never comes."""
    changes = Changes()
    state = {"offered": 0}
    waiter = asyncio.create_task(changes.wait_until(lambda: state["offered"] > 0, 5.0))
    state["offered"] = 1
    changes.notify()
    assert await asyncio.wait_for(waiter, timeout=1.0) is True


@run
async def test_wait_until_is_woken_only_when_its_condition_holds() -> None:
    changes = Changes()
    state = {"offered": 0}
    checks = []

    def ready() -> bool:
        checks.append(state["offered"])
        return state["offered"] > 1

    waiter = asyncio.create_task(changes.wait_until(ready, 5.0))
    await asyncio.sleep(0)
    for offered in (0, 1, 2):
        state["offered"] = offered
        changes.notify()
        await asyncio.sleep(0)
        assert waiter.done() == (offered > 1)
    assert await waiter is True
    assert checks == [0, 0, 1, 2]
    assert await changes.wait_until(lambda: False, 0.01) is False
