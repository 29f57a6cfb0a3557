"""The simulator: execution models, waits, crashes, capabilities, baselines and figures."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import replace

import pytest

from agentq.scheduler import Assignment, Scheduler, TaskSpec, WorkerSpec
from agentq.simulation import compare
from agentq.simulation.baselines import POLICIES, LeastLoaded, RoundRobin
from agentq.simulation.engine import Run, WorkerOutcome, simulate
from agentq.simulation.metrics import jain_index, percentile, summarize
from agentq.simulation.scenario import CapabilityDemand, Scenario, WorkerConfig, preset
from agentq.simulation.workload import SimTask, generate

pytestmark = pytest.mark.unit


def fleet(
    *workers: WorkerConfig,
    execution: str = "shared",
    lease_seconds: float = 30.0,
    tasks: int = 100,
    capability_mix: tuple[CapabilityDemand, ...] = (CapabilityDemand(frozenset(), 1.0),),
) -> Scenario:
    """A scenario for hand-made workloads (the arrival rate only matters to ``generate``)."""
    return Scenario(
        workers=workers,
        arrival_rate=1.0,
        load=None,
        execution=execution,
        lease_seconds=lease_seconds,
        tasks=tasks,
        capability_mix=capability_mix,
    )


def job(name: str, at: float, cost: float, *required: str) -> SimTask:
    return SimTask(name, at, cost, frozenset(required))


def completions(run: Run) -> dict[str, list[float]]:
    return {w.name: [t for t, _ in w.timeline] for w in run.workers}


# -- execution models -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("execution", "finish", "waits"),
    [
        ("shared", [10.0, 10.0], [0.0, 0.0]),  # both at half speed
        ("serial", [5.0, 10.0], [0.0, 5.0]),  # the second waits at the worker
        ("slots", [5.0, 5.0], [0.0, 0.0]),  # both at full speed
    ],
)
def test_execution_models(execution: str, finish: list[float], waits: list[float]) -> None:
    scenario = fleet(WorkerConfig("w", weight=1, speed=2.0), execution=execution)
    run = simulate(scenario, [job("a", 0.0, 10.0), job("b", 0.0, 10.0)], Scheduler(), name="drr")
    assert completions(run)["w"] == finish
    assert sorted(run.waits) == waits
    assert run.makespan == finish[-1]


def test_a_task_waits_in_the_queue_while_every_worker_is_full() -> None:
    scenario = fleet(WorkerConfig("w", speed=1.0, max_in_flight=1))
    run = simulate(scenario, [job("a", 0.0, 4.0), job("b", 1.0, 1.0)], Scheduler(), name="drr")
    assert sorted(run.waits) == [0.0, 3.0]
    assert completions(run)["w"] == [4.0, 5.0]


# -- crashes --------------------------------------------------------------------------------


def test_a_crashed_workers_tasks_are_reclaimed_after_the_lease_and_done_elsewhere() -> None:
    scenario = fleet(
        WorkerConfig("a", speed=1.0, max_in_flight=1, crash_at=1.0),
        WorkerConfig("b", speed=1.0, max_in_flight=1),
        lease_seconds=10.0,
        execution="serial",
    )
    run = simulate(scenario, [job("t1", 0.0, 5.0), job("t2", 0.0, 5.0)], Scheduler(), name="drr")
    # t1 went to a, which died at 1; its lease expired at 11 and b (free since 5) took it.
    assert completions(run) == {"a": [], "b": [5.0, 16.0]}
    assert (run.reclaims, run.starved, run.unfinished) == (1, 0, 0)
    # Time lost on the dead worker is not queue wait: t1 waited again only from its
    # reclaim (11) to its re-grant (11).
    assert sorted(run.waits) == [0.0, 0.0]
    outcome = {w.name: w for w in run.workers}
    assert outcome["a"].uptime == 1.0


def test_nothing_is_dispatched_to_a_worker_once_its_lease_has_expired() -> None:
    scenario = fleet(
        WorkerConfig("a", max_in_flight=1, crash_at=0.5),
        WorkerConfig("b", max_in_flight=1),
        lease_seconds=2.0,
    )
    workload = [job(f"t{i}", float(i), 0.5) for i in range(10)]
    run = simulate(scenario, workload, Scheduler(), name="drr")
    assert completions(run)["a"] == []
    assert run.reclaims <= 2 and run.unfinished == 0


# -- capabilities ---------------------------------------------------------------------------


class Recording:
    """A policy wrapper that remembers every decision."""

    def __init__(self) -> None:
        self.inner = Scheduler()
        self.specs: dict[str, WorkerSpec] = {}
        self.decided: list[tuple[TaskSpec, Assignment]] = []

    def upsert_worker(self, spec: WorkerSpec) -> None:
        self.specs[spec.name] = spec
        self.inner.upsert_worker(spec)

    def plan(self, tasks: Sequence[TaskSpec]) -> list[Assignment]:
        decisions = self.inner.plan(tasks)
        by_name = {t.name: t for t in tasks}
        self.decided += [(by_name[d.task], d) for d in decisions]
        return decisions

    def release(self, task: str, *, completed: bool) -> None:
        self.inner.release(task, completed=completed)


def test_capabilities_hold_and_unsatisfiable_tasks_are_reported_starved() -> None:
    scenario = replace(preset("capabilities"), tasks=400)
    workload = generate(scenario)
    policy = Recording()
    run = simulate(scenario, workload, policy, name="drr")
    for task, decision in policy.decided:
        assert task.required <= policy.specs[decision.worker].capabilities
    assert run.starved == sum(1 for t in workload if t.required == {"tpu"})
    assert run.starved > 0 and run.unfinished == 0


# -- the baselines --------------------------------------------------------------------------


def test_round_robin_rotates_by_count_ignoring_weights() -> None:
    policy = RoundRobin()
    for name, weight in (("b", 4.0), ("a", 1.0), ("c", 2.0)):
        policy.upsert_worker(WorkerSpec(name, frozenset(), weight=weight, max_in_flight=10))
    decided = policy.plan([TaskSpec(f"t{i}", frozenset(), 1.0 + i) for i in range(7)])
    assert [d.worker for d in decided] == ["a", "b", "c", "a", "b", "c", "a"]


def test_round_robin_skips_workers_that_cannot_take_the_task() -> None:
    policy = RoundRobin()
    policy.upsert_worker(WorkerSpec("a", frozenset({"gpu"}), max_in_flight=5))
    policy.upsert_worker(WorkerSpec("b", frozenset(), max_in_flight=1))
    policy.upsert_worker(WorkerSpec("c", frozenset(), max_in_flight=5, paused=True))
    decided = policy.plan([TaskSpec(f"t{i}", frozenset(), 1.0) for i in range(4)])
    assert [d.worker for d in decided] == ["a", "b", "a", "a"]
    assert policy.plan([TaskSpec("g", frozenset({"tpu"}), 1.0)]) == []


def test_least_loaded_takes_the_fewest_tasks_in_flight_then_the_name() -> None:
    policy = LeastLoaded()
    for name in ("a", "b", "c"):
        policy.upsert_worker(WorkerSpec(name, frozenset(), max_in_flight=10))
    first = policy.plan([TaskSpec(f"t{i}", frozenset(), 9.0 if i == 0 else 1.0) for i in range(4)])
    assert [d.worker for d in first] == ["a", "b", "c", "a"]
    policy.release("t1", completed=True)
    assert policy.plan([TaskSpec("u", frozenset(), 1.0)])[0].worker == "b"


# -- figures --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "q", "expected"),
    [([], 50, None), ([3.0], 99, 3.0), ([1.0, 2.0, 3.0, 4.0], 50, 2.5), ([0.0, 10.0], 99, 9.9)],
)
def test_percentile(values: list[float], q: float, expected: float | None) -> None:
    assert percentile(values, q) == (None if expected is None else pytest.approx(expected))


def test_jain_index_is_one_when_equal_and_one_over_n_when_one_takes_all() -> None:
    assert jain_index([2.0, 2.0, 2.0]) == pytest.approx(1.0)
    assert jain_index([5.0, 0.0, 0.0, 0.0]) == pytest.approx(0.25)
    assert jain_index([]) is None


def test_share_error_is_in_units_of_the_largest_task_and_uses_uptime() -> None:
    run = Run(
        policy="p",
        workers=(
            WorkerOutcome("a", 1.0, uptime=100.0, served=30.0, completed=3, timeline=()),
            WorkerOutcome("b", 1.0, uptime=50.0, served=15.0, completed=1, timeline=()),
        ),
        waits=(1.0,),
        makespan=100.0,
        starved=0,
        unfinished=0,
        reclaims=0,
        max_cost=5.0,
    )
    summary = summarize(run)
    # b was up half the time: entitled to a third of the 45 served.
    assert summary.max_share_error == pytest.approx(0.0)
    assert summary.jain_index == pytest.approx(1.0)
    assert [s.weight_share for s in summary.shares] == pytest.approx([2 / 3, 1 / 3])


# -- the comparison the issue asks for ------------------------------------------------------


def test_the_same_seed_gives_the_same_results() -> None:
    scenario = replace(preset("weighted"), tasks=500)
    assert [s for _, s in compare(scenario)] == [s for _, s in compare(scenario)]


def test_weighted_pareto_workload_drr_meets_the_fairness_targets() -> None:
    """Weights 1:2:4, Pareto(1.5) costs (a smaller run than the docs' table)."""
    scenario = replace(preset("weighted"), tasks=3000)
    summaries = {s.policy: s for _, s in compare(scenario)}
    drr, rr = summaries["drr"], summaries["round-robin"]
    assert drr.max_share_error is not None and drr.max_share_error <= 1.0
    assert drr.jain_index is not None and drr.jain_index >= 0.99
    assert rr.max_share_error is not None and rr.max_share_error > drr.max_share_error
    assert drr.starved == 0 and set(summaries) == set(POLICIES)


def test_workloads_follow_the_capability_mix_and_arrive_in_order() -> None:
    scenario = fleet(
        WorkerConfig("w"),
        tasks=2000,
        capability_mix=(
            CapabilityDemand(frozenset({"x"}), 3.0),
            CapabilityDemand(frozenset(), 1.0),
        ),
    )
    workload = generate(scenario)
    assert len(workload) == 2000
    assert all(a.arrival < b.arrival for a, b in itertools.pairwise(workload))
    share_x = sum(1 for t in workload if t.required == {"x"}) / len(workload)
    assert 0.7 < share_x < 0.8
    assert min(t.cost for t in workload) >= scenario.cost.scale  # Pareto's minimum
