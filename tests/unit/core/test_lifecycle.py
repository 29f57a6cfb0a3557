"""The task state machine: fencing tokens, attempt counting, dead-lettering, backoff."""

from __future__ import annotations

import random
from typing import Any

import pytest

from agentq import lifecycle
from agentq.clock import FakeClock
from agentq.models import RetryBackoff
from agentq.protocol import ErrorInfo, Report

NOW = FakeClock().now()


def apply(status: dict[str, Any], transition: lifecycle.Transition) -> dict[str, Any]:
    merged = {**status, **transition.patch}
    return {k: v for k, v in merged.items() if v is not None}


def fail(status: dict[str, Any], max_reclaims: int = 2) -> lifecycle.Transition:
    return lifecycle.fail_attempt(
        status,
        reason="LeaseExpired",
        message="gone",
        max_reclaims=max_reclaims,
        backoff=RetryBackoff(),
        now=NOW,
        rng=random.Random(1),
    )


def test_every_grant_issues_a_strictly_greater_token() -> None:
    status: dict[str, Any] = {}
    tokens = []
    for _ in range(5):
        status = apply(status, lifecycle.grant(status, worker="w", lease_name="l", now=NOW))
        tokens.append(status["fencingToken"])
        status = apply(status, fail(status, max_reclaims=10))
    assert tokens == sorted(set(tokens)) and tokens[0] == 1


def test_requeue_does_not_reset_the_token() -> None:
    status = apply({}, lifecycle.grant({}, worker="w", lease_name="l", now=NOW))
    status = apply(status, fail(status, max_reclaims=0))
    assert status["phase"] == "DeadLettered"
    status = apply(status, lifecycle.requeue(status, now=NOW, request="r1"))
    status = apply(status, lifecycle.grant(status, worker="w", lease_name="l", now=NOW))
    assert status["fencingToken"] == 2 and status["reclaims"] == 0


@pytest.mark.parametrize("max_reclaims", [0, 1, 2, 5])
def test_a_poison_task_gets_exactly_max_reclaims_plus_one_attempts(max_reclaims: int) -> None:
    status: dict[str, Any] = {}
    attempts = 0
    while status.get("phase") != "DeadLettered":
        status = apply(status, lifecycle.grant(status, worker="w", lease_name="l", now=NOW))
        attempts += 1
        status = apply(status, fail(status, max_reclaims=max_reclaims))
        assert attempts <= max_reclaims + 1
    assert attempts == max_reclaims + 1
    assert status["reclaims"] == max_reclaims + 1
    assert [h["attempt"] for h in status["history"]] == list(range(1, attempts + 1))


def test_history_is_bounded() -> None:
    status: dict[str, Any] = {}
    for _ in range(lifecycle.HISTORY_LIMIT + 5):
        status = apply(status, lifecycle.grant(status, worker="w", lease_name="l", now=NOW))
        status = apply(status, fail(status, max_reclaims=100))
    assert len(status["history"]) == lifecycle.HISTORY_LIMIT
    assert status["history"][-1]["attempt"] == lifecycle.HISTORY_LIMIT + 5


def test_a_failed_attempt_waits_a_jittered_exponential_backoff() -> None:
    backoff = RetryBackoff(initial_seconds=1, max_seconds=10, multiplier=2, jitter=0.1)
    rng = random.Random(7)
    delays = [backoff.delay_seconds(n, rand=rng.random()) for n in range(1, 7)]
    for n, delay in enumerate(delays, start=1):
        base = min(10, 2 ** (n - 1))
        assert base * 0.9 <= delay <= base
    assert RetryBackoff(jitter=0).delay_seconds(1, rand=rng.random()) == 1.0


def test_success_records_result_and_history() -> None:
    status = apply({}, lifecycle.grant({}, worker="w", lease_name="l", now=NOW))
    report = Report(token=1, worker="w", outcome="Succeeded", result={"x": 1})
    done = apply(status, lifecycle.succeed(status, report, now=NOW))
    assert done["phase"] == "Succeeded" and done["result"] == {"x": 1}
    assert done["history"][-1]["outcome"] == "Succeeded"


def test_a_non_retryable_failure_is_terminal_without_a_reclaim() -> None:
    status = apply({}, lifecycle.grant({}, worker="w", lease_name="l", now=NOW))
    report = Report(
        token=1, worker="w", outcome="Failed", error=ErrorInfo(reason="BadInput", retryable=False)
    )
    done = apply(status, lifecycle.fail_terminal(status, report, now=NOW))
    assert done["phase"] == "Failed" and done.get("reclaims", 0) == 0
    assert done["error"]["retryable"] is False
