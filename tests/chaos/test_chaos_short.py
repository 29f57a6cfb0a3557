"""The short chaos run (150 tasks, every kind of fault once) as part of ``make test``.

One run per module (it takes a few minutes); the safety properties and the
liveness property (no healthy claim reclaimed) are separate tests of its verdict,
so a liveness bug that is still being fixed does not hide a safety regression.
The full run is ``make chaos``.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from chaos.harness import ChaosRun
from chaos.plan import make_plan
from chaos.report import summary
from chaos.verify import Verdict

pytestmark = pytest.mark.slow

SEED = 20261129


@pytest.fixture(scope="module")
def verdict(tmp_path_factory: pytest.TempPathFactory) -> Verdict:
    plan = make_plan(SEED, "short")
    # AGENTQ_CHAOS_WORKDIR keeps the logs somewhere pytest will not rotate away.
    keep = os.environ.get("AGENTQ_CHAOS_WORKDIR")
    workdir = Path(keep) if keep else tmp_path_factory.mktemp("chaos")
    result = ChaosRun(plan, workdir, deadline_seconds=600, stall_seconds=180).run()
    print(summary(plan, result, f"pytest tests/chaos (seed {SEED}); logs in {workdir}"))
    return result


@pytest.mark.timeout(900)
def test_short_chaos_run_loses_nothing_and_commits_once_from_the_final_token(
    verdict: Verdict,
) -> None:
    figures = verdict.figures
    others = [v for v in verdict.violations if not v.startswith(("maxInFlight", "maxConcurrent"))]
    assert not others, "\n".join(others)
    assert figures["not terminal"] == 0 and figures["lost"] == 0
    assert figures["DeadLettered == poison set"]
    # The run did what it claims: faults of every kind fired, claims were watched.
    fired = figures["faults injected"]
    for kind in (
        "agent-kill",
        "agent-stop",
        "sidecar-kill",
        "sidecar-stop",
        "leader-kill",
        "leader-term",
        "leader-stop",
        "apiserver-restart",
        "clock-step",
    ):
        assert fired.get(kind, 0) >= 1, (kind, fired, figures.get("skipped"))
    assert figures["claims healthy"] > 50
    assert figures["states checked (maxInFlight)"] > 300


@pytest.mark.timeout(900)
def test_short_chaos_run_never_puts_a_worker_over_max_in_flight(verdict: Verdict) -> None:
    over = [v for v in verdict.violations if v.startswith("maxInFlight")]
    assert not over, "\n".join(over)
    assert verdict.figures["peak in-flight / maxInFlight"] <= 1.0


@pytest.mark.timeout(900)
def test_short_chaos_run_never_puts_a_budget_over_max_concurrent(verdict: Verdict) -> None:
    # A third of the normal tasks name one AgentBudget (maxConcurrent 3): across the
    # run's leader kills, stops and terminations, never a fourth claim at once.
    over = [v for v in verdict.violations if v.startswith("maxConcurrent")]
    assert not over, "\n".join(over)
    assert verdict.figures["tasks naming the AgentBudget"] > 30
    assert verdict.figures["peak claims / maxConcurrent"] == 1.0  # the budget bound
    assert verdict.figures["leader faults with AgentBudget claims held"] >= 1


@pytest.mark.timeout(900)
def test_short_chaos_run_reclaims_no_healthy_claim(verdict: Verdict) -> None:
    assert verdict.liveness == [], "\n".join(verdict.liveness)
