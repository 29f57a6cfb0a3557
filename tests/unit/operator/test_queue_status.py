"""AgentQueue status and metrics (docs/tenancy.md), on the in-memory API server: what each
queue's status says, when it is written, and how its served cost outlives a leader."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from prometheus_client import REGISTRY

from agentq.operator.fake import Held
from agentq.operator.port import KubeError
from builders import queue, task
from harness import NS, Harness, run


def qstatus(h: Harness, name: str) -> dict[str, Any]:
    body = h.kube.get("agentqueues", "", name)
    assert body is not None, name
    status: dict[str, Any] = body.get("status") or {}
    return status


def qcond(h: Harness, name: str, kind: str) -> tuple[str, str] | None:
    for c in qstatus(h, name).get("conditions") or []:
        if c["type"] == kind:
            return c["status"], c["reason"]
    return None


def gauge(metric: str, name: str) -> float | None:
    return REGISTRY.get_sample_value(metric, {"queue": name})


def writes(h: Harness) -> int:
    return h.kube.writes["agentqueues/status PATCH"]


async def pool(h: Harness, *, slots: int = 1) -> None:
    h.namespace(NS, team="a")
    h.worker("w1", "llm", max_in_flight=slots, lease_seconds=100_000)
    await h.settle()


async def finish(h: Harness, names: list[str]) -> None:
    for name in names:
        h.renew(name)
        h.report(name, outcome="Succeeded", result={})
    await h.settle()


async def looked(h: Harness) -> None:
    """What changed applied, then a look at the statuses (at most once a second)."""
    await h.settle()
    await h.advance(1.5)


def assigned(h: Harness) -> list[str]:
    return sorted(
        b["metadata"]["name"]
        for (plural, _ns, _n), b in list(h.kube.objects.items())
        if plural == "agenttasks" and (b.get("status") or {}).get("phase") == "Assigned"
    )


@run
async def test_a_queue_status_counts_its_subtree_and_shares_by_weight() -> None:
    h = Harness(queue_status_interval=0.0)
    await pool(h, slots=2)
    h.queue(queue("org").selects(team="a"))
    h.queue(queue("qa").parent("org").selects(team="a").workers_in(NS).weight(1))
    h.queue(queue("qb").parent("org").selects(team="a").workers_in(NS).weight(3))
    h.queue(queue("solo").selects(team="a").workers_in(NS))
    for i in range(6):
        h.task(task(f"qa-{i}").requires("llm").queue("qa").cost(2))
        h.task(task(f"qb-{i}").requires("llm").queue("qb").cost(2))
    await looked(h)
    # Two slots: two tasks in flight, ten pending, under org.
    assert qstatus(h, "org")["inFlight"] == 2
    assert qstatus(h, "org")["pending"] == 10
    assert qstatus(h, "qa")["pending"] + qstatus(h, "qb")["pending"] == 10
    assert qstatus(h, "qa")["weightShare"] == 0.25
    assert qstatus(h, "qb")["weightShare"] == 0.75
    assert qstatus(h, "org")["weightShare"] == 0.5  # beside solo at the top level
    assert qstatus(h, "org")["servedCost"] == 4.0
    assert qstatus(h, "solo")["pending"] == 0
    assert qstatus(h, "solo")["share"] == 0.0  # its sibling org had every grant
    assert qstatus(h, "org")["share"] == 1.0
    for _ in range(4):
        await finish(h, assigned(h))
        await looked(h)
    a, b = qstatus(h, "qa"), qstatus(h, "qb")
    assert a["servedCost"] + b["servedCost"] == qstatus(h, "org")["servedCost"] == 20.0
    assert a["share"] + b["share"] == pytest.approx(1.0)
    assert b["share"] > a["share"]
    for name in ("org", "qa", "qb", "solo"):
        assert qcond(h, name, "Attached") == ("True", "Attached")
        assert qcond(h, name, "Ready") == ("True", "Ready")
    # The gauges say the same.
    assert gauge("agentq_queue_pending", "org") == qstatus(h, "org")["pending"]
    assert gauge("agentq_queue_in_flight", "org") == 2
    assert gauge("agentq_queue_served_cost", "org") == 20.0
    assert gauge("agentq_queue_share_error", "qb") == pytest.approx(b["share"] - 0.75)
    assert gauge("agentq_queue_share_error", "solo") == -0.5
    assert gauge("agentq_queue_weight_share", "qb") == 0.75
    assert gauge("agentq_queue_weight_share", "org") == 0.5


@run
async def test_a_queue_held_by_its_own_or_a_parents_cap_says_so_in_its_gauge() -> None:
    """agentq_queue_capped: a queue whose share its admin's maxInFlight holds down
    (its own or a parent's) is 1, so AgentqQueueBeyondShare does not call it unfair."""
    h = Harness(queue_status_interval=0.0)
    await pool(h, slots=4)
    h.queue(queue("org").selects(team="a").max_in_flight(2))
    h.queue(queue("capped").parent("org").selects(team="a").workers_in(NS).max_in_flight(1))
    h.queue(queue("under").parent("org").selects(team="a").workers_in(NS))
    h.queue(queue("free").selects(team="a").workers_in(NS))
    for i in range(3):
        for leaf in ("capped", "under", "free"):
            h.task(task(f"{leaf}-{i}").requires("llm").queue(leaf))
    await looked(h)
    assert qstatus(h, "capped")["inFlight"] == 1 and qstatus(h, "org")["inFlight"] == 2
    assert gauge("agentq_queue_capped", "capped") == 1  # its own cap
    assert gauge("agentq_queue_capped", "under") == 1  # org's cap, above it
    assert gauge("agentq_queue_capped", "org") == 1
    assert gauge("agentq_queue_capped", "free") == 0
    await finish(h, [n for n in assigned(h) if n.startswith("capped")])
    h.queue(queue("org").selects(team="a").max_in_flight(10))
    await looked(h)
    assert gauge("agentq_queue_capped", "under") == 0
    assert gauge("agentq_queue_capped", "org") == 0


@run
async def test_a_detached_queue_says_why_and_is_attached_at_once_when_its_parent_comes() -> None:
    h = Harness()
    await pool(h)
    h.queue(queue("orphan").parent("gone").selects(team="a").workers_in(NS))
    h.queue(queue("a").parent("b").selects())
    h.queue(queue("b").parent("a").selects())
    h.queue(queue("below").parent("a").selects().workers_in(NS))
    h.queue(queue("idle").selects())  # a leaf without workerNamespace
    h.task(task("t").requires("llm").queue("orphan"))
    await h.settle()
    assert qcond(h, "orphan", "Attached") == ("False", "ParentNotFound")
    assert qcond(h, "orphan", "Ready") == ("False", "NotAttached")
    message = next(c["message"] for c in qstatus(h, "orphan")["conditions"])
    assert "gone" in message
    assert qstatus(h, "orphan")["pending"] == 1  # its task waits, and counts
    for name in ("a", "b", "below"):
        assert qcond(h, name, "Attached") == ("False", "Cycle")
    assert "a -> b -> a" in qstatus(h, "below")["conditions"][0]["message"]
    assert qcond(h, "idle", "Ready") == ("False", "NoWorkerNamespace")
    assert qcond(h, "idle", "Attached") == ("True", "Attached")
    stamp = qstatus(h, "orphan")["conditions"][0]["lastTransitionTime"]
    # The parent appears: written at once (a change of conditions waits for no interval).
    h.clock.advance(2)
    h.queue(queue("gone").selects())
    await h.settle()
    assert qcond(h, "orphan", "Attached") == ("True", "Attached")
    assert qcond(h, "orphan", "Ready") == ("True", "Ready")
    assert qstatus(h, "orphan")["conditions"][0]["lastTransitionTime"] != stamp
    assert h.phase("t") == "Assigned"


@run
async def test_counts_are_written_at_most_once_an_interval_per_queue() -> None:
    h = Harness(queue_status_interval=10.0)
    await pool(h, slots=50)
    h.queue(queue("qa").selects(team="a").workers_in(NS))
    await h.settle()
    first = writes(h)
    assert first == 1  # its conditions, at once
    for i in range(40):
        h.task(task(f"qa-{i}").requires("llm").queue("qa"))
        await h.advance(0.2)  # grants trickle in for 8 s
    assert writes(h) == first, "count changes within the interval cost no write"
    await h.advance(3)
    assert writes(h) == first + 1
    assert qstatus(h, "qa")["inFlight"] == 40
    assert qstatus(h, "qa")["servedCost"] == 40.0
    await h.advance(30)
    assert writes(h) == first + 1, "nothing changed: nothing written"


@run
async def test_all_queue_writes_stay_within_the_rate() -> None:
    h = Harness(queue_status_qps=2.0)
    await pool(h)
    for i in range(20):
        h.queue(queue(f"q{i:02d}").selects(team="a").workers_in(NS))
    await h.settle()
    assert writes(h) <= 3  # the burst of two, and one more as time ticks
    for _ in range(12):
        await h.advance(1)
    assert writes(h) == 20
    assert all(qcond(h, f"q{i:02d}", "Ready") == ("True", "Ready") for i in range(20))


@run
async def test_one_write_per_queue_is_in_flight_and_a_lost_one_is_made_again() -> None:
    h = Harness()
    await pool(h)
    sent: list[str] = []
    h.kube.inject(  # counts every queue status write sent
        "patch_status",
        KubeError("never"),
        when=lambda a: a[:3] == ("agentqueues", "", "qa") and bool(sent.append(a[2])),
    )
    gate = asyncio.Event()
    h.kube.inject("patch_status", Held(gate), when=lambda a: a[:3] == ("agentqueues", "", "qa"))
    h.queue(queue("qa").parent("gone").selects(team="a").workers_in(NS))
    await h.steps(20)
    assert sent == ["qa"]
    h.queue(queue("gone").selects())  # its conditions change while the write is held
    for _ in range(5):
        h.clock.advance(1)
        await h.steps(5)
    assert sent == ["qa"], "no second write while the first is in flight"
    gate.set()
    await h.settle()
    assert sent == ["qa", "qa"]
    assert qcond(h, "qa", "Attached") == ("True", "Attached")
    # A write whose reply is lost is made again a moment later.
    h.kube.inject(
        "patch_status", KubeError("timeout"), when=lambda a: a[:3] == ("agentqueues", "", "qa")
    )
    h.kube.remove("agentqueues", "", "gone")
    await h.settle()
    assert qcond(h, "qa", "Attached") == ("True", "Attached"), "the write was lost"
    await looked(h)
    assert qcond(h, "qa", "Attached") == ("False", "ParentNotFound")


@run
async def test_served_cost_continues_from_the_status_after_a_new_leader() -> None:
    h = Harness(queue_status_interval=0.0)
    await pool(h, slots=3)
    h.queue(queue("org").selects(team="a"))
    h.queue(queue("qa").parent("org").selects(team="a").workers_in(NS))
    for i in range(3):
        h.task(task(f"qa-{i}").requires("llm").queue("qa").cost(2))
    await looked(h)
    assert qstatus(h, "qa")["servedCost"] == 6.0
    await finish(h, assigned(h))
    # Another replica leads for a while (it served 4 more), then this one again.
    h.controller.set_leading(False)
    h.kube.edit("agentqueues", "", "qa", lambda b: b["status"].__setitem__("servedCost", 10.0))
    h.kube.edit("agentqueues", "", "org", lambda b: b["status"].__setitem__("servedCost", 10.0))
    h.controller.set_leading(True)
    for i in range(3, 5):
        h.task(task(f"qa-{i}").requires("llm").queue("qa").cost(2))
    await looked(h)
    assert qstatus(h, "qa")["servedCost"] == 14.0
    assert qstatus(h, "org")["servedCost"] == 14.0
    assert "share" in qstatus(h, "qa")  # the window is the new lead's: 4 of 4
    assert qstatus(h, "qa")["share"] == 1.0


@run
async def test_a_deleted_queue_drops_its_series() -> None:
    h = Harness()
    await pool(h)
    h.queue(queue("gone-soon").selects(team="a").workers_in(NS))
    h.task(task("t").requires("llm").queue("gone-soon"))
    await looked(h)
    assert gauge("agentq_queue_in_flight", "gone-soon") == 1
    assert gauge("agentq_queue_weight_share", "gone-soon") == 1.0
    h.kube.remove("agentqueues", "", "gone-soon")
    await looked(h)
    assert gauge("agentq_queue_in_flight", "gone-soon") is None
    assert gauge("agentq_queue_pending", "gone-soon") is None
    assert gauge("agentq_queue_weight_share", "gone-soon") is None


@run
async def test_an_operator_confined_to_namespaces_writes_only_the_queues_of_its_workers() -> None:
    # AgentQueues are cluster-scoped: an operator watching some namespaces must not write
    # the counts of a queue whose workers it cannot see (another operator's), nor keep
    # its series; with every namespace watched, it writes them all.
    h = Harness(queue_status_interval=0.0, namespaces=(NS,))
    await pool(h)
    h.queue(queue("ours").selects(team="a").workers_in(NS))
    h.queue(queue("theirs").selects(team="a").workers_in("elsewhere"))
    h.queue(queue("mixed").selects(team="a"))
    h.queue(queue("mixed-ours").parent("mixed").selects(team="a").workers_in(NS))
    h.queue(queue("mixed-theirs").parent("mixed").selects(team="a").workers_in("elsewhere"))
    await looked(h)
    assert qcond(h, "ours", "Ready") == ("True", "Ready")
    assert qcond(h, "mixed-ours", "Ready") == ("True", "Ready")
    for name in ("theirs", "mixed", "mixed-theirs"):
        assert qstatus(h, name) == {}, name
        assert gauge("agentq_queue_pending", name) is None, name
        assert gauge("agentq_queue_weight_share", name) is None, name
