"""The operator's first decisions wait for every watch's first list, in both watcher
modes: with kopf's watches, kopf's sync and the AgentQueue, Namespace
and AgentBudget lists (``main.all_synced``), so a task naming a queue or a budget is
never judged on an empty store."""

from __future__ import annotations

from agentq.models import QUEUE_PLURAL
from agentq.operator.main import KOPF_SYNCED, all_synced


def test_then_runs_once_when_every_part_has_synced_in_any_order() -> None:
    calls: list[str] = []
    synced = all_synced([KOPF_SYNCED, QUEUE_PLURAL, "namespaces"], lambda: calls.append("go"))
    synced(QUEUE_PLURAL)
    synced(KOPF_SYNCED)
    assert calls == []  # the namespaces' labels are not listed yet
    synced(QUEUE_PLURAL)  # a part twice (a relist) counts once
    assert calls == []
    synced("namespaces")
    assert calls == ["go"]
    synced(KOPF_SYNCED)  # later relists: never again
    synced("namespaces")
    assert calls == ["go"]


def test_the_first_decisions_wait_for_the_agent_budgets_too() -> None:
    # A task naming a budget is not judged (BudgetNotFound) on an empty store either.
    from agentq.models import BUDGET_PLURAL
    from agentq.operator.main import CLUSTER_PLURALS

    assert BUDGET_PLURAL in CLUSTER_PLURALS
    calls: list[str] = []
    synced = all_synced([KOPF_SYNCED, *CLUSTER_PLURALS], lambda: calls.append("go"))
    for part in (KOPF_SYNCED, QUEUE_PLURAL, "namespaces"):
        synced(part)
    assert calls == []
    synced(BUDGET_PLURAL)
    assert calls == ["go"]
