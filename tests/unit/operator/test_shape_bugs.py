"""Bugs found reading the controller for the store rebuild (issue 17), each with a test
that fails on the code before it."""

from __future__ import annotations

import asyncio
import copy

from agentq.clock import FakeClock
from agentq.operator.blind import BlindTime
from agentq.operator.store import Store
from agentq.operator.work import Stats
from builders import task
from harness import NS, Harness, run


@run
async def test_a_late_deletion_of_an_earlier_task_does_not_drop_the_one_recreated() -> None:
    """A task deleted and re-created under the same name: the new one's ADDED reached the
    controller first (a new leader's fresh LIST does that), the old one's DELETED after
    it. The DELETED was applied without comparing versions and dropped the new task from
    the cache: it was never dispatched."""
    h = Harness()
    h.worker("w1", "llm", lease_seconds=1000)
    h.task(task("t").requires("gpu"))  # no worker offers gpu: stays pending
    await h.settle()
    h.kube.hold_events()
    deleted = h.kube.remove("agenttasks", NS, "t")
    h.task(task("t").requires("llm"))  # re-created: a new uid, a newer resourceVersion
    recreated = h.kube.get("agenttasks", NS, "t")
    assert recreated is not None
    h.kube._held = None  # the held events are delivered below, in the other order
    h.controller.observe("agenttasks", "ADDED", copy.deepcopy(recreated))
    h.controller.observe("agenttasks", "DELETED", deleted)
    await h.settle()
    record = h.controller.store.tasks.get((NS, "t"))
    assert record is not None and record.view.uid == recreated["metadata"]["uid"]
    assert h.phase("t") == "Assigned", "the re-created task is dispatched"


def test_the_stall_watchdog_outlives_an_exception() -> None:
    """The watchdog task had no guard: one exception in it (a metrics call, a listener)
    ended it, and no stall was ever given back to the Leases again."""

    async def scenario() -> None:
        clock = FakeClock()
        blind = BlindTime(
            store=Store(),
            clock=clock,
            stats=Stats(),
            stall_seconds=1.0,
            silence_seconds=2.0,
            period=0.01,
        )
        real = blind.check
        calls = {"n": 0}

        def flaky() -> None:
            calls["n"] += 1
            if calls["n"] == 1:
                raise RuntimeError("boom")
            real()

        blind.check = flaky  # type: ignore[method-assign]
        blind.start()
        await asyncio.sleep(0.05)
        clock.advance(5.0)  # the process did not run for 5 s
        await asyncio.sleep(0.05)
        blind.stop()
        assert calls["n"] > 2, "the watchdog went on after the exception"
        assert blind.stats.stalls == 1 and blind.credits == 1

    asyncio.run(scenario())


@run
async def test_a_renewal_wakes_the_loop_only_when_it_may_need_a_decision() -> None:
    """Watch callbacks only record; the loop is woken for a Lease change that may need a
    decision (an Assigned claim's first renewal starts it), not for each renewal of a
    healthy Running claim (hundreds a second in a large fleet)."""
    h = Harness()
    h.worker("w1", "llm", lease_seconds=1000)
    h.task(task("t").requires("llm").lease(30))
    await h.settle()
    assert h.phase("t") == "Assigned"
    woken = h.controller._changed
    woken.clear()
    h.renew("t")
    assert woken.is_set(), "the first renewal of an Assigned claim waits for no timer"
    await h.settle()
    assert h.phase("t") == "Running"
    woken.clear()
    h.renew("t")
    h.renew_worker("w1")
    assert not woken.is_set(), "a renewal of a healthy claim wakes nothing"
    h.renew("t", progress="half way")
    assert not woken.is_set()
    await h.settle()
    h.clock.advance(11)
    await h.settle()
    assert h.status("t").get("progress") == "half way", "noted, and copied when due"
