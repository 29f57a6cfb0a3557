"""``agentq requeue``'s selection and pacing."""

from __future__ import annotations

import pytest

from agentq.ops.redrive import Pacer, refusal, request_id, select
from opsdata import NOW, task

pytestmark = pytest.mark.unit


def test_select_takes_the_requeuable_phases_oldest_first() -> None:
    tasks = [
        task("late", created=-10, status={"phase": "DeadLettered"}),
        task("early", created=-100, status={"phase": "DeadLettered"}),
        task("held", created=-50, status={"phase": "Held"}),
        task("failed", created=-40, status={"phase": "Failed"}),
        task("running", created=-30, status={"phase": "Running"}),
        task("new", created=-20),
    ]
    everything = select(tasks)
    assert [t["metadata"]["name"] for t in everything.chosen] == ["early", "held", "failed", "late"]
    assert everything.matched == 6 and everything.skipped == []
    dead = select(tasks, phases=("DeadLettered",))
    assert [t["metadata"]["name"] for t in dead.chosen] == ["early", "late"]


@pytest.mark.parametrize("phase", ["Held", "DeadLettered", "Failed", "Cancelled"])
def test_requeuable_phases(phase: str) -> None:
    assert refusal(task(status={"phase": phase})) is None


@pytest.mark.parametrize("phase", ["Pending", "Assigned", "Running", "Succeeded"])
def test_other_phases_are_refused_with_the_reason(phase: str) -> None:
    assert refusal(task(status={"phase": phase})) == (
        f"it is {phase}; only Cancelled, Held, DeadLettered, Failed tasks can be requeued"
    )


def test_request_ids_are_sortable_and_unique() -> None:
    assert request_id(NOW, "abcd1234") == "20260101T120000Z-abcd1234"
    assert request_id(NOW) != request_id(NOW)


class FakeTime:
    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.slept.append(round(seconds, 6))
        self.now += seconds


def test_the_pacer_spaces_requests_at_the_rate_and_sends_the_first_at_once() -> None:
    clock = FakeTime()
    pacer = Pacer(5, clock=lambda: clock.now, sleep=clock.sleep)
    sent = []
    for _ in range(4):
        pacer.wait()
        sent.append(round(clock.now - 100.0, 6))
    assert sent == [0.0, 0.2, 0.4, 0.6]
    # Time spent elsewhere (the API call) counts toward the spacing.
    clock.now += 0.5
    pacer.wait()
    assert clock.slept == [0.2, 0.2, 0.2]


def test_no_rate_means_no_waiting_and_a_bad_rate_is_refused() -> None:
    clock = FakeTime()
    pacer = Pacer(None, clock=lambda: clock.now, sleep=clock.sleep)
    for _ in range(10):
        pacer.wait()
    assert clock.slept == []
    with pytest.raises(ValueError, match="rate must be > 0"):
        Pacer(0, clock=lambda: 0.0, sleep=clock.sleep)
