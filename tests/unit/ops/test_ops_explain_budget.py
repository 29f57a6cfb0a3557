"""``agentq explain`` for a task that names AgentBudgets: the operator's ``Budgeted``
condition (``lifecycle.not_budgeted``), a verdict or a wait, says why it is Pending."""

from __future__ import annotations

import pytest

from agentq import lifecycle
from agentq.models import parse_task_status
from agentq.ops.explain import explain
from opsdata import NOW, at, task, worker

pytestmark = pytest.mark.unit


def budgeted(reason: str, message: str, *, verdict: bool) -> dict:
    status = parse_task_status({"phase": "Pending", "attempt": 0, "reclaims": 0})
    step = lifecycle.not_budgeted(
        status, reason=reason, message=message, now=at(-10), warning=verdict
    )
    body = task(status=step.apply(status).to_dict(), budgets=[{"name": "openai"}])
    return body


def codes(body: dict) -> list[str]:
    found = explain(
        body, workers=[worker("w", "llm", max_in_flight=4)], events=[], lease=None, now=NOW
    )
    return [f.code for f in found.findings]


@pytest.mark.parametrize("reason", ["BudgetNotFound", "EstimateExceedsLimit"])
def test_a_verdict_is_the_whole_answer(reason: str) -> None:
    body = budgeted(reason, "AgentBudget openai does not exist", verdict=True)
    assert codes(body) == [reason]


def test_a_wait_names_the_budget_and_still_shows_the_placement() -> None:
    body = budgeted(
        "RequestsPerMinute",
        "waiting for AgentBudget openai: no room for its requests in the last minute",
        verdict=False,
    )
    found = explain(
        body, workers=[worker("w", "llm", max_in_flight=4)], events=[], lease=None, now=NOW
    )
    first = found.findings[0]
    assert first.code == "BudgetWait"
    assert "openai" in first.message and "RequestsPerMinute" in first.message
    assert [f.code for f in found.findings][1:] == ["DispatchDue"]


def test_a_wait_shows_the_budgets_status() -> None:
    body = budgeted(
        "MaxConcurrent",
        "waiting for AgentBudget openai: every concurrent claim is held",
        verdict=False,
    )
    openai = {
        "metadata": {"name": "openai"},
        "spec": {"maxConcurrent": 2, "requestsPerMinute": 60},
        "status": {"inUse": 2, "usedRequests": 10, "reservedRequests": 2},
    }
    found = explain(
        body,
        workers=[worker("w", "llm", max_in_flight=4)],
        events=[],
        lease=None,
        now=NOW,
        budgets=[openai],
    )
    message = found.findings[0].message
    assert "AgentBudget openai: 2/2 claims, requests 10 used + 2 reserved of 60 a minute" in message
