"""When more claims are due than a step may decide, the earliest expiry goes first, and the
writes nothing waits on (the ended attempts' Lease deletes) do not hold the decisions up.

500 claims of a dead worker expire within a second; a step decides at most
4 x WRITE_CONCURRENCY of them. The order and that budget decide how late the last
reclaim is (the p99 of the reclaim benchmark).
"""

from __future__ import annotations

import asyncio
from typing import Any

from prometheus_client import REGISTRY

from agentq.operator.work import Dirty
from builders import task
from harness import Harness, run


def test_dirty_pops_in_the_order_keys_were_first_marked() -> None:
    dirty = Dirty()
    dirty.update([("ns", "c"), ("ns", "a")])
    dirty.add(("ns", "b"))
    dirty.add(("ns", "c"))  # marked again: keeps its place
    dirty.discard(("ns", "a"))
    assert ("ns", "b") in dirty and ("ns", "a") not in dirty and len(dirty) == 2
    assert [dirty.pop(), dirty.pop()] == [("ns", "c"), ("ns", "b")]
    assert not dirty


async def held_by_w1(h: Harness, n: int, *, spread: float) -> list[str]:
    """``n`` claims of w1, renewed one after the other ``spread`` seconds apart."""
    h.worker("w1", "llm", lease_seconds=1000, max_in_flight=n)
    names = [f"t{i:02d}" for i in range(n)]
    for name in names:
        h.task(task(name).requires("llm").lease(3).backoff(initial=0).max_reclaims(5))
    await h.advance(0.5)
    for name in names:
        h.clock.advance(spread)
        h.renew(name)
    await h.settle()
    assert all(h.phase(name) == "Running" for name in names)
    return names


def reclaim_order(h: Harness) -> list[str]:
    order: list[str] = []

    def seen(plural: str, kind: str, body: Any) -> None:
        name = body["metadata"]["name"]
        reclaimed = (body.get("status") or {}).get("reclaims") == 1
        if plural == "agenttasks" and reclaimed and name not in order:
            order.append(name)

    h.kube.subscribe(seen)
    return order


async def steps(h: Harness, count: int) -> None:
    for _ in range(count):  # settle() would wait for held writes: step by hand
        h.controller.step()
        await asyncio.sleep(0.002)


@run
async def test_expiries_are_decided_earliest_first() -> None:
    h = Harness(write_concurrency=1)  # 4 decisions at a time
    names = await held_by_w1(h, 12, spread=0.01)
    order = reclaim_order(h)
    h.clock.advance(3.5)  # every claim expired, in the order they were renewed
    await h.settle()
    assert sorted(order) == names
    assert set(order[:4]) == set(names[:4]), order  # the first step's budget: the oldest


@run
async def test_writes_waiting_for_a_low_priority_slot_do_not_hold_up_the_decisions() -> None:
    h = Harness(write_concurrency=8)  # 32 decisions at a time
    names = await held_by_w1(h, 80, spread=0.0)
    # What a storm of reclaims leaves behind: Lease deletes (and Events) waiting for a
    # low-priority slot while the decisions' requests go first -- 100 of them here.
    later = asyncio.Event()
    for _ in range(100):
        h.controller.gate.spawn(later.wait())
    h.clock.advance(3.5)
    await steps(h, 20)  # 80 reclaims at 32 a step take 3 steps, not one step each
    assert all(h.status(name).get("reclaims") == 1 for name in names), [
        name for name in names if not h.status(name).get("reclaims")
    ]
    later.set()
    await h.settle()


def lag_samples() -> tuple[float, float]:
    count = REGISTRY.get_sample_value("agentq_expiry_lag_seconds_count") or 0.0
    total = REGISTRY.get_sample_value("agentq_expiry_lag_seconds_sum") or 0.0
    return count, total


@run
async def test_how_late_each_expiry_was_decided_is_measured() -> None:
    """``agentq_expiry_lag_seconds``: the reclaim benchmark's lateness, in production."""
    h = Harness()
    names = await held_by_w1(h, 3, spread=0.0)
    count0, sum0 = lag_samples()
    h.clock.advance(3 + 0.7)  # the operator looks 0.7 s after the claims expired
    await h.settle()
    assert all(h.status(name).get("reclaims") == 1 for name in names)
    count, total = lag_samples()
    assert count - count0 == 3
    assert 3 * 0.7 <= total - sum0 < 3 * 0.8


@run
async def test_a_token_refill_cancelled_before_it_ran_does_not_stop_dispatch_for_good() -> None:
    """Leadership lost in the very step that asked for a block of fencing tokens: the
    refill is cancelled before it runs. Back in the lead, tasks are dispatched again."""
    h = Harness()
    h.worker("w1", "llm")
    h.task(task("t").requires("llm"))
    h.controller.step()  # no token yet: a refill is spawned, not yet run
    assert h.controller.writes
    h.controller.set_leading(False)  # cancels every write, the refill before it ran
    await asyncio.sleep(0)
    h.controller.set_leading(True)
    await asyncio.wait_for(h.settle(), timeout=10)
    assert h.phase("t") == "Assigned"
