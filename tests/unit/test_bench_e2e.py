"""The arithmetic of ``make bench-e2e`` and ``make soak``: what the recorder makes of the
watch events and agent-sim's lines, and the statistics the tables are built from."""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import e2e_bench
import soak
from e2e_common import (
    Recorder,
    next_grants,
    parse_metrics,
    percentile,
    slope_per_hour,
    steady_rate,
)


def task(name: str, phase: str = "Pending", **status: Any) -> dict[str, Any]:
    return {"metadata": {"name": name}, "status": {"phase": phase, **status}}


def lease(task: str, *, holder: str | None = "w0", report: bool = False) -> dict[str, Any]:
    annotations = {"agentq.dev/fencing-token": "7"}
    if report:
        annotations["agentq.dev/report"] = '{"outcome":"Succeeded"}'
    return {
        "metadata": {
            "name": f"agentq-task-{task}",
            "labels": {"agentq.dev/task": task},
            "annotations": annotations,
        },
        "spec": {"holderIdentity": holder},
    }


def recorder() -> Recorder:
    return Recorder(api=None, namespace="ns")  # type: ignore[arg-type]


def test_recorder_stamps_each_step_once_on_first_sight() -> None:
    rec = recorder()
    rec._task("ADDED", task("a"), 1.0)
    rec._lease("ADDED", lease("a"), 2.0)  # the grant's Lease seen before its status
    rec._task("MODIFIED", task("a", "Assigned", worker="w0", attempt=1), 2.5)
    rec.on_agent_line(2.6, '{"event": "assigned", "task": "a", "token": 7}\n')
    rec._task("MODIFIED", task("a", "Running", worker="w0", attempt=1), 3.0)
    rec._lease("MODIFIED", lease("a", report=True), 3.5)
    rec._lease("MODIFIED", lease("a", report=True), 3.7)
    rec.on_agent_line(3.6, '{"event": "reported", "task": "a", "outcome": "Succeeded"}\n')
    done = task("a", "Succeeded", worker="w0", attempt=1, history=[{"outcome": "Succeeded"}])
    rec._task("MODIFIED", done, 4.0)
    rec._task("MODIFIED", done, 4.5)  # the Events' or a resync's echo: not a second commit
    rec._lease("DELETED", lease("a", report=True), 5.0)
    rec._task("DELETED", done, 6.0)
    t = rec.tasks["a"]
    assert (t.granted, t.seen, t.running, t.report, t.reported) == (2.0, 2.6, 3.0, 3.5, 3.6)
    assert (t.committed, t.finished, t.lease_deleted, t.deleted) == (4.0, 4.0, 5.0, 6.0)
    assert t.successes == 1 and t.history_successes == 1
    assert rec.grants == [(2.5, "w0", "a")]


def test_recorder_counts_a_second_commit_and_every_grant() -> None:
    rec = recorder()
    rec._task("MODIFIED", task("a", "Assigned", worker="w0", attempt=1), 1.0)
    rec._task("MODIFIED", task("a", "Succeeded", worker="w0", attempt=1), 2.0)
    rec._task("MODIFIED", task("a", "Assigned", worker="w1", attempt=2), 3.0)
    history = [{"outcome": "Succeeded"}, {"outcome": "Succeeded"}]
    rec._task("MODIFIED", task("a", "Succeeded", worker="w1", attempt=2, history=history), 4.0)
    t = rec.tasks["a"]
    assert t.successes == 2 and t.history_successes == 2
    assert t.committed == 2.0 and t.granted == 1.0 and t.worker == "w1"
    assert [g[:2] for g in rec.grants] == [(1.0, "w0"), (3.0, "w1")]
    assert soak.verdict(rec, ["a"])["committed_twice"] == 1


def test_verdict_tells_lost_from_ended_otherwise() -> None:
    rec = recorder()
    rec._task("MODIFIED", task("ok", "Succeeded"), 1.0)
    rec._task("MODIFIED", task("dead", "DeadLettered"), 1.0)
    rec._task("MODIFIED", task("stuck", "Running", worker="w0", attempt=1), 1.0)
    v = soak.verdict(rec, ["ok", "dead", "stuck", "never-seen"])
    assert (v["succeeded"], v["lost"], v["ended_otherwise"], v["committed_twice"]) == (1, 2, 1, 0)
    assert v["lost_examples"] == ["stuck", "never-seen"]


def test_percentile_interpolates_and_ignores_missing() -> None:
    assert percentile([3.0, 1.0, 2.0, math.nan], 50) == 2.0
    assert percentile([0.0, 10.0], 99) == pytest.approx(9.9)
    assert math.isnan(percentile([], 50))


def test_steady_rate_leaves_out_the_warm_up_and_the_tail() -> None:
    # 10/s in the middle, a slow start and a slow end.
    times = [0.0, 5.0] + [10 + i / 10 for i in range(96)] + [30.0, 40.0]
    rate, spanned = steady_rate(times)
    assert rate == pytest.approx(10.0)
    assert spanned == 79  # events after the window's first


def test_next_grant_is_the_first_grant_to_the_same_worker_after_a_commit() -> None:
    commits = [(1.0, "w0"), (2.0, "w0"), (2.0, "w1"), (9.0, "w0")]
    grants = [(0.5, "w0"), (1.1, "w0"), (2.3, "w0"), (2.05, "w1"), (9.5, "w0")]
    # Nothing was waiting at 9.0: its grant is not the slot's reuse and is not counted.
    waiting = lambda t: 0 if t >= 9.0 else 3  # noqa: E731
    assert next_grants(commits, grants, waiting) == [1.1, 2.3, 2.05, None]


def test_next_grant_answers_each_commit_with_a_grant_of_its_own() -> None:
    # Two slots of w0 freed at once, one grant: the second commit has no answer.
    assert next_grants([(1.0, "w0"), (1.0, "w0")], [(1.2, "w0")], lambda _: 1) == [1.2, None]


def test_slope_per_hour_and_its_error() -> None:
    line = [(t * 60.0, 5.0 + 2.0 * t) for t in range(10)]  # +2 per minute
    slope, se = slope_per_hour(line)
    assert slope == pytest.approx(120.0) and se == pytest.approx(0.0, abs=1e-9)
    noisy = [(t * 60.0, 5.0 + (1 if t % 2 else -1)) for t in range(10)]
    slope, se = slope_per_hour(noisy)
    assert abs(slope) < 2 * se
    assert soak.flat(slope, se, 5.0, 0.15) == "yes"
    assert soak.flat(120.0, 1.0, 10.0, 1.0) == "**no**"
    assert math.isnan(slope_per_hour(line[:2])[0])


def test_parse_metrics_reads_labels_and_skips_others() -> None:
    page = "\n".join(
        [
            "# HELP apiserver_request_total Counter",
            'apiserver_request_total{code="201",resource="leases",verb="POST"} 12',
            'apiserver_request_total{code="200",resource="leases",subresource="",verb="PUT"} 3',
            'apiserver_request_duration_seconds_sum{resource="leases",verb="PUT"} 0.5',
            "etcd_mvcc_db_total_size_in_bytes 4.096e+06",
        ]
    )
    got = parse_metrics(page, ("apiserver_request_total", "etcd_mvcc_db_total_size_in_bytes"))
    assert [v for _, v in got["apiserver_request_total"]] == [12.0, 3.0]
    assert got["apiserver_request_total"][0][0]["verb"] == "POST"
    assert got["etcd_mvcc_db_total_size_in_bytes"] == [({}, 4096000.0)]


def test_profile_summary_leaves_out_idle_and_names_the_running_step(tmp_path: Path) -> None:
    loop = "Handle._run (/usr/lib/python3.11/asyncio/events.py:80)"
    dumps = "dumps (/usr/lib/python3.11/json/__init__.py:2)"
    step = "Renewer._renew (/repo/operator/agentq/sidecar/renewer.py:120)"
    raw = tmp_path / "p.txt"
    raw.write_text(
        "\n".join(
            [
                f"thread (1);main (x.py:1);{loop};{step};{dumps} 3",
                f"thread (1);main (x.py:1);{loop};{step} 1",
                "thread (1);main (x.py:1);select (/usr/lib/python3.11/selectors.py:9) 6",
            ]
        )
    )
    prof = e2e_bench.summarize_profile(raw)
    assert prof["samples"] == [("busy", 4.0)]
    assert prof["activity"] == [("Renewer._renew (agentq/sidecar/renewer.py)", 100.0)]
    assert dict(prof["leaf"]) == {"json encoding and decoding": 75.0, "agentq's own code": 25.0}


def test_a_slot_bound_task_tells_agent_sim_how_long_to_work() -> None:
    from e2e_common import task_body

    from agentq.agentsim import work_seconds

    assert "workSeconds" not in task_body("a")["spec"]["payload"]
    body = task_body("a", work_seconds=0.75)
    assert work_seconds(body["spec"]["payload"], 0.0) == 0.75
