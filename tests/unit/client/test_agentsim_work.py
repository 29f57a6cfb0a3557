"""agent-sim's work time: the payload's ``workSeconds`` when it is a sane number."""

from __future__ import annotations

import math

import pytest

from agentq.agentsim import MAX_WORK_SECONDS, work_seconds


@pytest.mark.parametrize(
    ("payload", "expected"),
    [
        ({}, 0.5),
        ({"workSeconds": 1.25}, 1.25),
        ({"workSeconds": 0}, 0.0),
        ({"workSeconds": 2}, 2.0),
        ({"workSeconds": MAX_WORK_SECONDS}, MAX_WORK_SECONDS),
        # Anything else is ignored: the flag's value, never an error or a hang.
        ({"workSeconds": -1}, 0.5),
        ({"workSeconds": MAX_WORK_SECONDS + 1}, 0.5),
        ({"workSeconds": math.nan}, 0.5),
        ({"workSeconds": math.inf}, 0.5),
        ({"workSeconds": "3"}, 0.5),
        ({"workSeconds": True}, 0.5),
        ({"workSeconds": None}, 0.5),
    ],
)
def test_the_payload_sets_the_work_time_within_bounds(
    payload: dict[str, object], expected: float
) -> None:
    assert work_seconds(payload, 0.5) == expected
