"""bench-load's figures for a backlog spread over AgentQueues: the share gap read back
from the fencing tokens, and the ratios against the plain backlog of the same round."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from load_bench import Result, queue_weights, render_queues, share_gap

WEIGHTS = {"q0": 1.0, "q1": 1.0, "q2": 1.0, "q3": 2.0}


def granted(order: list[str]) -> list[dict[str, Any]]:
    """Tasks granted in ``order`` (their queues), listed back in another order, plus one
    not granted."""
    tasks = [
        {"spec": {"queue": q}, "status": {"fencingToken": 1000 + i}} for i, q in enumerate(order)
    ]
    return [*reversed(tasks), {"spec": {"queue": "q0"}, "status": {}}]


def test_an_order_by_weight_is_within_the_bound_until_a_queue_runs_out() -> None:
    shared = ["q0", "q3", "q1", "q3", "q2"] * 10  # 1:1:1:2 ...
    order = shared + ["q0", "q1", "q2"] * 5  # ... until q3 runs out; then the rest
    figures = share_gap(granted(order), WEIGHTS)
    assert figures["share_gap"] <= 1
    assert figures["share_window"] == len(shared) - 1  # q3's last grant ends the window


def test_one_queue_served_in_a_burst_is_beyond_the_bound() -> None:
    order = ["q3"] * 6 + ["q0", "q1", "q2"] * 4
    figures = share_gap(granted(order), WEIGHTS)
    assert figures["share_gap"] > 1


def test_a_single_queue_has_no_share_gap() -> None:
    assert share_gap(granted(["q0"] * 5), {"q0": 1.0})["share_window"] == 0


def test_queue_weights_pad_with_one() -> None:
    assert queue_weights(1, (1.0, 1.0, 1.0, 2.0)) == (1.0,)
    assert queue_weights(5, (3.0,)) == (3.0, 1.0, 1.0, 1.0, 1.0)


def drain(queues: int, round_: int, tasks_per_s: float, cpu: float) -> Result:
    return Result(
        f"dispatch 1,000/50, {queues} queues [new]",
        {
            "tasks": 1000,
            "queues": queues,
            "variant": "new",
            "round": round_,
            "weights": list(queue_weights(queues, (1.0, 1.0, 1.0, 2.0))),
            "tasks_per_s": tasks_per_s,
            "operator_cpu_ms_per_dispatch": cpu,
            "apiserver_cpu_ms_per_dispatch": 6.0,
            "writes_per_dispatch": 3.0,
            "share_gap": 0.5,
            "share_window": 600 if queues > 1 else 0,
        },
    )


def test_the_ratios_are_against_the_same_round_and_summed_up_by_their_median() -> None:
    results = [
        drain(0, 0, 300.0, 1.0),
        drain(4, 0, 270.0, 1.2),
        drain(1, 0, 290.0, 1.1),
        drain(4, 1, 100.0, 1.0),  # a busy round: its plain drain was as slow
        drain(0, 1, 100.0, 1.0),
        drain(1, 1, 100.0, 1.0),
        drain(4, 2, 190.0, 2.0),
        drain(0, 2, 200.0, 1.0),
        drain(1, 2, 200.0, 1.0),
    ]
    text = "\n".join(render_queues(results))
    rows = [line for line in text.splitlines() if line.startswith("| dispatch")]
    assert len(rows) == 6  # every drain over queues, none of the plain ones
    assert "| 1:1:1:2 | 270.0 |" in rows[0] and "| 0.90 |" in rows[0]
    # Medians over the rounds: 270/290, 100/100, 190/200 -> 0.95; 270/300, 1, 0.95 -> 0.95.
    assert "4 queues against one queue [new], median of 3 rounds: tasks/s 0.95" in text
    assert "4 queues against no queue [new], median of 3 rounds: tasks/s 0.95" in text
    assert "operator CPU / dispatch 1.20" in text  # median of 1.2, 1.0, 2.0 (no queue)


def test_no_table_without_drains_over_queues() -> None:
    assert render_queues([drain(0, 0, 300.0, 1.0)]) == []
