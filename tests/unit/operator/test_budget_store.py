"""The store follows the AgentBudgets (cluster-scoped) as it follows the AgentQueues."""

from __future__ import annotations

from builders import budget
from harness import Harness, run


@run
async def test_the_store_holds_every_agent_budget_and_forgets_a_deleted_one() -> None:
    h = Harness()
    h.budget(budget("openai").requests_per_minute(60))
    await h.settle()
    view = h.controller.store.budgets["openai"]
    assert view.spec is not None and view.spec.requests_per_minute == 60
    h.kube.remove("agentbudgets", "", "openai")
    await h.settle()
    assert "openai" not in h.controller.store.budgets
