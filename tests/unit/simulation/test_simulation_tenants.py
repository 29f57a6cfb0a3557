"""``agentq simulate`` tenants scenarios: AgentQueues sharing one pool against one queue."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from agentq.cli import main
from agentq.simulation.scenario import (
    CostModel,
    QueueConfig,
    Scenario,
    ScenarioError,
    TeamConfig,
    WorkerConfig,
    preset,
    scenario_from_mapping,
)
from agentq.simulation.tenants import TenantRun, compare_tenants, generate_floods

pytestmark = pytest.mark.unit


def by_policy(scenario: Scenario) -> dict[str, TenantRun]:
    return {run.policy: run for run in compare_tenants(scenario)}


def figures(run: TenantRun, queue: str) -> dict[str, float | None]:
    row = next(q for q in run.queues if q.name == queue)
    return {
        "weight_share": row.weight_share,
        "share": row.share,
        "error": row.error,
        "completions": row.completions,
    }


def test_one_task_at_a_time_the_queues_take_turns_and_one_queue_serves_the_flood_first() -> None:
    # One worker, one task at a time, every task costs 1: A floods 4 tasks; B's 2 arrive
    # at A's first completion (t = 1) and join even with A (no banked credit, ties by name).
    scenario = Scenario(
        workers=(WorkerConfig("w", max_in_flight=1),),
        cost=CostModel(distribution="fixed"),
        queues=(QueueConfig("team-a"), QueueConfig("team-b")),
        teams=(TeamConfig("team-a", 4), TeamConfig("team-b", 2, after_completions=1)),
    ).check()
    runs = by_policy(scenario)
    queues, fifo = runs["queues"], runs["no-queues"]
    # Grants A A B A B A: B's tasks complete at 3 and 5; with one queue, after A's four.
    assert queues.timelines["team-b"] == ((3.0, 1.0), (5.0, 2.0))
    assert queues.timelines["team-a"] == ((1.0, 1.0), (2.0, 2.0), (4.0, 3.0), (6.0, 4.0))
    assert fifo.timelines["team-b"] == ((5.0, 1.0), (6.0, 2.0))
    # The window: from B's arrival to the grant that empties B (t = 4 with queues) or A.
    assert queues.window == (1.0, 4.0)
    assert fifo.window == (1.0, 3.0)
    assert figures(queues, "team-b") == {
        "weight_share": 0.5,
        "share": 0.5,  # granted in the window: A1 B0 A2 B1
        "error": 0.0,
        "completions": pytest.approx(1 / 3),  # A1 B0 A2 (A0's completion brought B)
    }
    assert figures(fifo, "team-b")["share"] == 0.0
    # A1 A2 A3 granted in the window: B was owed 1.5 of them (in units of the max cost, 1).
    assert figures(fifo, "team-b")["error"] == -1.5


def test_equal_weights_the_late_team_gets_half_and_none_without_queues() -> None:
    runs = by_policy(preset("tenants"))
    queues, fifo = runs["queues"], runs["no-queues"]
    assert queues.max_share_error is not None and queues.max_share_error <= 1.0
    b = figures(queues, "team-b")
    assert b["share"] == pytest.approx(0.5, abs=0.02)
    assert b["completions"] is not None and b["completions"] >= 0.45  # issue 20's target
    assert figures(fifo, "team-b")["share"] == 0.0
    assert figures(fifo, "team-b")["completions"] == 0.0
    assert fifo.max_share_error is not None and fifo.max_share_error > 50
    assert queues.run.starved == fifo.run.starved == 0
    # The late team waits far less with queues; the flooding team pays for it.
    assert figures_wait(queues, "team-b") < figures_wait(fifo, "team-b") / 2


def figures_wait(run: TenantRun, queue: str) -> float:
    wait = next(q for q in run.queues if q.name == queue).p50_wait
    assert wait is not None
    return wait


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_weights_one_to_three_stay_within_the_bound(seed: int) -> None:
    runs = by_policy(replace(preset("tenants-weighted"), seed=seed))
    queues = runs["queues"]
    assert queues.max_share_error is not None and queues.max_share_error <= 1.0
    assert figures(queues, "team-b")["share"] == pytest.approx(0.75, abs=0.02)
    assert figures(runs["no-queues"], "team-b")["share"] == 0.0


@pytest.mark.parametrize("cost", ["uniform", "pareto"])
def test_nested_orgs_converge_at_each_level(cost: str) -> None:
    scenario = preset("tenants-nested")
    scenario = replace(scenario, cost=replace(scenario.cost, distribution=cost))
    runs = by_policy(scenario)
    queues = runs["queues"]
    for row in queues.queues:
        assert row.error is not None and abs(row.error) <= 1.0, row  # one max cost per level
    expected = {"org-a": 2 / 3, "org-b": 1 / 3, "team-a1": 0.5, "team-a2": 0.5}
    assert {q.name: q.weight_share for q in queues.queues} == pytest.approx(expected)
    assert [q.path for q in queues.queues] == ["org-a", "org-a/team-a1", "org-a/team-a2", "org-b"]
    fifo = {q.name: q.share for q in runs["no-queues"].queues}
    assert fifo == {"org-a": 1.0, "team-a1": 1.0, "team-a2": 0.0, "org-b": 0.0}


def test_an_idle_queue_lends_its_share_and_is_left_out() -> None:
    scenario = replace(
        preset("tenants"), queues=(*preset("tenants").queues, QueueConfig("team-c", weight=2.0))
    ).check()
    queues = by_policy(scenario)["queues"]
    assert [q.name for q in queues.queues] == ["team-a", "team-b"]
    assert figures(queues, "team-b")["share"] == pytest.approx(0.5, abs=0.02)


def test_floods_arriving_together_are_interleaved_and_the_same_for_every_policy() -> None:
    tasks, leaves, after = generate_floods(preset("tenants-nested"))
    assert leaves[:3] == ["team-a1"] * 3
    assert leaves[300:304] == ["team-a2", "org-b", "team-a2", "org-b"]
    assert after[:300] == [0] * 300 and after[300:] == [20] * 200
    assert len({t.name for t in tasks}) == 500
    assert generate_floods(preset("tenants-nested"))[0] == tasks


# -- the command and its scenarios --------------------------------------------------------


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["simulate", *args])
    return result.exit_code, result.output


def test_json_per_policy_with_the_documented_keys() -> None:
    code, out = run("--scenario", "tenants", "--json")
    assert code == 0, out
    rows = json.loads(out)
    assert [row["policy"] for row in rows] == ["queues", "no-queues"]
    for row in rows:
        assert set(row) == {"policy", "window", "max_share_error", "makespan", "starved", "queues"}
        assert set(row["queues"]) == {"team-a", "team-b"}
        assert set(row["queues"]["team-b"]) == {
            "path",
            "weight_share",
            "share",
            "error",
            "completions",
            "p50_wait",
        }


def test_tables_markdown_and_plot(tmp_path: Path) -> None:
    code, out = run("--scenario", "tenants-nested")
    assert code == 0, out
    for word in ("queues", "no-queues", "org-a/team-a2", "org-b", "cost share"):
        assert word in out
    code, out = run("--scenario", "tenants-weighted", "--markdown")
    assert code == 0, out
    assert out.splitlines()[0].startswith("| policy | window (s) |")
    assert "| team-b | 75.0% | queues |" in out
    target = tmp_path / "tenants.png"
    code, out = run("--scenario", "tenants", "--plot", str(target), "--json")
    assert code == 0, out
    assert target.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_fleet_and_cost_flags_apply_to_a_tenants_scenario() -> None:
    code, out = run(
        *("--scenario", "tenants", "--weights", "1,1", "--max-in-flight", "1"),
        *("--cost", "exponential", "--execution", "serial", "--seed", "4", "--json"),
    )
    assert code == 0, out
    queues = json.loads(out)[0]
    assert queues["max_share_error"] <= 1.0


@pytest.mark.parametrize("flag", [("--tasks", "10"), ("--load", "0.5"), ("--policy", "drr")])
def test_workload_and_policy_flags_are_refused_for_tenants(flag: tuple[str, str]) -> None:
    code, out = run("--scenario", "tenants", *flag)
    assert code == 2
    assert f"{flag[0]}: does not apply to a tenants scenario" in out


def test_a_yaml_tenants_scenario(tmp_path: Path) -> None:
    config = tmp_path / "tenants.yaml"
    config.write_text(
        """
seed: 2
cost: {distribution: fixed}
workers:
  - {name: a, max_in_flight: 2}
  - {name: b, max_in_flight: 2}
queues:
  - {name: org, weight: 3}
  - {name: t1, parent: org}
  - {name: t2, parent: org, weight: 3}
  - {name: solo}
teams:
  - {queue: t1, tasks: 60}
  - {queue: t2, tasks: 40, after_completions: 5}
  - {queue: solo, tasks: 40, after_completions: 5}
"""
    )
    code, out = run("--config", str(config), "--json")
    assert code == 0, out
    queues = json.loads(out)[0]["queues"]
    assert queues["t2"]["path"] == "org/t2"
    assert queues["t2"]["weight_share"] == 0.75
    assert queues["org"]["share"] == pytest.approx(0.75, abs=0.05)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"queues": [{"name": "a"}]}, "give the teams"),
        ({"teams": [{"queue": "a", "tasks": 1}]}, "queues: expected a list"),
        ({"queues": [{"name": "a"}], "teams": [{"queue": "b", "tasks": 1}]}, "no queue named 'b'"),
        (
            {"queues": [{"name": "a", "parent": "x"}], "teams": [{"queue": "a", "tasks": 1}]},
            "a.parent: no queue named 'x'",
        ),
        (
            {
                "queues": [{"name": "a", "parent": "b"}, {"name": "b", "parent": "a"}],
                "teams": [{"queue": "a", "tasks": 1}],
            },
            "cycle",
        ),
        (
            {
                "queues": [{"name": "a"}, {"name": "b", "parent": "a"}],
                "teams": [{"queue": "a", "tasks": 1}],
            },
            "only a leaf queue",
        ),
        (
            {
                "queues": [{"name": "a"}, {"name": "b"}],
                "teams": [
                    {"queue": "a", "tasks": 5},
                    {"queue": "b", "tasks": 1, "after_completions": 6},
                ],
            },
            "only 5 task(s) arrive before it",
        ),
        (
            {"queues": [{"name": "a"}], "teams": [{"queue": "a", "tasks": 0}]},
            "a.tasks: must be an integer >= 1",
        ),
        (
            {"queues": [{"name": "a", "weight": 0}], "teams": [{"queue": "a", "tasks": 1}]},
            "a.weight: must be a number > 0",
        ),
        (
            {"queues": [{"name": "a"}], "teams": [{"queue": "a", "tasks": 1}], "load": 0.5},
            "load: does not apply to a scenario with teams",
        ),
        (
            {"queues": [{"name": "a", "colour": 1}], "teams": [{"queue": "a", "tasks": 1}]},
            "unknown field(s) colour",
        ),
    ],
)
def test_bad_tenant_scenarios_name_the_field(data: dict[str, object], message: str) -> None:
    with pytest.raises(ScenarioError, match=message.replace("(", r"\(").replace(")", r"\)")):
        scenario_from_mapping({"workers": [{"name": "w"}], **data})
