"""Provider budgets on the real API server, with real sidecars and agents (docs/budgets.md,
issue 21): requests per minute paced and never over the limit in a sliding minute,
maxConcurrent never exceeded, a restart mid-minute granting nothing the minute has no
room for, an unknown budget a condition (not a crash). Grant times are read back from
the task statuses."""

from __future__ import annotations

import datetime
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import watch

from agentq import GROUP, VERSION, protocol
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


# -- what agents report: usage and throttles, through agent-sim and its sidecar ------------


def spread(items: list[dict[str, Any]]) -> float:
    times = sorted(assigned_at(t) for t in items)
    return (times[-1] - times[0]).total_seconds()


def test_reported_usage_brings_the_grant_rate_to_what_agents_spend(
    fleet: Fleet, budgets: list[str]
) -> None:
    # The case at ten times the rate: 60,000 tokens a minute and estimates of
    # 1,000 pace a grant a second; attempts that report 3,000 each bring it to one every
    # 3 s (the "two a minute" at 6,000). Side by side, the same ten tasks.
    spends = make(fleet, budgets, "spends", tokensPerMinute=60_000)
    quiet = make(fleet, budgets, "quiet", tokensPerMinute=60_000)
    fleet.add_worker(worker("pool").capabilities("llm").max_in_flight(20))
    fleet.agent("pool", "complete", work_seconds=0.1)
    usage = {spends: {"requests": 1, "tokens": 3000}}
    for i in range(10):
        fleet.add_task(
            task(f"s-{i}").requires("llm").budget(spends, tokens=1000).payload({"usage": usage})
        )
        fleet.add_task(task(f"q-{i}").requires("llm").budget(quiet, tokens=1000))
    fleet.operator()
    done = fleet.wait_all(lambda items: all(phase(t) == "Succeeded" for t in items), timeout=90)
    s = [t for t in done if t["metadata"]["name"].startswith("s-")]
    q = [t for t in done if t["metadata"]["name"].startswith("q-")]
    print(
        f"10 grants at 60,000 tokens/min: {spread(q):.0f} s by estimates, {spread(s):.0f} s at 3x"
    )
    assert spread(q) <= 13, sorted(assigned_at(t) for t in q)  # 9 s: one a second
    assert spread(s) >= 24, sorted(assigned_at(t) for t in s)  # 27 s: one every 3 s
    # Each ended attempt accounted what it reported, or its estimate when it reported none.
    assert {str(t["status"]["history"][-1].get("usage")) for t in s} == {
        str([{"name": spends, "requests": 1, "tokens": 3000}])
    }
    assert {str(t["status"]["history"][-1].get("usage")) for t in q} == {
        str([{"name": quiet, "requests": 1, "tokens": 1000}])
    }


def test_a_usage_report_lands_in_the_ending_attempts_history(
    fleet: Fleet, budgets: list[str]
) -> None:
    name = make(fleet, budgets, "hist", tokensPerMinute=10_000)
    fleet.add_worker(worker("pool").capabilities("llm").max_in_flight(2))
    fleet.agent("pool", "complete", work_seconds=0.1)
    fleet.operator()
    spent = {name: {"requests": 2, "tokens": 400}}  # fewer tokens than estimated
    fleet.add_task(task("t").requires("llm").budget(name, tokens=1000).payload({"usage": spent}))
    body = fleet.wait_phase("t", "Succeeded", timeout=30)
    (entry,) = body["status"]["history"]
    assert entry["usage"] == [{"name": name, "requests": 2, "tokens": 400}], entry


class LeaseLog:
    """Every version of the namespace's Leases, as a watch delivers them (in order, none
    coalesced): ``versions[name]`` is ``[(annotations, acquireTime, renewTime)]``."""

    def __init__(self, fleet: Fleet) -> None:
        self.versions: dict[str, list[tuple[dict[str, str], Any, Any]]] = {}
        self.watch = watch.Watch()
        self.stopped = False
        self.thread = threading.Thread(target=self._run, args=(fleet,), daemon=True)
        self.thread.start()

    def _run(self, fleet: Fleet) -> None:
        try:
            for event in self.watch.stream(
                fleet.leases.list_namespaced_lease, fleet.namespace, timeout_seconds=120
            ):
                lease = event["object"]
                self.versions.setdefault(lease.metadata.name, []).append(
                    (
                        dict(lease.metadata.annotations or {}),
                        lease.spec.acquire_time,
                        lease.spec.renew_time,
                    )
                )
        except Exception:
            if not self.stopped:
                raise

    def stop(self) -> None:
        self.stopped = True
        self.watch.stop()

    def granted(self, task_name: str) -> datetime.datetime:
        """When the task's (first) claim was granted: its Lease's acquireTime."""
        versions = self.versions[protocol.task_lease_name(task_name)]
        return min(v[1] for v in versions if v[1] is not None)

    def throttled(self, task_name: str) -> datetime.datetime | None:
        """When the sidecar wrote the task's throttle: the first version carrying it."""
        for notes, _, renewed in self.versions.get(protocol.task_lease_name(task_name), []):
            if protocol.ANNOTATION_THROTTLED in notes:
                return renewed  # type: ignore[no-any-return]
        return None


@pytest.fixture
def leases(fleet: Fleet) -> Iterator[LeaseLog]:
    log = LeaseLog(fleet)
    try:
        yield log
    finally:
        log.stop()


def test_a_429_stops_every_grant_on_its_budget_for_its_retry_after(
    fleet: Fleet, budgets: list[str], leases: LeaseLog
) -> None:
    name = make(fleet, budgets, "429")  # no limit: only the throttle gates it
    fleet.add_worker(worker("pool").capabilities("llm").max_in_flight(8))
    fleet.agent("pool", "complete", work_seconds=0.5)
    fleet.operator()
    throttle = {"budget": name, "retryAfterSeconds": 10}
    fleet.add_task(task("hit").requires("llm").budget(name).payload({"throttled": throttle}))
    deadline = time.monotonic() + 30  # the operator applied it: the budget says so
    while not any(
        c["type"] == "Throttled" and c["status"] == "True"
        for c in (
            fleet.custom.get_cluster_custom_object(GROUP, VERSION, "agentbudgets", name).get(
                "status"
            )
            or {}
        ).get("conditions")
        or []
    ):
        assert time.monotonic() < deadline, fleet.logs()
        time.sleep(0.1)
    for i in range(3):
        fleet.add_task(task(f"after-{i}").requires("llm").budget(name))
    fleet.add_task(task("plain").requires("llm"))  # names no budget: not held back
    fleet.wait_phase("plain", "Succeeded", timeout=30)
    waiting = fleet.wait_condition("after-0", "Budgeted", status="False", timeout=30)
    reasons = {c["type"]: c["reason"] for c in waiting["status"]["conditions"]}
    assert reasons["Budgeted"] == "Throttled", reasons
    for i in range(3):
        fleet.wait_phase(f"after-{i}", "Succeeded", timeout=30)
    hit = leases.throttled("hit")
    assert hit is not None, leases.versions
    after = [(leases.granted(f"after-{i}") - hit).total_seconds() for i in range(3)]
    plain = (leases.granted("plain") - hit).total_seconds()
    print(
        f"after a 429 with retry-after 10 s: plain granted at +{plain:.2f} s, the budget's at "
        + ", ".join(f"+{a:.2f} s" for a in sorted(after))
    )
    assert min(after) >= 10.0, after  # the pause runs from when the operator read it
    assert max(after) < 15.0, after  # and then ends
    assert plain < 10.0
