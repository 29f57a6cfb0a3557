"""Properties of the dispatch rule over random fleets and workloads (hypothesis).

- the fast index makes exactly the decisions of the full-scan reference,
  avoid sets included;
- over a saturated backlog every worker's assigned cost stays within one
  maximum task cost of its entitlement (the DRR bound, in the form of
  Shreedhar & Varghese, and relative to the total where that holds); with
  avoid sets, a worker is ahead of it only by the cost of the tasks it took
  because a worker owed more was avoided;
- a task some available worker covers is always dispatched, and only there:
  outside its avoid set whenever an eligible worker outside it exists;
- no worker ever holds credit above the cap.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentq.scheduler import (
    Assignment,
    ReferenceScheduler,
    Scheduler,
    TaskSpec,
    WorkerSpec,
)
from agentq.scheduler.ledger import Ledger

pytestmark = pytest.mark.unit

PROPERTY = settings(
    max_examples=150,
    deadline=None,  # the machine may be busy; speed is the benchmark's business
    suppress_health_check=[HealthCheck.too_slow],
)

NAMES = ["a", "b", "c", "d", "e", "f"]
CAPABILITY_SETS = [
    frozenset(),
    frozenset({"x"}),
    frozenset({"y"}),
    frozenset({"x", "y"}),
    frozenset({"x", "y", "z"}),
]
EPS = 1e-9

weights = st.one_of(
    st.sampled_from([0.5, 1.0, 2.0, 4.0]),
    st.floats(min_value=0.1, max_value=10.0, allow_nan=False, allow_infinity=False),
)
costs = st.one_of(
    st.sampled_from([1.0, 0.25, 3.0]),
    st.floats(min_value=0.01, max_value=10.0, allow_nan=False, allow_infinity=False),
)
worker_specs = st.builds(
    WorkerSpec,
    name=st.sampled_from(NAMES),
    capabilities=st.sampled_from(CAPABILITY_SETS),
    weight=weights,
    max_in_flight=st.integers(min_value=1, max_value=4),
    paused=st.sampled_from([False, False, False, True]),
    ready=st.sampled_from([True, True, True, False]),
)


# -- random operation sequences ---------------------------------------------------------------


@dataclass(frozen=True)
class Upsert:
    spec: WorkerSpec


@dataclass(frozen=True)
class Remove:
    pick: int


@dataclass(frozen=True)
class Plan:
    tasks: tuple[tuple[frozenset[str], float, frozenset[str]], ...]  # (required, cost, avoid)


@dataclass(frozen=True)
class Abort:
    pick: int


@dataclass(frozen=True)
class Release:
    pick: int
    completed: bool


@dataclass(frozen=True)
class Restore:
    pick: int
    cost: float


Op = Upsert | Remove | Plan | Abort | Release | Restore

# Avoid sets as a re-dispatch gives them: empty for most tasks, else a worker or two
# (names of workers that may or may not exist).
avoid_sets = st.one_of(
    st.just(frozenset()),
    st.just(frozenset()),
    st.frozensets(st.sampled_from(NAMES), min_size=1, max_size=3),
)
plans = st.builds(
    Plan,
    st.lists(
        st.tuples(st.sampled_from(CAPABILITY_SETS[:4]), costs, avoid_sets), min_size=1, max_size=8
    ).map(tuple),
)
releases = st.builds(Release, st.integers(0, 50), st.booleans())
# A fleet first (so that most examples have several workers to choose between),
# then a run of operations weighted towards decisions and completions.
operations = st.tuples(
    st.lists(worker_specs, min_size=2, max_size=6, unique_by=lambda spec: spec.name).map(
        lambda specs: [Upsert(spec) for spec in specs]
    ),
    st.lists(
        st.one_of(
            plans,
            plans,
            releases,
            releases,
            st.builds(Upsert, worker_specs),
            st.builds(Remove, st.integers(0, 50)),
            st.builds(Abort, st.integers(0, 50)),
            st.builds(Restore, st.integers(0, 50), costs),
        ),
        min_size=5,
        max_size=60,
    ),
).map(lambda parts: [*parts[0], *parts[1]])


class Driver:
    """Applies the same operations to several cores and records what they answered."""

    def __init__(self, *cores: Ledger) -> None:
        self.cores = cores
        self.counter = 0
        self.recent: list[Assignment] = []  # this batch's decisions (abortable)
        self.held: list[str] = []
        self.specs: dict[str, WorkerSpec] = {}

    def apply(self, op: Op) -> list[object]:
        """Apply ``op`` to every core; returns each core's answer (where there is one)."""
        first = self.cores[0]
        if isinstance(op, Upsert):
            self.specs[op.spec.name] = op.spec
            for core in self.cores:
                core.upsert_worker(op.spec)
            return []
        if isinstance(op, Remove):
            names = first.workers()
            if not names:
                return []
            name = names[op.pick % len(names)]
            del self.specs[name]
            return [core.remove_worker(name) for core in self.cores]
        if isinstance(op, Plan):
            batch = []
            for required, cost, avoid in op.tasks:
                self.counter += 1
                batch.append(TaskSpec(f"t{self.counter}", required, cost, avoid))
            answers = [core.plan(batch) for core in self.cores]
            self.recent = list(answers[0])
            self.held.extend(a.task for a in answers[0])
            return list(answers)
        if isinstance(op, Abort):
            if not self.recent:
                return []
            decision = self.recent.pop(op.pick % len(self.recent))
            for core in self.cores:
                core.abort(decision)
            return []
        if isinstance(op, Release):
            if not self.held:
                return []
            name = self.held.pop(op.pick % len(self.held))
            for core in self.cores:
                core.release(name, completed=op.completed)
            return []
        names = first.workers()
        if not names:
            return []
        self.counter += 1
        restored = Assignment(f"r{self.counter}", names[op.pick % len(names)], op.cost)
        self.held.append(restored.task)
        for core in self.cores:
            core.restore(restored)
        return []


@PROPERTY
@given(operations, st.sampled_from([None, 0.5, 4.0]))
def test_the_index_makes_exactly_the_decisions_of_the_full_scan(
    ops: list[Op], credit_cap: float | None
) -> None:
    fast, reference = Scheduler(credit_cap=credit_cap), ReferenceScheduler(credit_cap=credit_cap)
    driver = Driver(fast, reference)
    for op in ops:
        answers = driver.apply(op)
        assert all(answer == answers[0] for answer in answers), op
        assert fast.workers() == reference.workers()
        for name in fast.workers():
            assert fast.worker_state(name) == reference.worker_state(name)
        assert fast.virtual_time == reference.virtual_time


@PROPERTY
@given(operations, st.sampled_from([None, 0.5, 4.0]))
def test_no_worker_ever_holds_credit_above_the_cap(ops: list[Op], credit_cap: float | None) -> None:
    core = Scheduler(credit_cap=credit_cap)
    driver = Driver(core)
    for op in ops:
        driver.apply(op)
        for name in core.workers():
            weight = driver.specs[name].weight
            assert core.worker_state(name).deficit <= weight * core.cap_rounds + EPS


# -- the DRR bound ------------------------------------------------------------------------------


@PROPERTY
@given(
    st.lists(weights, min_size=2, max_size=8),
    st.lists(costs, min_size=1, max_size=150),
    st.sampled_from(["hold", "complete"]),
    st.sampled_from([None, 1000.0]),
)
def test_a_saturated_backlog_keeps_every_share_within_one_max_task_cost(
    fleet_weights: list[float], task_costs: list[float], mode: str, credit_cap: float | None
) -> None:
    """Every worker covers every task and always has room; tasks either stay in
    flight ("hold") or complete before the next decision ("complete").

    With ``C`` the largest cost so far, ``a_i`` worker i's assigned cost and
    ``m = min_j a_j / w_j`` the rounds every worker has fully received:

    - (Shreedhar & Varghese) ``w_i * m <= a_i <= w_i * m + C``;
    - relative to the total ``T``: ``-C (n-1) w_i / W <= a_i - w_i T / W <= C (W - w_i) / W``,
      which is within one ``C`` whenever no weight exceeds ``W / (n - 1)``.
    """
    core = Scheduler(credit_cap=credit_cap)
    names = [f"w{i}" for i in range(len(fleet_weights))]
    for name, weight in zip(names, fleet_weights, strict=True):
        core.upsert_worker(WorkerSpec(name, frozenset(), weight=weight, max_in_flight=10_000))
    weight_of = dict(zip(names, fleet_weights, strict=True))
    total_weight = math.fsum(fleet_weights)
    n = len(names)
    assigned = dict.fromkeys(names, 0.0)
    largest = 0.0
    for index, cost in enumerate(task_costs):
        (decision,) = core.plan([TaskSpec(f"t{index}", frozenset(), cost)])
        if mode == "complete":
            core.release(decision.task, completed=True)
        assigned[decision.worker] += cost
        largest = max(largest, cost)
        total = math.fsum(assigned.values())
        rounds = min(assigned[name] / weight_of[name] for name in names)
        slack = EPS * (1 + total)
        for name in names:
            weight = weight_of[name]
            assert weight * rounds - slack <= assigned[name] <= weight * rounds + largest + slack
            error = assigned[name] - weight * total / total_weight
            assert error <= largest * (total_weight - weight) / total_weight + slack
            assert error >= -largest * (n - 1) * weight / total_weight - slack
            if max(fleet_weights) <= total_weight / (n - 1):
                assert abs(error) <= largest + slack


@PROPERTY
@given(
    st.lists(weights, min_size=2, max_size=8),
    st.lists(
        st.tuples(costs, st.frozensets(st.integers(0, 7), max_size=3)), min_size=1, max_size=150
    ),
    st.sampled_from(["hold", "complete"]),
)
def test_with_avoid_sets_a_worker_is_ahead_only_by_what_it_took_for_an_avoided_one(
    fleet_weights: list[float],
    workload: list[tuple[float, frozenset[int]]],
    mode: str,
) -> None:
    """The DRR bound with re-dispatch preferences: a saturated backlog as above, each
    task avoiding a few workers. An avoided worker is not charged (it keeps its credit),
    so the rule still gives each task to a worker owed the most among those it may
    take; a worker can run ahead of its share only by taking a task while a worker owed
    more was avoided. With ``E_i`` the cost of the tasks worker i took while some
    worker had fewer rounds (``a_j / w_j``) than it:

    - ``w_i * m <= a_i <= w_i * m + C + E_i`` (``E_i = 0`` without avoid sets: the
      bound above);
    - a task went past a worker owed more than the one that took it only because that
      worker was in its avoid set;
    - a worker outside the avoid set took the task whenever one existed.

    No cap (``credit_cap`` large): an avoided worker may fall behind by more than
    the default cap, and then forfeits credit by design (docs/scheduling.md).
    """
    core = Scheduler(credit_cap=1e12)
    names = [f"w{i}" for i in range(len(fleet_weights))]
    for name, weight in zip(names, fleet_weights, strict=True):
        core.upsert_worker(WorkerSpec(name, frozenset(), weight=weight, max_in_flight=10_000))
    weight_of = dict(zip(names, fleet_weights, strict=True))
    assigned = dict.fromkeys(names, 0.0)
    ahead = dict.fromkeys(names, 0.0)  # E_i
    largest = 0.0
    for index, (cost, picks) in enumerate(workload):
        avoid = frozenset(names[p % len(names)] for p in picks)
        rounds_before = {name: assigned[name] / weight_of[name] for name in names}
        least = min(rounds_before.values())
        total = math.fsum(assigned.values())
        slack = EPS * (1 + total + cost)
        (decision,) = core.plan([TaskSpec(f"t{index}", frozenset(), cost, avoid)])
        chosen = decision.worker
        if len(avoid) < len(names):
            assert chosen not in avoid
        # Every worker owed more than the chosen one (fewer rounds) was avoided.
        owed_more = {n for n in names if rounds_before[n] < rounds_before[chosen] - slack}
        assert owed_more <= avoid, (chosen, owed_more, avoid)
        if rounds_before[chosen] > least + slack:
            ahead[chosen] += cost
        if mode == "complete":
            core.release(decision.task, completed=True)
        assigned[chosen] += cost
        largest = max(largest, cost)
        total = math.fsum(assigned.values())
        rounds = min(assigned[name] / weight_of[name] for name in names)
        slack = EPS * (1 + total)
        for name in names:
            weight = weight_of[name]
            assert weight * rounds - slack <= assigned[name]
            assert assigned[name] <= weight * rounds + largest + ahead[name] + slack


def test_the_bound_relative_to_the_total_is_tight_for_a_dominant_worker() -> None:
    """Why the relative form needs ``w_i <= W / (n - 1)`` for "within one C": with
    weights 1:2:4, two maximal tasks at the start go to the light workers (ties
    by name) while the heavy one, entitled to 8/7 of a task, has nothing yet."""
    core = Scheduler()
    for name, weight in (("a", 1.0), ("b", 2.0), ("c", 4.0)):
        core.upsert_worker(WorkerSpec(name, frozenset(), weight=weight, max_in_flight=100))
    decided = core.plan([TaskSpec("t1", frozenset(), 1.0), TaskSpec("t2", frozenset(), 1.0)])
    assert [d.worker for d in decided] == ["a", "b"]
    entitled = 4.0 / 7.0 * 2.0  # c's weight share of the total assigned so far
    assert core.worker_state("c").in_flight_cost == 0.0
    assert entitled - 0.0 > 1.0  # more than one maximum task behind, for this instant
    # ...and the next decision repairs it at once.
    assert core.plan([TaskSpec("t3", frozenset(), 1.0)])[0].worker == "c"


# -- eligibility --------------------------------------------------------------------------------


@PROPERTY
@given(
    st.lists(worker_specs, min_size=0, max_size=8, unique_by=lambda spec: spec.name),
    st.lists(st.integers(min_value=0, max_value=4), min_size=8, max_size=8),
    st.lists(
        st.tuples(st.sampled_from(CAPABILITY_SETS), costs, avoid_sets), min_size=1, max_size=12
    ),
)
def test_a_task_some_available_worker_covers_is_dispatched_and_only_there(
    specs: list[WorkerSpec],
    loads: list[int],
    workload: list[tuple[frozenset[str], float, frozenset[str]]],
) -> None:
    core = Scheduler()
    for spec in specs:
        core.upsert_worker(spec)
    for spec, load in zip(specs, loads, strict=False):
        for k in range(min(load, spec.max_in_flight)):
            core.restore(Assignment(f"{spec.name}-held-{k}", spec.name, 1.0))
    by_name = {spec.name: spec for spec in specs}
    for index, (required, cost, avoid) in enumerate(workload):
        eligible = {
            spec.name
            for spec in specs
            if spec.ready
            and not spec.paused
            and core.worker_state(spec.name).in_flight < spec.max_in_flight
            and required <= spec.capabilities
        }
        decided = core.plan([TaskSpec(f"t{index}", required, cost, avoid)])
        if eligible:
            # An avoid set never leaves a task pending that some worker can take...
            assert len(decided) == 1
            assert decided[0].worker in eligible
            assert required <= by_name[decided[0].worker].capabilities
            # ...and sends it back to an avoided worker only if no other one can take it.
            if eligible - avoid:
                assert decided[0].worker not in avoid
        else:
            assert decided == []
