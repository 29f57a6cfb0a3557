"""``agentq simulate``: flags, YAML scenarios, output formats and errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from agentq.cli import main
from agentq.simulation.scenario import ScenarioError, scenario_from_mapping

pytestmark = pytest.mark.unit

KEYS = {"policy", "max_share_error", "jain_index", "makespan", "p50_wait", "p99_wait", "starved"}


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["simulate", *args])
    return result.exit_code, result.output


def test_json_has_one_object_per_policy_with_the_documented_keys() -> None:
    code, out = run("--tasks", "300", "--json")
    assert code == 0, out
    rows = json.loads(out)
    assert [row["policy"] for row in rows] == ["drr", "round-robin", "least-loaded"]
    for row in rows:
        assert set(row) >= KEYS
        assert set(row["shares"]) == {"small", "medium", "large"}


def test_the_table_names_every_policy() -> None:
    code, out = run("--tasks", "200", "--scenario", "capabilities")
    assert code == 0, out
    for word in ("drr", "round-robin", "least-loaded", "gpu-2", "starved"):
        assert word in out


def test_flags_replace_the_fleet_and_the_workload() -> None:
    code, out = run(
        "--weights",
        "1,3",
        "--speeds",
        "2,2",
        "--cost",
        "exponential",
        "--rate",
        "0.5",
        "--tasks",
        "150",
        "--policy",
        "drr",
        "--execution",
        "serial",
        "--json",
    )
    assert code == 0, out
    (row,) = json.loads(out)
    assert row["policy"] == "drr"
    assert {name: s["weight_share"] for name, s in row["shares"].items()} == {
        "w1": 0.25,
        "w2": 0.75,
    }


def test_markdown_output() -> None:
    code, out = run("--tasks", "200", "--markdown", "--policy", "drr")
    assert code == 0, out
    assert out.splitlines()[0].startswith("| policy |")
    assert "| drr |" in out


def test_a_crash_is_simulated_and_its_tasks_come_back() -> None:
    code, out = run("--tasks", "400", "--crash", "large@20", "--load", "0.3", "--json")
    assert code == 0, out
    for row in json.loads(out):
        assert row["reclaims"] >= 1
        assert row["starved"] == 0 and row["unfinished"] == 0


def test_plot_writes_a_png(tmp_path: Path) -> None:
    target = tmp_path / "service.png"
    code, out = run("--tasks", "200", "--plot", str(target))
    assert code == 0, out
    assert target.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_yaml_scenario(tmp_path: Path) -> None:
    config = tmp_path / "fleet.yaml"
    config.write_text(
        """
seed: 3
tasks: 300
load: 0.7
execution: serial
cost: {distribution: uniform, low: 1, high: 3}
capability_mix:
  - {required: [gpu], share: 1}
  - {required: [], share: 3}
workers:
  - {name: gpu, weight: 2, capabilities: [gpu], max_in_flight: 2}
  - {name: cpu, weight: 1, crash_at: 50}
"""
    )
    code, out = run("--config", str(config), "--json")
    assert code == 0, out
    rows = json.loads(out)
    assert all(row["starved"] == 0 for row in rows)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--crash", "ghost@10"), "no worker named 'ghost'"),
        (("--crash", "large@soon"), "WORKER@SECONDS"),
        (("--weights", "1,x"), "numbers separated by commas"),
        (("--weights", "1,2", "--speeds", "1"), "one speed per weight"),
        (("--speeds", "1"), "--speeds goes with --weights"),
        (("--weights", "1,-2"), "weight: must be a number > 0"),
    ],
)
def test_bad_flags_are_refused_with_a_clear_message(args: tuple[str, ...], message: str) -> None:
    code, out = run("--tasks", "10", *args)
    assert code == 2
    assert message in out


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"workers": [{"name": "a"}], "colour": "red"}, "unknown field(s) colour"),
        ({"workers": []}, "at least one worker"),
        ({"workers": "a"}, "expected a list of workers"),
        ({"workers": [{"name": "a", "weight": "heavy"}]}, "a.weight: expected a number"),
        ({"workers": [{"name": "a"}, {"name": "a"}]}, "unique"),
        ({"workers": [{"name": "a"}], "cost": {"distribution": "zipf"}}, "cost.distribution"),
        ({"workers": [{"name": "a"}], "cost": {"alpha": 1.0}}, "cost.alpha"),
        ({"workers": [{"name": "a"}], "execution": "magic"}, "execution"),
        ({"workers": [{"name": "a", "max_in_flight": 0}]}, "max_in_flight"),
        ([1, 2], "expected a mapping"),
    ],
)
def test_bad_scenarios_name_the_field(data: object, message: str) -> None:
    with pytest.raises(ScenarioError, match=message.replace("(", r"\(").replace(")", r"\)")):
        scenario_from_mapping(data)


def test_a_bad_yaml_file_is_a_usage_error(tmp_path: Path) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text("workers: [{name: a, weight: 0}]\n")
    code, out = run("--config", str(config))
    assert code == 2
    assert "weight" in out
