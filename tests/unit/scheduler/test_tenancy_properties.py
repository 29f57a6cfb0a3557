"""Properties of hierarchical DRR by cost over a queue tree (docs/tenancy.md), by hypothesis.

- the heap index makes exactly the decisions of the full scan, over random tree
  changes (re-parenting, missing parents, refused cycles, removals), backlogs,
  exclusions, charges and refunds;
- at every level, among the backlogged children of a node, tags stay within
  ``[m, m + C / w_i]``, so over any time two siblings are both backlogged their
  normalized served costs differ by at most ``C / w_i + C / w_j`` -- including
  a queue that comes back from idle (it banks no credit);
- no backlogged leaf starves: it waits at most the decisions the bound allows;
- a passed-over queue keeps at most two of the largest tasks' credit;
- a decision examines a number of heap entries that does not grow with the
  number of queues (the scan: linearly).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentq.scheduler.tenancy import (
    CREDIT_CAP_TASKS,
    QueueCycleError,
    QueueSpec,
    QueueTree,
    ReferenceQueueTree,
    UnknownQueueError,
)

pytestmark = pytest.mark.unit

PROPERTY = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
EPS = 1e-7
NAMES = [f"q{i}" for i in range(8)]

weights = st.one_of(
    st.sampled_from([0.5, 1.0, 2.0, 3.0]),
    st.floats(min_value=0.1, max_value=10.0, allow_nan=False, allow_infinity=False),
)
costs = st.one_of(
    st.sampled_from([1.0, 0.25, 3.0]),
    st.floats(min_value=0.01, max_value=10.0, allow_nan=False, allow_infinity=False),
)


# -- the index against the scan --------------------------------------------------------------


@dataclass(frozen=True)
class Upsert:
    name: str
    parent: str | None
    weight: float


@dataclass(frozen=True)
class Remove:
    name: str


@dataclass(frozen=True)
class Pending:
    name: str
    count: int


@dataclass(frozen=True)
class Serve:
    exclude: frozenset[str]
    cost: float
    refund: bool


Op = Upsert | Remove | Pending | Serve

ops = st.lists(
    st.one_of(
        st.builds(Upsert, st.sampled_from(NAMES), st.none() | st.sampled_from(NAMES), weights),
        st.builds(Upsert, st.sampled_from(NAMES), st.none(), weights),
        st.builds(Remove, st.sampled_from(NAMES)),
        st.builds(Pending, st.sampled_from(NAMES), st.integers(0, 3)),
        st.builds(Pending, st.sampled_from(NAMES), st.integers(1, 3)),
        st.builds(
            Serve,
            st.one_of(st.just(frozenset()), st.frozensets(st.sampled_from(NAMES), max_size=3)),
            costs,
            st.booleans(),
        ),
        st.builds(Serve, st.just(frozenset()), costs, st.just(False)),
    ),
    min_size=5,
    max_size=80,
)


def apply(tree: QueueTree | ReferenceQueueTree, op: Op) -> object:
    """Apply ``op``; returns what was answered (or the error's type), for comparison."""
    try:
        if isinstance(op, Upsert):
            if op.parent == op.name:
                return "self-parent"
            tree.upsert_queue(QueueSpec(op.name, op.parent, op.weight))
            return None
        if isinstance(op, Remove):
            tree.remove_queue(op.name)
            return None
        if isinstance(op, Pending):
            tree.set_pending(op.name, op.count)
            return None
        leaf = tree.pick(op.exclude)
        if leaf is not None:
            assert leaf not in op.exclude
            charge = tree.charge(leaf, op.cost)
            if op.refund:
                tree.refund(charge)
        return leaf
    except (QueueCycleError, UnknownQueueError) as err:
        return type(err).__name__


@PROPERTY
@given(ops)
def test_the_heap_index_makes_exactly_the_decisions_of_the_scan(sequence: list[Op]) -> None:
    fast, scan = QueueTree(), ReferenceQueueTree()
    for op in sequence:
        assert apply(fast, op) == apply(scan, op), op
        assert fast.queues() == scan.queues()
        for name in fast.queues():
            assert fast.queue_state(name) == scan.queue_state(name), name
            assert fast.children(name) == scan.children(name)


@PROPERTY
@given(ops)
def test_a_pick_is_a_backlogged_attached_leaf_outside_the_exclusions_whenever_one_exists(
    sequence: list[Op],
) -> None:
    tree = QueueTree()
    for op in sequence:
        apply(tree, op)
        for exclude in (frozenset(), frozenset(NAMES[:3])):
            servable = {
                name
                for name in tree.queues()
                if not tree.children(name)
                and tree.queue_state(name).pending > 0
                and tree.queue_state(name).attached
                and name not in exclude
            }
            leaf = tree.pick(exclude)
            if servable:
                assert leaf in servable
            else:
                assert leaf is None


# -- shares at every level -------------------------------------------------------------------

# A tree: node i hangs under node parent[i] < i, or at the top level (None).
trees = st.lists(st.tuples(st.integers(0, 6), weights, st.booleans()), min_size=2, max_size=9).map(
    lambda rows: [(None if top or i == 0 else p % i, w) for i, (p, w, top) in enumerate(rows)]
)


@dataclass
class Sim:
    """A tree driven with every charge checked against the bound."""

    tree: QueueTree
    parents: dict[str, str | None]
    weights: dict[str, float]
    leaves: list[str]

    def siblings(self) -> dict[str | None, list[str]]:
        groups: dict[str | None, list[str]] = {}
        for name, parent in self.parents.items():
            groups.setdefault(parent, []).append(name)
        return groups


def build(shape: list[tuple[int | None, float]]) -> Sim:
    tree = QueueTree()
    parents: dict[str, str | None] = {}
    weights_: dict[str, float] = {}
    for i, (parent, weight) in enumerate(shape):
        name = f"q{i}"
        parents[name] = None if parent is None else f"q{parent}"
        weights_[name] = weight
        tree.upsert_queue(QueueSpec(name, parents[name], weight))
    leaves = [name for name in parents if not tree.children(name)]
    return Sim(tree, parents, weights_, leaves)


@PROPERTY
@given(
    trees,
    st.lists(st.tuples(costs, st.integers(0, 20), st.booleans()), min_size=20, max_size=150),
)
def test_siblings_share_by_weight_within_the_bound_at_every_level_idle_ones_bank_nothing(
    shape: list[tuple[int | None, float]], steps: list[tuple[float, int, bool]]
) -> None:
    sim = build(shape)
    tree = sim.tree
    for leaf in sim.leaves:
        tree.set_pending(leaf, 1)
    groups = sim.siblings()
    # Per pair of siblings: their served costs when both last became backlogged together.
    since: dict[tuple[str, str], tuple[float, float]] = {}

    def backlogged(name: str) -> bool:
        return tree.queue_state(name).backlogged

    for cost, toggle, idle in steps:
        # Now and then a leaf goes idle or comes back (a burst of arrivals).
        leaf = sim.leaves[toggle % len(sim.leaves)]
        if toggle < len(sim.leaves) * 2:
            tree.set_pending(leaf, 0 if idle else 1)
        # Open or close the windows: a pair is compared only while both are backlogged.
        for members in groups.values():
            for i in members:
                for j in members:
                    if i >= j:
                        continue
                    if backlogged(i) and backlogged(j):
                        since.setdefault(
                            (i, j),
                            (tree.queue_state(i).served_cost, tree.queue_state(j).served_cost),
                        )
                    else:
                        since.pop((i, j), None)
        chosen = tree.pick()
        if chosen is None:
            continue
        tree.charge(chosen, cost)
        c = tree.max_cost
        for members in groups.values():
            live = [n for n in members if backlogged(n)]
            if not live:
                continue
            tags = {n: tree.queue_state(n).tag for n in live}
            m = min(tags.values())
            for n in live:
                # The invariant: nobody is more than one of the largest tasks ahead.
                assert m - EPS <= tags[n] <= m + c / sim.weights[n] + EPS, (n, tags, m)
            for (i, j), (a0, b0) in since.items():
                if i not in live or j not in live:
                    continue
                a = tree.queue_state(i).served_cost - a0
                b = tree.queue_state(j).served_cost - b0
                wi, wj = sim.weights[i], sim.weights[j]
                # Golestani's SCFQ bound: also for a queue back from idle (no banked credit).
                assert abs(a / wi - b / wj) <= c / wi + c / wj + EPS, (i, j, a, b)


@PROPERTY
@given(trees, st.lists(costs, min_size=1, max_size=8), st.integers(50, 200))
def test_no_backlogged_leaf_waits_longer_than_the_bound_allows(
    shape: list[tuple[int | None, float]], cost_cycle: list[float], decisions: int
) -> None:
    sim = build(shape)
    tree = sim.tree
    for leaf in sim.leaves:
        tree.set_pending(leaf, 1)
    c, c_min = max(cost_cycle), min(cost_cycle)
    tree.charge(sim.leaves[0], c)  # C is known from the start (as after a first big task)
    # The most grants a leaf waits. Going up its path, let S be the cost served under
    # the path's queue x while the leaf waits (0 at the leaf): x's tag rises by at most
    # S / w_x, and a sibling j of x, at most C / w_x behind it at the start, is served
    # at most w_j (C + S) / w_x + C before x is picked again; S grows by those.
    bound: dict[str, int] = {}
    groups = sim.siblings()
    for leaf in sim.leaves:
        served, node = 0.0, leaf
        while True:
            parent = sim.parents[node]
            wx = sim.weights[node]
            served += sum(
                sim.weights[j] * (c + served) / wx + c for j in groups[parent] if j != node
            )
            if parent is None:
                break
            node = parent
        bound[leaf] = math.ceil(served / c_min) + 1
    waited = dict.fromkeys(sim.leaves, 0)
    for k in range(decisions):
        chosen = tree.pick()
        assert chosen is not None
        tree.charge(chosen, cost_cycle[k % len(cost_cycle)])
        for leaf in sim.leaves:
            waited[leaf] = 0 if leaf == chosen else waited[leaf] + 1
            assert waited[leaf] <= bound[leaf], (leaf, waited, bound)


@PROPERTY
@given(trees, st.lists(st.tuples(costs, st.integers(0, 8)), min_size=10, max_size=120))
def test_a_passed_over_queue_keeps_at_most_two_of_the_largest_tasks_of_credit(
    shape: list[tuple[int | None, float]], steps: list[tuple[float, int]]
) -> None:
    sim = build(shape)
    tree = sim.tree
    for leaf in sim.leaves:
        tree.set_pending(leaf, 1)
    for cost, blocked in steps:
        exclude = frozenset({sim.leaves[blocked % len(sim.leaves)]}) if blocked < 6 else frozenset()
        chosen = tree.pick(exclude)
        if chosen is None:
            continue
        charge = tree.charge(chosen, cost)
        for name in charge.path:
            credit = tree.queue_state(name).credit
            assert credit <= CREDIT_CAP_TASKS * tree.max_cost + EPS, (name, credit)


# -- the cost of a decision -------------------------------------------------------------------


def examined_per_decision(tree: QueueTree | ReferenceQueueTree, queues: int) -> float:
    for i in range(queues):
        tree.upsert_queue(QueueSpec(f"t{i:05d}", weight=1.0 + i % 4))
        tree.set_pending(f"t{i:05d}", 1)
    for k in range(queues):  # a warm-up round: every queue served once
        tree.charge(tree.pick() or "", 1.0 + k % 3)
    start, decisions = tree.examined, 2000
    for k in range(decisions):
        leaf = tree.pick()
        assert leaf is not None
        tree.charge(leaf, 1.0 + k % 3)
        if k % 50 == 0:  # arrivals and departures keep the backlog moving
            name = f"t{(k * 7) % queues:05d}"
            tree.set_pending(name, 0)
            tree.set_pending(name, 1)
    return (tree.examined - start) / decisions


def test_a_decision_examines_as_much_with_a_thousand_queues_as_with_sixteen() -> None:
    small, large = examined_per_decision(QueueTree(), 16), examined_per_decision(QueueTree(), 1024)
    scan_small = examined_per_decision(ReferenceQueueTree(), 16)
    scan_large = examined_per_decision(ReferenceQueueTree(), 1024)
    # The heap index: a few entries per decision whatever the number of queues.
    assert large <= 2 * small + 2, (small, large)
    assert large < 8
    # The scan: every queue, every decision (the yardstick the index is measured against).
    assert scan_large >= 32 * scan_small, (scan_small, scan_large)
