"""The operator's API slots: decisions first, Events and tidying up while none wait."""

from __future__ import annotations

import asyncio

import pytest

from agentq.clock import FakeClock
from agentq.operator.slots import Slots
from harness import run


async def _hold(slots: Slots, kind: str, log: list[str], name: str, release: asyncio.Event) -> None:
    async with getattr(slots, kind)():
        log.append(name)
        await release.wait()


@run
async def test_a_freed_slot_goes_to_a_waiting_decision_before_a_waiting_event() -> None:
    slots = Slots(1, clock=FakeClock())
    log: list[str] = []
    gates = {n: asyncio.Event() for n in ("first", "event", "decision")}
    first = asyncio.create_task(_hold(slots, "high", log, "first", gates["first"]))
    await asyncio.sleep(0)
    event = asyncio.create_task(_hold(slots, "low", log, "event", gates["event"]))
    await asyncio.sleep(0)
    decision = asyncio.create_task(_hold(slots, "high", log, "decision", gates["decision"]))
    await asyncio.sleep(0)
    assert log == ["first"] and slots.waiting == 1
    gates["first"].set()
    await asyncio.sleep(0.01)
    assert log == ["first", "decision"], "the decision came later but goes first"
    gates["decision"].set()
    await asyncio.sleep(0.01)
    assert log == ["first", "decision", "event"]
    gates["event"].set()
    await asyncio.gather(first, event, decision)
    assert slots.used == 0


@run
async def test_a_low_request_takes_a_free_slot_at_once_and_never_exceeds_the_size() -> None:
    slots = Slots(2, clock=FakeClock())
    log: list[str] = []
    gate = asyncio.Event()
    tasks = [
        asyncio.create_task(_hold(slots, kind, log, f"{kind}{i}", gate))
        for i, kind in enumerate(["low", "low", "high", "low"])
    ]
    await asyncio.sleep(0.01)
    assert log == ["low0", "low1"] and slots.used == 2
    gate.set()
    await asyncio.gather(*tasks)
    assert log[2:] == ["high2", "low3"] and slots.used == 0


@run
async def test_an_event_that_waited_too_long_goes_next_so_events_never_stop() -> None:
    clock = FakeClock()
    slots = Slots(1, clock=clock, max_wait=10.0)
    log: list[str] = []
    gates = [asyncio.Event() for _ in range(3)]
    a = asyncio.create_task(_hold(slots, "high", log, "a", gates[0]))
    await asyncio.sleep(0)
    event = asyncio.create_task(_hold(slots, "low", log, "event", asyncio.Event()))
    await asyncio.sleep(0)
    b = asyncio.create_task(_hold(slots, "high", log, "b", gates[1]))
    await asyncio.sleep(0)
    clock.advance(11.0)
    gates[0].set()
    await asyncio.sleep(0.01)
    assert log == ["a", "event"], "aged past max_wait: ahead of the waiting decision"
    event.cancel()
    gates[1].set()
    await asyncio.gather(a, b, event, return_exceptions=True)
    assert log == ["a", "event", "b"] and slots.used == 0


@run
async def test_a_waiter_cancelled_as_its_slot_is_handed_over_gives_the_slot_back() -> None:
    slots = Slots(1, clock=FakeClock())
    gate = asyncio.Event()
    log: list[str] = []
    holder = asyncio.create_task(_hold(slots, "high", log, "holder", gate))
    await asyncio.sleep(0)
    waiter = asyncio.create_task(_hold(slots, "high", log, "waiter", asyncio.Event()))
    await asyncio.sleep(0)
    gate.set()
    await asyncio.sleep(0)  # the holder releases and hands the slot to the waiter...
    waiter.cancel()  # ...which is cancelled before it runs
    await asyncio.gather(holder, waiter, return_exceptions=True)
    assert slots.used == 0
    async with slots.high():
        assert slots.used == 1


def test_at_least_one_slot() -> None:
    with pytest.raises(ValueError):
        Slots(0, clock=FakeClock())


@run
async def test_while_decisions_are_in_flight_low_requests_get_at_most_their_share() -> None:
    slots = Slots(16, clock=FakeClock())  # a share of 2
    log: list[str] = []
    gate, low_gate = asyncio.Event(), asyncio.Event()
    decision = asyncio.create_task(_hold(slots, "high", log, "decision", gate))
    await asyncio.sleep(0)
    lows = [asyncio.create_task(_hold(slots, "low", log, f"low{i}", low_gate)) for i in range(6)]
    await asyncio.sleep(0.01)
    assert log == ["decision", "low0", "low1"], "two of 15 free slots, not all"
    assert slots.used == 3 and slots.low_used == 2
    gate.set()  # no decision in flight any more: the rest go at once
    await asyncio.sleep(0.01)
    assert len(log) == 7 and slots.low_used == 6
    low_gate.set()
    await asyncio.gather(decision, *lows)
    assert (slots.used, slots.high_used, slots.low_used) == (0, 0, 0)


@run
async def test_a_low_request_waits_for_its_share_not_for_every_decision() -> None:
    slots = Slots(16, clock=FakeClock())
    log: list[str] = []
    gates = {n: asyncio.Event() for n in ("d", "low0", "low1", "low2")}
    d = asyncio.create_task(_hold(slots, "high", log, "d", gates["d"]))
    await asyncio.sleep(0)
    lows = [
        asyncio.create_task(_hold(slots, "low", log, f"low{i}", gates[f"low{i}"])) for i in range(3)
    ]
    await asyncio.sleep(0.01)
    assert log == ["d", "low0", "low1"]
    gates["low0"].set()  # a low slot frees while the decision still runs: the next low takes it
    await asyncio.sleep(0.01)
    assert log == ["d", "low0", "low1", "low2"] and slots.low_used == 2
    for g in gates.values():
        g.set()
    await asyncio.gather(d, *lows)
    assert slots.used == 0
