"""The task state machine: fencing tokens, attempt counting, dead-lettering, backoff,
and what it copies from a holder cut to what status accepts."""

from __future__ import annotations

import random

import pytest

from agentq import lifecycle, protocol
from agentq.clock import FakeClock
from agentq.models import AgentTaskStatus, RetryBackoff, TaskPhase
from agentq.protocol import ErrorInfo, Report

NOW = FakeClock().now()


def grant(status: AgentTaskStatus, token: int | None = None) -> AgentTaskStatus:
    token = token if token is not None else (status.fencing_token or 0) + 1
    return lifecycle.grant(status, worker="w", lease_name="l", token=token, now=NOW).apply(status)


def fail(status: AgentTaskStatus, max_reclaims: int = 2) -> AgentTaskStatus:
    return lifecycle.fail_attempt(
        status,
        reason="LeaseExpired",
        message="gone",
        max_reclaims=max_reclaims,
        backoff=RetryBackoff(),
        now=NOW,
        rand=random.Random(1).random(),
    ).apply(status)


def test_a_grant_refuses_a_token_that_is_not_above_the_tasks() -> None:
    status = grant(AgentTaskStatus(), token=7)
    assert status.fencing_token == 7
    with pytest.raises(ValueError, match="not above"):
        grant(status, token=7)
    with pytest.raises(ValueError, match="not above"):
        grant(status, token=3)


def test_requeue_does_not_reset_the_token() -> None:
    status = fail(grant(AgentTaskStatus()), max_reclaims=0)
    assert status.phase is TaskPhase.DEAD_LETTERED
    status = lifecycle.requeue(status, now=NOW, request="r1").apply(status)
    status = grant(status)
    assert status.fencing_token == 2 and status.reclaims == 0


@pytest.mark.parametrize("max_reclaims", [0, 1, 2, 5])
def test_a_poison_task_gets_exactly_max_reclaims_plus_one_attempts(max_reclaims: int) -> None:
    status = AgentTaskStatus()
    attempts = 0
    while status.phase is not TaskPhase.DEAD_LETTERED:
        status = fail(grant(status), max_reclaims=max_reclaims)
        attempts += 1
        assert attempts <= max_reclaims + 1
    assert attempts == max_reclaims + 1
    assert status.reclaims == max_reclaims + 1
    assert [h.attempt for h in status.history or []] == list(range(1, attempts + 1))


def test_history_is_bounded() -> None:
    status = AgentTaskStatus()
    for _ in range(lifecycle.HISTORY_LIMIT + 5):
        status = fail(grant(status), max_reclaims=100)
    assert len(status.history or []) == lifecycle.HISTORY_LIMIT
    assert (status.history or [])[-1].attempt == lifecycle.HISTORY_LIMIT + 5


def test_a_failed_attempt_waits_a_jittered_exponential_backoff() -> None:
    backoff = RetryBackoff(initial_seconds=1, max_seconds=10, multiplier=2, jitter=0.1)
    rng = random.Random(7)
    delays = [backoff.delay_seconds(n, rand=rng.random()) for n in range(1, 7)]
    for n, delay in enumerate(delays, start=1):
        base = min(10, 2 ** (n - 1))
        assert base * 0.9 <= delay <= base
    assert RetryBackoff(jitter=0).delay_seconds(1, rand=rng.random()) == 1.0


def test_success_records_result_and_history() -> None:
    status = grant(AgentTaskStatus())
    report = Report(token=1, worker="w", outcome="Succeeded", result={"x": 1})
    transition = lifecycle.succeed(status, report, now=NOW)
    assert transition.patch["result"] == {"x": 1}
    done = transition.apply(status)
    assert done.phase is TaskPhase.SUCCEEDED
    assert (done.history or [])[-1].outcome == "Succeeded"


def test_a_non_retryable_failure_is_terminal_without_a_reclaim() -> None:
    status = grant(AgentTaskStatus())
    report = Report(
        token=1, worker="w", outcome="Failed", error=ErrorInfo(reason="BadInput", retryable=False)
    )
    done = lifecycle.fail_terminal(status, report, now=NOW).apply(status)
    assert done.phase is TaskPhase.FAILED and (done.reclaims or 0) == 0
    assert done.error is not None and done.error.retryable is False


def test_what_a_holder_wrote_is_cut_to_what_status_accepts() -> None:
    """A 2,000-character reason, a 40,000-character message or a 2,000-character progress
    marker used to make every status write fail (422): now they fit, and say they were cut."""
    status = grant(AgentTaskStatus())
    report = Report(
        token=1,
        worker="w",
        outcome="Failed",
        error=ErrorInfo(reason="r" * 2000, message="m" * 40_000, retryable=False),
    )
    failed = lifecycle.fail_terminal(status, report, now=NOW)
    done = failed.apply(status)  # the model enforces the CRD's maxLength
    assert done.error is not None
    assert len(done.error.reason or "") <= protocol.MAX_REASON_CHARS
    assert len(done.error.message or "") <= protocol.MAX_MESSAGE_CHARS
    assert "truncated from 40000" in (done.error.message or "")
    assert len(failed.message) < 1024
    retried = lifecycle.fail_attempt(
        status,
        reason="x" * 5000,
        message="y" * 50_000,
        max_reclaims=3,
        backoff=RetryBackoff(),
        now=NOW,
        rand=0.5,
    ).apply(status)
    assert retried.phase is TaskPhase.PENDING
    marked = lifecycle.progress(status, marker="p" * 2000).apply(status)
    assert len(marked.progress or "") <= protocol.MAX_PROGRESS_CHARS


def test_several_transitions_merge_into_one_write_with_every_event() -> None:
    status = grant(AgentTaskStatus())
    started = lifecycle.start(status, now=NOW)
    moved = lifecycle.progress(status, marker="half")
    merged = lifecycle.merge([started, moved])
    assert merged is not None
    assert merged.patch["phase"] == "Running" and merged.patch["progress"] == "half"
    assert merged.reason == "Running"
    assert lifecycle.merge([]) is None
