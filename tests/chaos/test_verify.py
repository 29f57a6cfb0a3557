"""The chaos verdict catches each violation it claims to (synthetic runs, no cluster)."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import pytest

from chaos.agents import SinkRow
from chaos.observe import Claim, Observations
from chaos.plan import Plan, TaskPlan, WorkerPlan
from chaos.verify import Collected, FaultRecord, verify

PLAN = Plan(
    seed=0,
    profile="test",
    workers=(
        WorkerPlan("w0", ("llm",), 1.0, 2, "complete", 0.1),
        WorkerPlan("w1", ("llm",), 1.0, 2, "complete", 0.1),
        WorkerPlan("p0", ("poison",), 1.0, 1, "fail", 0.1),
    ),
    tasks=(
        TaskPlan("a", ("llm",), 1.0, 6, 10),
        TaskPlan("b", ("llm",), 1.0, 6, 10),
        TaskPlan("x", ("poison",), 1.0, 6, 0),
    ),
    faults=(),
)


def _entry(token: int, worker: str, outcome: str, reason: str) -> dict[str, Any]:
    return {"token": token, "worker": worker, "outcome": outcome, "reason": reason, "time": "t"}


def _task(name: str, phase: str, token: int, worker: str, history: list[Any]) -> dict[str, Any]:
    status = {"phase": phase, "fencingToken": token, "worker": worker, "history": history}
    return {"metadata": {"name": name}, "status": status}


def _good() -> Collected:
    seen = Observations()
    seen.claims = {
        ("a", 1): Claim("a", 1, "w0", 10.0, 12.0),
        ("a", 2): Claim("a", 2, "w1", 20.0, 22.0),
        ("b", 1): Claim("b", 1, "w1", 10.0, 11.0),
        ("x", 1): Claim("x", 1, "p0", 10.0, 11.0),
    }
    return Collected(
        plan=PLAN,
        kit="test",
        reported_reasons=frozenset({"AgentError"}),
        tasks=[
            _task(
                "a",
                "Succeeded",
                2,
                "w1",
                [
                    _entry(1, "w0", "Failed", "LeaseExpired"),
                    _entry(2, "w1", "Succeeded", "Completed"),
                ],
            ),
            _task("b", "Succeeded", 1, "w1", [_entry(1, "w1", "Succeeded", "Completed")]),
            _task("x", "DeadLettered", 1, "p0", [_entry(1, "p0", "Failed", "AgentError")]),
        ],
        events=[],
        seen=seen,
        # w0 was killed while it held a's first claim: that reclaim is not a healthy one.
        faults=[FaultRecord("agent-kill", "w0", 11.0, 14.0)],
        reports={"a": {("w1", 2), ("w0", 1)}, "b": {("w1", 1)}},
        sink={"a": [SinkRow(2, "out")], "b": [SinkRow(1, "out")]},
        duration=30.0,
        end=40.0,
    )


def test_a_clean_run_passes_and_counts_its_claims() -> None:
    verdict = verify(_good())
    assert verdict.ok, (verdict.violations, verdict.liveness)
    f = verdict.figures
    assert (f["claims"], f["claims faulted"], f["claims healthy"]) == (4, 1, 3)
    assert f["reclaims by reason"] == {"LeaseExpired": 1}
    assert f["DeadLettered == poison set"] is True


def _breaks(change: Any) -> list[str]:
    collected = _good()
    collected.tasks = copy.deepcopy(collected.tasks)
    change(collected)
    return verify(collected).violations


def test_a_lost_task_is_a_violation() -> None:
    assert any("lost: b" in v for v in _breaks(lambda c: c.tasks.pop(1)))


def test_a_difference_between_the_operators_indexes_and_its_store_is_a_violation() -> None:
    assert any("invariants" in v for v in _breaks(lambda c: setattr(c, "invariant_violations", 1)))


def test_an_unfinished_task_is_a_violation() -> None:
    def running(c: Collected) -> None:
        c.tasks[1]["status"]["phase"] = "Running"

    assert any("not terminal" in v for v in _breaks(running))


def test_a_second_success_is_a_double_commit() -> None:
    def twice(c: Collected) -> None:
        c.tasks[1]["status"]["history"].append(_entry(1, "w1", "Succeeded", "Completed"))

    assert any("committed twice: b" in v for v in _breaks(twice))
    events = [{"reason": "Succeeded", "involvedObject": {"name": "b"}}] * 2
    assert any("committed twice: b" in v for v in _breaks(lambda c: c.events.extend(events)))


def test_a_result_not_from_the_final_token_is_a_violation() -> None:
    def stale(c: Collected) -> None:
        c.tasks[0]["status"]["fencingToken"] = 3

    assert any(v.startswith("result: a") for v in _breaks(stale))
    assert any(v.startswith("result: b") for v in _breaks(lambda c: c.reports.pop("b")))


@pytest.mark.parametrize(
    "rows", [[], [SinkRow(1, "old")], [SinkRow(2, "new"), SinkRow(1, "old")]], ids=str
)
def test_the_sink_must_hold_exactly_the_final_attempts_output(rows: list[SinkRow]) -> None:
    assert any("the sink holds" in v for v in _breaks(lambda c: c.sink.update(a=rows)))


def test_dead_letters_must_be_the_poison_set() -> None:
    def survived(c: Collected) -> None:
        c.tasks[2]["status"]["phase"] = "Succeeded"

    assert any("DeadLettered != poison set" in v for v in _breaks(survived))


def test_a_reclaimed_healthy_claim_is_the_liveness_failure() -> None:
    collected = _good()
    collected.faults = []  # w0 was never faulted: its reclaimed claim was healthy
    verdict = verify(collected)
    assert verdict.safe and not verdict.ok
    assert len(verdict.liveness) == 1 and verdict.liveness[0].startswith("a token 1 on w0")


def test_a_fault_outside_the_claims_life_does_not_excuse_a_reclaim() -> None:
    collected = _good()
    collected.faults = [FaultRecord("agent-stop", "w0", 30.0, 31.0)]
    assert len(verify(collected).liveness) == 1


def test_watch_violations_are_carried_over() -> None:
    collected = _good()
    collected.seen.violations.append("maxInFlight: w0 held 3 tasks (limit 2) at 5.0s")
    verdict = verify(collected)
    assert verdict.figures["maxInFlight exceeded"] == 1
    assert not verdict.safe


def test_a_failed_attempt_may_leave_output_but_not_under_a_token_never_issued() -> None:
    collected = _good()
    collected.sink = {**(collected.sink or {}), "x": [SinkRow(1, "failed attempt")]}
    assert verify(collected).safe
    collected.sink["x"] = [SinkRow(5, "from nowhere")]
    assert any("the sink holds token 5" in v for v in verify(collected).violations)


def _watcher() -> Any:
    from chaos.observe import TaskWatcher

    return TaskWatcher(
        None,  # type: ignore[arg-type]  # (never started: no API server is asked)
        "ns",
        {"w0": 4, "w1": 4},
        budgets={"a": "p", "b": "p", "c": "p"},
        budget_limits={"p": 2},
        clock=lambda: 0.0,
    )


def test_a_budget_over_its_max_concurrent_is_a_watch_violation() -> None:
    w = _watcher()
    w._apply("a", {"phase": "Assigned", "worker": "w0", "fencingToken": 1})
    w._apply("b", {"phase": "Running", "worker": "w1", "fencingToken": 1})
    w._apply("free", {"phase": "Running", "worker": "w1", "fencingToken": 1})  # no budget
    assert w.seen.violations == [] and w.seen.peak_budget_in_use["p"] == 2
    w._apply("a", {"phase": "Succeeded", "worker": "w0", "fencingToken": 1})
    w._apply("c", {"phase": "Assigned", "worker": "w0", "fencingToken": 1})
    assert w.seen.violations == []  # a's claim ended first
    w._apply("a", {"phase": "Assigned", "worker": "w1", "fencingToken": 2})
    (violation,) = w.seen.violations
    assert violation.startswith("maxConcurrent: AgentBudget p had 3 claims (limit 2)")


def test_a_relist_checks_the_budget_on_the_snapshot_as_a_whole() -> None:
    w = _watcher()
    w._apply("a", {"phase": "Running", "worker": "w0", "fencingToken": 1})
    w._apply("b", {"phase": "Running", "worker": "w0", "fencingToken": 1})
    # A watch gap: a ended, c started -- never three at once, though applied one by one
    # in list order the mirror would pass through three.
    w._relist(
        [
            {"metadata": {"name": "b"}, "status": {"phase": "Running", "worker": "w0"}},
            {"metadata": {"name": "c"}, "status": {"phase": "Running", "worker": "w1"}},
            {"metadata": {"name": "a"}, "status": {"phase": "Succeeded", "worker": "w0"}},
        ]
    )
    assert w.seen.violations == []


def test_the_leader_faults_that_hit_held_budget_claims_are_counted() -> None:
    run = _good()
    run.plan = dataclasses.replace(
        PLAN, tasks=(dataclasses.replace(PLAN.tasks[0], budget="p"), *PLAN.tasks[1:])
    )
    run.faults = [
        FaultRecord("leader-kill", "replica-0", 11.0),  # a's first claim held: 10-12 s
        FaultRecord("leader-stop", "replica-1", 15.0),  # none held
    ]
    assert verify(run).figures["leader faults with AgentBudget claims held"] == 1
