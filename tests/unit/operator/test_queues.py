"""AgentQueues in the operator (docs/tenancy.md): the verdict on a task's spec.queue, and
the two dispatch levels -- hierarchical DRR by cost between queues, then the worker-level
DRR -- on the in-memory API server."""

from __future__ import annotations

from collections import Counter

import pytest

from agentq.operator.port import Status
from agentq.operator.tenants import topology
from agentq.views import queue_view
from builders import queue, task
from harness import NS, Harness, run


def reason(h: Harness, name: str) -> tuple[str, str] | None:
    cond = h.condition(name, "Queued")
    return None if cond is None else (cond["status"], cond["reason"])


async def pool(h: Harness, *, slots: int = 1) -> None:
    h.namespace(NS, team="a")
    h.worker("w1", "llm", max_in_flight=slots, lease_seconds=100_000)
    await h.settle()


# -- verdicts ------------------------------------------------------------------------


@run
async def test_a_task_naming_a_missing_queue_waits_until_the_queue_exists() -> None:
    h = Harness()
    await pool(h)
    h.task(task("t").requires("llm").queue("team-a"))
    await h.settle()
    assert h.phase("t") == "Pending"
    assert reason(h, "t") == ("False", "QueueNotFound")
    assert "team-a" in h.condition("t", "Queued")["message"]  # type: ignore[index]
    h.queue(queue("team-a").selects(team="a").workers_in(NS))
    await h.settle()
    assert h.phase("t") == "Assigned"
    assert reason(h, "t") == ("True", "Admitted")


@run
async def test_a_namespace_the_selector_does_not_select_may_not_use_the_queue() -> None:
    h = Harness()
    await pool(h)
    h.namespace(NS, team="b")
    h.queue(queue("team-a").selects(team="a").workers_in(NS))
    h.queue(queue("nobody").workers_in(NS))  # no selector: no namespace
    h.task(task("t").requires("llm").queue("team-a"))
    h.task(task("u").requires("llm").queue("nobody"))
    await h.settle()
    assert reason(h, "t") == ("False", "QueueForbidden")
    assert reason(h, "u") == ("False", "QueueForbidden")
    assert h.phase("t") == "Pending"
    # The namespace's labels change: judged again, granted.
    h.namespace(NS, team="a")
    await h.settle()
    assert h.phase("t") == "Assigned"
    assert h.phase("u") == "Pending"


@run
async def test_inner_detached_and_cross_namespace_queues_hold_their_tasks() -> None:
    # An operator confined to its namespace: a queue whose workers are elsewhere is not
    # its to serve (NamespaceNotWatched); one watching every namespace serves it.
    h = Harness(namespaces=(NS,))
    await pool(h, slots=10)
    h.queue(queue("org").selects())
    h.queue(queue("team").parent("org").selects().workers_in(NS))
    h.queue(queue("orphan").parent("gone").selects().workers_in(NS))
    h.queue(queue("elsewhere").selects().workers_in("pool"))
    h.queue(queue("no-workers").selects())
    for name, named in [
        ("inner", "org"),
        ("detached", "orphan"),
        ("cross", "elsewhere"),
        ("nowhere", "no-workers"),
        ("leaf", "team"),
    ]:
        h.task(task(name).requires("llm").queue(named))
    await h.settle()
    assert reason(h, "inner") == ("False", "QueueNotLeaf")
    assert reason(h, "detached") == ("False", "QueueNotAttached")
    assert reason(h, "cross") == ("False", "NamespaceNotWatched")
    assert reason(h, "nowhere") == ("False", "NoWorkerNamespace")
    assert [h.phase(n) for n in ("inner", "detached", "cross", "nowhere")] == ["Pending"] * 4
    assert h.phase("leaf") == "Assigned"
    assert reason(h, "leaf") is None  # admitted at once: no condition written
    # The missing parent appears: the orphan is attached, its task granted.
    h.queue(queue("gone").selects())
    await h.settle()
    assert h.phase("detached") == "Assigned"
    # A queue deleted under a waiting task: QueueNotFound from then on.
    h.kube.remove("agentqueues", "", "elsewhere")
    await h.settle()
    assert reason(h, "cross") == ("False", "QueueNotFound")


def test_the_topology_names_cycles_and_missing_parents() -> None:
    views = {
        name: queue_view(queue(name).parent(parent).obj() if parent else queue(name).obj())
        for name, parent in [("a", "b"), ("b", "a"), ("c", "a"), ("top", None), ("x", "top")]
    }
    topo = topology(views)
    assert topo.depth == {"top": 0, "x": 1}
    assert set(topo.detached) == {"a", "b", "c"}
    assert "cycle" in topo.detached["a"]


# -- two levels ----------------------------------------------------------------------


async def serve(h: Harness, grants: int) -> list[str]:
    """Let the pool finish what it holds, one task at a time, ``grants`` times: the
    queue of each task granted, in order."""
    order: list[str] = []
    seen: set[str] = set()
    for _ in range(grants * 4):
        if len(order) >= grants:
            break
        running = [
            b["metadata"]["name"]
            for (plural, _ns, _n), b in list(h.kube.objects.items())
            if plural == "agenttasks" and (b.get("status") or {}).get("phase") == "Assigned"
        ]
        for name in sorted(running):
            if name not in seen:
                seen.add(name)
                order.append(name.split("-")[0])
        for name in running:
            h.renew(name)
            h.report(name, outcome="Succeeded", result={"ok": True})
        await h.settle()
    return order[:grants]


@pytest.mark.parametrize(("wa", "wb"), [(1, 1), (1, 3)])
@run
async def test_two_backlogged_queues_share_served_cost_by_weight(wa: int, wb: int) -> None:
    h = Harness()
    await pool(h, slots=1)
    h.queue(queue("qa").selects(team="a").workers_in(NS).weight(wa))
    h.queue(queue("qb").selects(team="a").workers_in(NS).weight(wb))
    for i in range(60):
        h.task(task(f"qa-{i:03d}").requires("llm").queue("qa"))
        h.task(task(f"qb-{i:03d}").requires("llm").queue("qb"))
    await h.settle()
    order = await serve(h, 40)
    # Both stay backlogged throughout: at every prefix, the DRR bound of one maximum task
    # cost per level, |a/wa - b/wb| <= C/wa + C/wb (C = 1).
    served: Counter[str] = Counter()
    for q in order:
        served[q] += 1
        assert abs(served["qa"] / wa - served["qb"] / wb) <= 1 / wa + 1 / wb + 1e-9, order
    assert served["qb"] == pytest.approx(40 * wb / (wa + wb), abs=2)


@run
async def test_a_late_queue_gets_its_share_at_once() -> None:
    h = Harness()
    await pool(h, slots=2)
    h.queue(queue("qa").selects(team="a").workers_in(NS))
    h.queue(queue("qb").selects(team="a").workers_in(NS))
    for i in range(120):
        h.task(task(f"qa-{i:03d}").requires("llm").queue("qa"))
    await h.settle()
    early = await serve(h, 20)
    assert set(early) == {"qa"}  # B has nothing yet: A takes every turn (lent)
    for i in range(40):
        h.task(task(f"qb-{i:03d}").requires("llm").queue("qb"))
    await h.settle()
    later = await serve(h, 40)
    assert later.count("qb") >= 0.45 * len(later), later


@run
async def test_tasks_without_a_queue_take_turns_as_their_namespaces_leaf() -> None:
    h = Harness()
    await pool(h, slots=1)
    h.queue(queue("qa").selects(team="a").workers_in(NS))
    for i in range(30):
        h.task(task(f"qa-{i:03d}").requires("llm").queue("qa"))
        h.task(task(f"plain-{i:03d}").requires("llm"))
    await h.settle()
    order = await serve(h, 20)
    assert 8 <= order.count("plain") <= 12, order


@run
async def test_max_in_flight_caps_a_queues_claims() -> None:
    h = Harness()
    await pool(h, slots=10)
    h.queue(queue("qa").selects(team="a").workers_in(NS).max_in_flight(2))
    for i in range(6):
        h.task(task(f"qa-{i:03d}").requires("llm").queue("qa"))
    h.task(task("plain-0").requires("llm"))
    await h.settle()
    phases = Counter(h.phase(f"qa-{i:03d}") for i in range(6))
    assert phases == {"Assigned": 2, "Pending": 4}
    assert h.phase("plain-0") == "Assigned"  # the cap holds its queue only
    h.renew("qa-000")
    h.report("qa-000", outcome="Succeeded", result={})
    await h.settle()
    phases = Counter(h.phase(f"qa-{i:03d}") for i in range(1, 6))
    assert phases == {"Assigned": 2, "Pending": 3}


@run
async def test_a_lost_grant_is_refunded_to_its_queue() -> None:
    h = Harness()
    await pool(h, slots=1)
    h.queue(queue("qa").selects(team="a").workers_in(NS))
    h.task(task("qa-000").requires("llm").queue("qa"))
    h.kube.inject("patch_status", Status.CONFLICT, when=lambda a: a[0] == "agenttasks")
    await h.settle()
    level = h.controller.cores.queues
    # The grant lost its compare-and-swap: charged, then refunded; the task waits for
    # the newer view the lost race announced.
    assert h.phase("qa-000") == "Pending"
    assert level.tree.queue_state("qa").served_cost == 0
    assert not level.granting
    h.kube.edit("agenttasks", NS, "qa-000", lambda b: b["spec"].__setitem__("priority", 1))
    await h.settle()
    assert h.phase("qa-000") == "Assigned"
    assert level.tree.queue_state("qa").served_cost == pytest.approx(1.0)


@run
async def test_the_invariants_catch_a_wrong_verdict_or_queue_claim() -> None:
    h = Harness()
    await pool(h)
    h.queue(queue("qa").selects(team="a").workers_in(NS))
    h.task(task("held").requires("llm").queue("missing"))
    h.task(task("qa-0").requires("llm").queue("qa"))
    await h.settle()
    c = h.controller
    assert not c.check_invariants()
    c.indexes.held[(NS, "held")] = ("QueueForbidden", "wrong")
    assert [v.index for v in c.check_invariants()] == ["tenancy"]
    c.indexes.held[(NS, "held")] = ("QueueNotFound", "x")
    del c.indexes.held[(NS, "held")]
    c.indexes.sync_task((NS, "held"), c.store.tasks[(NS, "held")])
    c.indexes.queue_claims["qa"] += 1
    assert [v.index for v in c.check_invariants()] == ["tenancy"]
    c.indexes.queue_claims["qa"] -= 1
    assert not c.check_invariants()
    c.indexes.queue_pending["qa"] += 1
    assert [v.index for v in c.check_invariants()] == ["tenancy"]
