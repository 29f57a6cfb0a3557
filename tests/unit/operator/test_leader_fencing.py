"""A leader whose lease may have passed to another replica sends no decision.

The chaos run found a worker over ``maxInFlight`` after a stalled leader resumed:
grants it had decided before the stall (queued for a write slot) went out after
the standby had taken over and filled the worker. Leader election cannot stop a
request already on the wire, but every decision write must be checked against
the lease (by our own monotonic clock) when it is about to be sent, not only
when it was decided.

Two replicas on the in-memory API server, each with its own ``LeaderElector``
on the shared fake clock.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import random
from typing import Any

import pytest
from elections import LEASE_SECONDS, RENEW_DEADLINE, elector, round_of

from agentq.operator.config import OperatorConfig
from agentq.operator.controller import Controller
from agentq.operator.port import Status
from builders import task
from harness import NS, Harness, run


def hold_slots(controller: Controller, gate: asyncio.Event) -> list[asyncio.Task[Any]]:
    """Occupy every write slot until ``gate`` is set: decisions queue behind them, as they
    do behind a drain's writes when the process is stopped."""

    async def hold() -> None:
        async with controller.slots.high():
            await gate.wait()

    return [asyncio.create_task(hold()) for _ in range(controller.slots.size)]


def active_on(h: Harness, worker: str) -> list[str]:
    out = []
    for (plural, _, name), body in h.kube.objects.items():
        status = body.get("status") or {}
        if (
            plural == "agenttasks"
            and status.get("worker") == worker
            and status.get("phase") in ("Assigned", "Running")
        ):
            out.append(name)
    return sorted(out)


@run
async def test_a_stalled_leader_does_not_send_grants_decided_before_a_standby_took_over() -> None:
    h = Harness()  # replica A
    a = h.controller
    config_b = OperatorConfig(
        leader_election=True, leader_namespace=NS, leader_lease_seconds=LEASE_SECONDS
    )
    b = Controller(kube=h.kube, clock=h.clock, config=config_b, rng=random.Random(2))
    h.kube.subscribe(lambda plural, kind, body: b.observe(plural, kind, body))
    b.set_synced()
    elector_a, elector_b = elector(h, "replica-a", a), elector(h, "replica-b", b)
    assert await round_of(elector_a)
    assert not await round_of(elector_b)  # B sees A's lease (and starts its own clock)

    h.worker("w", "llm", max_in_flight=1, lease_seconds=60)
    # An older task, failed once and waiting out its retry backoff (3 s).
    h.task(task("old").requires("llm").backoff(initial=3, max=3, jitter=0))
    await h.settle()
    h.renew("old")
    await h.settle()
    h.report("old", outcome="Failed", error={"reason": "Flaky", "message": "x", "retryable": True})
    await h.settle()
    assert h.phase("old") == "Pending" and h.status("old").get("notBefore")
    assert active_on(h, "w") == []

    # A newer task: A grants it to the free worker (the old one is not due yet) -- and
    # stops right there, its grant queued for a write slot.
    gate = asyncio.Event()
    holders = hold_slots(a, gate)
    await asyncio.sleep(0)
    h.task(task("new").requires("llm"))
    a.step()
    assert a.dispatcher.grants, "A decided a grant"

    # A is stopped for 5 s: its lease lapses and B takes over, sees the old task due,
    # grants it to w, which is then full.
    h.clock.advance(5.0)
    h.renew_worker("w")
    assert await round_of(elector_b), "B takes over once A's lease has lapsed on B's clock"
    assert b.leading
    await b.settle()
    assert active_on(h, "w") == ["old"]

    # A resumes: the grant it decided 5 s ago must not be sent.
    gate.set()
    await asyncio.gather(*holders)
    await asyncio.gather(*list(a.writes), return_exceptions=True)
    assert not elector_a.valid()
    assert active_on(h, "w") == ["old"], "two deciders put w over maxInFlight"
    assert h.phase("new") == "Pending"


@run
async def test_no_decision_write_leaves_after_the_renew_deadline() -> None:
    h = Harness()
    c = h.controller
    e = elector(h, "replica-a", c)
    assert await round_of(e)
    await c.tokens.refill()
    h.worker("w", "llm", max_in_flight=3, lease_seconds=60)
    for i in range(3):
        h.task(task(f"t{i}").requires("llm"))
    c.step()  # three grants decided, none sent yet
    assert len(c.dispatcher.grants) == 3
    h.clock.advance(RENEW_DEADLINE)  # the process stopped right after deciding
    await asyncio.gather(*list(c.writes), return_exceptions=True)
    assert h.kube.writes.get("agenttasks/status PATCH", 0) == 0
    assert all(h.phase(f"t{i}") == "Pending" for i in range(3))
    # Renewed in time again (no one else took over): the same tasks are granted.
    assert await round_of(e)
    await h.settle()
    assert active_on(h, "w") == ["t0", "t1", "t2"]


@run
async def test_a_shutdown_finishes_the_writes_of_decisions_made_and_decides_nothing_more() -> None:
    h = Harness(write_concurrency=1)
    c = h.controller
    e = elector(h, "replica-a", c)
    assert await round_of(e)
    await c.tokens.refill()
    h.worker("w", "llm", max_in_flight=3, lease_seconds=60)
    for i in range(2):
        h.task(task(f"t{i}").requires("llm"))
    gate = asyncio.Event()
    real = h.kube.patch_status
    sent: list[str] = []

    async def slow(*args: Any) -> Any:
        if args[0] == "agenttasks":
            sent.append(args[2])
            await gate.wait()  # on the wire, the reply not back yet
        return await real(*args)

    h.kube.patch_status = slow  # type: ignore[method-assign]
    c.step()  # two grants decided; the first is sent, the second waits for the slot
    for _ in range(5):
        await asyncio.sleep(0)
    assert sent == ["t0"]
    draining = asyncio.create_task(c.drain(timeout=5))
    await asyncio.sleep(0)
    h.task(task("late").requires("llm"))  # arrives during the drain: not decided
    c.set_leading(True)  # an election round that ends now changes nothing
    assert not c.may_decide()
    gate.set()
    await draining
    # Both grants made before the signal are whole (status and Lease); nothing else moved.
    assert active_on(h, "w") == ["t0", "t1"]
    assert h.lease("t0") is not None and h.lease("t1") is not None
    assert h.phase("late") == "Pending" and sent == ["t0", "t1"]


@run
async def test_a_new_leader_reads_the_tasks_before_it_decides_when_its_watch_is_behind() -> None:
    h = Harness()  # replica A leads
    config_b = OperatorConfig(
        leader_election=True, leader_namespace=NS, leader_lease_seconds=LEASE_SECONDS
    )
    b = Controller(kube=h.kube, clock=h.clock, config=config_b, rng=random.Random(2))
    lagging: list[tuple[str, str, Any]] = []  # B's watch: delivered only when we say
    h.kube.subscribe(lambda plural, kind, body: lagging.append((plural, kind, body)))

    def deliver() -> None:
        while lagging:
            b.observe(*lagging.pop(0))

    async def list_tasks() -> None:  # what the informer's fresh LIST hands the cache
        for (plural, _, _), body in list(h.kube.objects.items()):
            if plural == "agenttasks":
                b.observe(plural, "MODIFIED", copy.deepcopy(body))

    h.worker("w", "llm", max_in_flight=1, lease_seconds=60)
    h.task(task("first").requires("llm"))
    h.task(task("second").requires("llm"))
    deliver()
    b.set_synced()
    await h.settle()  # A grants the first task to w; B has not seen that yet
    assert active_on(h, "w") == ["first"]
    assert lagging

    b.catch_up = list_tasks
    b.set_leading(True)  # A went away; B takes over with its watch behind
    await b.settle()
    assert active_on(h, "w") == ["first"], "the new leader granted w a second task"
    deliver()
    await b.settle()
    assert active_on(h, "w") == ["first"] and h.phase("second") == "Pending"


@run
async def test_a_refused_election_round_is_logged_and_leads_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A 403 (or a 401 a fresh credential did not cure) used to raise as an unknown
    outcome; now it is a FORBIDDEN reply: the round fails and says why."""
    h = Harness()
    e = elector(h, "a", h.controller)
    h.kube.inject("get_lease", Status.FORBIDDEN)
    with caplog.at_level(logging.WARNING, logger="agentq.leader"):
        assert not await e.try_acquire_or_renew()
    assert "leader election refused" in caplog.text
    assert await e.try_acquire_or_renew()  # RBAC fixed: the next round leads
