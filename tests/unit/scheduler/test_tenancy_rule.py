"""The queue tree's rule on cases small enough to read (docs/tenancy.md)."""

from __future__ import annotations

import pytest

from agentq.scheduler.tenancy import (
    QueueCycleError,
    QueueSpec,
    QueueTree,
    ReferenceQueueTree,
)

pytestmark = pytest.mark.unit

TREES = [QueueTree, ReferenceQueueTree]


def serve(tree: QueueTree | ReferenceQueueTree, decisions: int, cost: float = 1.0) -> list[str]:
    order = []
    for _ in range(decisions):
        leaf = tree.pick()
        assert leaf is not None
        tree.charge(leaf, cost)
        order.append(leaf)
    return order


@pytest.mark.parametrize("make", TREES)
def test_weights_one_to_three_give_one_quarter_and_three_quarters(make: type[QueueTree]) -> None:
    tree = make()
    tree.upsert_queue(QueueSpec("a", weight=1))
    tree.upsert_queue(QueueSpec("b", weight=3))
    tree.set_pending("a", 100)
    tree.set_pending("b", 100)
    order = serve(tree, 400)
    assert order.count("a") == 100 and order.count("b") == 300
    assert order[:8] == ["a", "b", "b", "b", "a", "b", "b", "b"]


@pytest.mark.parametrize("make", TREES)
def test_a_nested_tree_shares_at_each_level(make: type[QueueTree]) -> None:
    # orgs 2:1; two equal teams under the first
    tree = make()
    tree.upsert_queue(QueueSpec("org1", weight=2))
    tree.upsert_queue(QueueSpec("org2", weight=1))
    tree.upsert_queue(QueueSpec("t1", parent="org1"))
    tree.upsert_queue(QueueSpec("t2", parent="org1"))
    for leaf in ("t1", "t2", "org2"):
        tree.set_pending(leaf, 1)
    order = serve(tree, 300)
    assert (order.count("t1"), order.count("t2"), order.count("org2")) == (100, 100, 100)


@pytest.mark.parametrize("make", TREES)
def test_an_idle_queue_lends_its_share_and_comes_back_without_a_burst(
    make: type[QueueTree],
) -> None:
    tree = make()
    for name in ("a", "b"):
        tree.upsert_queue(QueueSpec(name))
    tree.set_pending("a", 1)
    assert set(serve(tree, 50)) == {"a"}  # b idle: a gets everything
    tree.set_pending("b", 1)
    # b joins even with a (ties by name): its half back at once, and no more --
    # it banked nothing while idle.
    assert serve(tree, 6) == ["a", "b", "a", "b", "a", "b"]


@pytest.mark.parametrize("make", TREES)
def test_a_cycle_is_refused_and_a_missing_parent_detaches(make: type[QueueTree]) -> None:
    tree = make()
    tree.upsert_queue(QueueSpec("team", parent="org"))  # org not there yet
    tree.set_pending("team", 3)
    assert not tree.queue_state("team").attached
    assert tree.pick() is None  # a detached queue is never served
    with pytest.raises(QueueCycleError):
        tree.upsert_queue(QueueSpec("org", parent="team"))
    assert tree.queues() == ["team"]
    tree.upsert_queue(QueueSpec("org"))
    assert tree.queue_state("team").attached
    assert tree.pick() == "team"
    tree.remove_queue("org")
    assert not tree.queue_state("team").attached
    assert tree.pick() is None


@pytest.mark.parametrize("make", TREES)
def test_a_refund_undoes_the_charge(make: type[QueueTree]) -> None:
    tree = make()
    for name in ("a", "b"):
        tree.upsert_queue(QueueSpec(name))
        tree.set_pending(name, 1)
    before = {n: tree.queue_state(n) for n in ("a", "b")}
    charge = tree.charge(tree.pick() or "", 2.0)
    tree.refund(charge)
    after = {n: tree.queue_state(n) for n in ("a", "b")}
    assert {n: s.tag for n, s in after.items()} == {n: s.tag for n, s in before.items()}
    assert after["a"].served_cost == 0.0
