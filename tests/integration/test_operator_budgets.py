"""Provider budgets on the real API server, with real sidecars and agents (docs/budgets.md,
issue 21): requests per minute paced and never over the limit in a sliding minute,
maxConcurrent never exceeded, a restart mid-minute granting nothing the minute has no
room for, an unknown budget a condition (not a crash). Grant times are read back from
the task statuses."""

from __future__ import annotations

import datetime
import time
from collections.abc import Iterator
from typing import Any

import pytest

from agentq import GROUP, VERSION
from agentq.clock import parse_time
from builders import budget, task, worker
from fleet import Fleet

FAST = ("--leader-lease-seconds", "4")  # a killed leader's successor waits seconds, not 15


@pytest.fixture
def budgets(fleet: Fleet) -> Iterator[list[str]]:
    """The AgentBudgets a test creates (cluster-scoped: named after the fleet's namespace,
    deleted after the test)."""
    made: list[str] = []
    try:
        yield made
    finally:
        for name in made:
            fleet.custom.delete_cluster_custom_object(GROUP, VERSION, "agentbudgets", name)


def make(fleet: Fleet, made: list[str], suffix: str, **limits: int) -> str:
    name = f"{fleet.namespace}-{suffix}"
    builder = budget(name)
    for field, value in limits.items():
        builder = builder.set(f"spec.{field}", value)
    fleet.custom.create_cluster_custom_object(GROUP, VERSION, "agentbudgets", builder.obj())
    made.append(name)
    return name


def phase(t: dict[str, Any]) -> str | None:
    return (t.get("status") or {}).get("phase")


def assigned_at(t: dict[str, Any]) -> datetime.datetime:
    at = parse_time((t.get("status") or {}).get("assignedAt"))
    assert at is not None, t.get("status")
    return at


def most_in_a_minute(times: list[datetime.datetime]) -> int:
    times = sorted(times)
    return max(
        sum(1 for later in times[i:] if (later - start).total_seconds() < 60)
        for i, start in enumerate(times)
    )


def test_60_requests_a_minute_spread_30_one_request_tasks_over_29_seconds(
    fleet: Fleet, budgets: list[str]
) -> None:
    name = make(fleet, budgets, "rpm", requestsPerMinute=60)
    fleet.add_worker(worker("pool").capabilities("llm").max_in_flight(30))
    fleet.agent("pool", "complete", work_seconds=0.1)
    fleet.operator()
    for i in range(30):
        fleet.add_task(task(f"t-{i:02d}").requires("llm").budget(name))
    seen: dict[str, float] = {}  # first seen granted, by the test's clock (0.1 s polls)
    deadline = time.monotonic() + 90
    while len(seen) < 30:
        assert time.monotonic() < deadline, (len(seen), fleet.logs())
        for t in fleet.tasks():
            if phase(t) not in (None, "Pending"):
                seen.setdefault(t["metadata"]["name"], time.monotonic())
        time.sleep(0.1)
    done = fleet.wait_all(lambda items: all(phase(t) == "Succeeded" for t in items), timeout=60)
    times = sorted(assigned_at(t) for t in done)  # whole seconds, from the statuses
    assert all(t["status"]["attempt"] == 1 for t in done)
    spread = max(seen.values()) - min(seen.values())
    print(
        f"30 grants at 60/min: spread {(times[-1] - times[0]).total_seconds():.0f} s by the "
        f"statuses, {spread:.1f} s polled; most in a minute {most_in_a_minute(times)}"
    )
    # The pace: one a second, so over >= 29 s (a second lost to the statuses' rounding).
    assert (times[-1] - times[0]).total_seconds() >= 28, times
    assert spread >= 28.0, sorted(seen.values())  # (each poll 0.1 s late or so)
    # Never two grants in the same second (the pace spaces them by one), nor more than
    # 60 in any sliding minute.
    per_second = max(times.count(t) for t in times)
    assert per_second <= 2, times
    assert most_in_a_minute(times) <= 60


def test_max_concurrent_2_is_never_exceeded(fleet: Fleet, budgets: list[str]) -> None:
    name = make(fleet, budgets, "mc", maxConcurrent=2)
    fleet.add_worker(worker("pool").capabilities("llm").max_in_flight(8))
    fleet.agent("pool", "complete", work_seconds=0.5)
    fleet.operator()
    for i in range(8):
        fleet.add_task(task(f"c-{i}").requires("llm").budget(name, requests=0))
    fleet.add_task(task("free").requires("llm"))  # no budget: not held back by it
    most = 0
    deadline = time.monotonic() + 90
    while True:
        items = fleet.tasks()
        held = sum(
            1
            for t in items
            if t["metadata"]["name"].startswith("c-") and phase(t) in ("Assigned", "Running")
        )
        most = max(most, held)
        assert held <= 2, [(t["metadata"]["name"], phase(t)) for t in items]
        if all(phase(t) == "Succeeded" for t in items):
            break
        assert time.monotonic() < deadline, fleet.logs()
        time.sleep(0.05)
    assert most == 2  # the budget was the bottleneck, and used
    free = fleet.task("free")
    firsts = sorted(assigned_at(t) for t in items if t["metadata"]["name"].startswith("c-"))
    assert assigned_at(free) <= firsts[2], "the task without budgets waited behind them"
    # The leader's report on the budget (RBAC: agentbudgets/status patch), its window
    # what a new leader restores from.
    deadline = time.monotonic() + 30
    while True:
        body = fleet.custom.get_cluster_custom_object(GROUP, VERSION, "agentbudgets", name)
        status = body.get("status") or {}
        if status.get("inUse") == 0 and status.get("availableConcurrency") == 2:
            break
        assert time.monotonic() < deadline, status
        time.sleep(0.2)
    assert status["window"]["bucketSeconds"] == 5 and status["observedGeneration"] == 1


def test_a_restart_mid_minute_grants_nothing_the_minute_has_no_room_for(
    fleet: Fleet, budgets: list[str]
) -> None:
    name = make(fleet, budgets, "restart", requestsPerMinute=1)
    fleet.add_worker(worker("pool").capabilities("llm").max_in_flight(4))
    fleet.agent("pool", "complete", work_seconds=0.1)
    first = fleet.operator(*FAST)
    fleet.add_task(task("one").requires("llm").budget(name))
    fleet.wait_phase("one", "Succeeded", timeout=60)
    fleet.add_task(task("two").requires("llm").budget(name))
    time.sleep(1.0)  # refused (the minute is spent): it waits
    assert phase(fleet.task("two")) in (None, "Pending")
    first.kill()  # mid-minute: the book of the minute is lost with the process
    killed = time.monotonic()
    fleet.operator(*FAST)
    # The new leader dispatches (a task without budgets goes through) ...
    fleet.add_task(task("plain").requires("llm"))
    fleet.wait_phase("plain", "Succeeded", timeout=60)
    # ... but not "two" while "one"'s request is in the last minute: restored from the
    # task statuses, the minute is still spent.
    body = fleet.wait_condition("two", "Budgeted", status="False", timeout=30)
    assert phase(body) in (None, "Pending"), body["status"]
    reasons = {c["type"]: c["reason"] for c in body["status"]["conditions"]}
    assert reasons["Budgeted"] == "RequestsPerMinute", reasons
    one = assigned_at(fleet.task("one"))
    two = assigned_at(fleet.wait_phase("two", "Succeeded", timeout=90))
    assert (two - one).total_seconds() >= 59, (one, two)  # one a minute, across the restart
    assert time.monotonic() - killed > 5


def test_an_unknown_budget_is_a_condition_not_a_crash(fleet: Fleet, budgets: list[str]) -> None:
    fleet.add_worker(worker("pool").capabilities("llm").max_in_flight(4))
    fleet.agent("pool", "complete", work_seconds=0.1)
    operator = fleet.operator()
    missing = f"{fleet.namespace}-later"
    fleet.add_task(task("waits").requires("llm").budget(missing))
    fleet.add_task(task("plain").requires("llm"))
    body = fleet.wait_condition("waits", "Budgeted", status="False", timeout=30)
    cond = next(c for c in body["status"]["conditions"] if c["type"] == "Budgeted")
    assert cond["reason"] == "BudgetNotFound" and missing in cond["message"], cond
    fleet.wait_reasons("waits", {"BudgetNotFound": 1})
    fleet.wait_phase("plain", "Succeeded", timeout=30)
    assert operator.popen.poll() is None  # still running
    make(fleet, budgets, "later", maxConcurrent=1)
    fleet.wait_phase("waits", "Succeeded", timeout=30)


def test_max_concurrent_holds_across_a_leader_failover(fleet: Fleet, budgets: list[str]) -> None:
    name = make(fleet, budgets, "failover", maxConcurrent=2)
    fleet.add_worker(worker("pool").capabilities("llm").max_in_flight(8))
    fleet.agent("pool", "complete", work_seconds=10.0)  # held across the takeover (<= 7 s)
    flags = ("--leader-election", *FAST)
    first = fleet.operator(*flags)
    deadline = time.monotonic() + 30
    while not fleet.leader():  # the first leads before the standby starts
        assert time.monotonic() < deadline, fleet.logs()
        time.sleep(0.1)
    second = fleet.operator(*flags)
    for i in range(4):
        fleet.add_task(task(f"f-{i}").requires("llm").budget(name, requests=0))
    killed = None
    most = 0
    deadline = time.monotonic() + 120
    while True:
        items = fleet.tasks()
        held = sum(1 for t in items if phase(t) in ("Assigned", "Running"))
        most = max(most, held)
        assert held <= 2, [(t["metadata"]["name"], phase(t)) for t in items]
        if killed is None and held == 2:
            leader = fleet.leader()
            (first if str(first.pid) in leader else second).kill()  # with 2 claims held
            killed = time.monotonic()
        if all(phase(t) == "Succeeded" for t in items):
            break
        assert time.monotonic() < deadline, fleet.logs()
        time.sleep(0.05)
    assert killed is not None and most == 2
    # The standby took over and granted the rest, never a third claim at once.
    assert all(t["status"]["attempt"] == 1 for t in items)
