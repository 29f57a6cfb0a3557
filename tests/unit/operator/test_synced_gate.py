"""The operator's first decisions wait for every watch's first list, in both watcher
modes: with kopf's watches, kopf's sync and the AgentQueue and Namespace lists
(``main.all_synced``), so a task naming a queue is never judged on an empty store."""

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
