"""``agentq explain`` for a task that names an AgentQueue: which queue, why it waits,
its place there, and the queue's cap and share.

The ``Queued: False`` verdicts are the operator's own (``tenants.judge`` over queue
records, written by ``lifecycle.not_queued``), so a renamed reason fails here.
"""

from __future__ import annotations

import io
import json
from typing import Any

import pytest
from rich.console import Console

from agentq.operator import tenants
from agentq.ops import render
from agentq.ops.explain import (
    Explanation,
    QueuePlace,
    explain,
    parse_workers,
    pending_ahead,
    queue_place,
)
from agentq.views import queue_view
from opsdata import NOW, NS, agent_queue, queued, task, worker

pytestmark = pytest.mark.unit


def why(body: dict, queues: list[dict] | None, **kw: Any) -> Explanation:
    return explain(
        body,
        workers=[worker("w", "llm", max_in_flight=4)],
        events=[],
        lease=None,
        now=NOW,
        queues=queues,
        **kw,
    )


def verdict(queue: str, queues: list[dict], labels: dict[str, str]) -> tuple[str, str]:
    """What the operator decides for a task of namespace ``NS`` naming ``queue``."""
    topo = tenants.topology({q["metadata"]["name"]: queue_view(q) for q in queues})
    # (an operator confined to the task's namespace: NamespaceNotWatched is its verdict)
    found = tenants.judge(NS, queue, topo, labels, (NS,))
    assert found is not None
    return found


def printed(exp: Explanation) -> str:
    out = io.StringIO()
    Console(file=out, width=400, no_color=True).print(render.explanation(exp))
    return out.getvalue()


def selective(name: str, **kw: Any) -> dict:
    body = agent_queue(name, **kw)
    body["spec"]["namespaceSelector"] = {"matchLabels": {"agentq.dev/team": "a"}}
    return body


TEAM = {"agentq.dev/team": "a"}


@pytest.mark.parametrize(
    ("queue", "queues", "labels", "code", "hint"),
    [
        ("team-a", [], TEAM, "QueueNotFound", "ask a cluster admin to create AgentQueue team-a"),
        ("team-a", [selective("team-a")], {}, "QueueForbidden", f"label namespace {NS}"),
        (
            "org",
            [agent_queue("org"), agent_queue("team-a", parent="org")],
            TEAM,
            "QueueNotLeaf",
            "one of org's child queues",
        ),
        (
            "team-a",
            [agent_queue("team-a", parent="gone")],
            TEAM,
            "QueueNotAttached",
            "create the missing parent queue",
        ),
        (
            "team-a",
            [{**agent_queue("team-a"), "spec": {"namespaceSelector": {}}}],
            TEAM,
            "NoWorkerNamespace",
            "set spec.workerNamespace of AgentQueue team-a",
        ),
        (
            "team-a",
            [
                {
                    **agent_queue("team-a"),
                    "spec": {"namespaceSelector": {}, "workerNamespace": "pool"},
                }
            ],
            TEAM,
            "NamespaceNotWatched",
            "add AgentQueue team-a's workerNamespace",
        ),
    ],
)
def test_a_queue_that_does_not_admit_the_task_is_the_only_reason_with_what_to_do(
    queue: str, queues: list[dict], labels: dict[str, str], code: str, hint: str
) -> None:
    reason, message = verdict(queue, queues, labels)
    assert reason == code
    exp = why(task(queue=queue, status=queued((reason, message), queue)), queues)
    # Not admitted: the operator places it in no pending queue, so no worker finding.
    assert exp.codes == [code]
    found = exp.findings[0]
    assert message in found.message and f"AgentQueue {queue}" in found.message
    assert found.hint is not None and hint in found.hint
    assert exp.to_dict()["queue"] == queue
    assert f"queue {queue}" in printed(exp)


def test_a_verdict_this_cli_does_not_know_is_still_shown() -> None:
    exp = why(task(queue="q", status=queued(("QueueRetired", "retired by policy"), "q")), [])
    assert exp.codes == ["NotQueued"]
    assert "QueueRetired" in exp.findings[0].message
    assert "retired by policy" in exp.findings[0].message


def queued_task(name: str, created: float, priority: int = 0, **kw: Any) -> dict:
    """Admitted from the start: the operator writes no Queued condition then."""
    kw.setdefault("status", {"phase": "Pending", "attempt": 0, "reclaims": 0})
    return task(name, created=created, priority=priority, queue="team-a", **kw)


def test_an_admitted_task_gets_its_position_in_its_queue_by_priority_then_age() -> None:
    me = queued_task("me", -100)
    tasks = [
        me,
        queued_task("older", -200),  # ahead: as high, older
        queued_task("urgent", -10, priority=5),  # ahead: higher priority
        queued_task("younger", -50),  # behind
        queued_task("running", -300, status={"phase": "Running", "worker": "w"}),  # not pending
        task("unqueued", created=-500),  # its namespace's own lane, not this queue
        task("other-queue", created=-500, queue="team-b"),
        queued_task("refused", -400, status=queued(("QueueForbidden", "no"))),  # not admitted
    ]
    place = queue_place(me, tasks)
    assert place == QueuePlace(position=3, pending=4)
    # Admitted with Queued: True (the queue had refused it before) counts the same.
    assert queue_place(queued_task("me", -100, status=queued(None)), tasks) == place
    exp = why(me, [agent_queue("team-a", pending=4)], queue_place=place)
    assert exp.codes[0] == "InQueue"
    assert "position 3 of 4" in exp.findings[0].message
    assert "queue team-a (position 3 of 4)" in printed(exp)
    assert json.loads(json.dumps(exp.to_dict()))["queuePosition"] == 3
    # The placement finding follows; the workers have free slots.
    assert exp.codes[-1] == "DispatchDue"


def test_tasks_of_another_queue_are_not_ahead_in_the_namespace_lane() -> None:
    me = task("me", created=-100)
    tasks = [me, task("queued", created=-500, queue="team-a"), task("plain", created=-400)]
    views = parse_workers([worker("w", "llm")])
    assert pending_ahead(me, tasks, views) == 1
    assert queue_place(me, tasks) is None


def test_a_queue_at_its_cap_holds_it_even_with_a_free_worker_slot() -> None:
    queues = [agent_queue("team-a", max_in_flight=3, in_flight=3, pending=2)]
    exp = why(queued_task("me", -100), queues)
    assert exp.codes == ["InQueue", "QueueAtCap"]
    found = exp.findings[1]
    assert "holds 3 claim(s), its maxInFlight 3" in found.message
    assert found.hint is not None and "raise AgentQueue team-a's maxInFlight" in found.hint


def test_an_ancestor_at_its_cap_holds_it_too() -> None:
    queues = [
        agent_queue("org", max_in_flight=5, in_flight=5),
        agent_queue("team-a", parent="org", max_in_flight=10, in_flight=2),
    ]
    exp = why(queued_task("me", -100), queues)
    assert "QueueAtCap" in exp.codes
    assert "AgentQueue org (an ancestor of team-a" in exp.findings[1].message


def test_a_queue_over_its_weight_share_says_its_siblings_go_first() -> None:
    queues = [
        agent_queue("team-a", share=0.8, weight_share=0.5, pending=3),
        agent_queue("team-b", share=0.2, weight_share=0.5, pending=9),
    ]
    exp = why(queued_task("me", -100), queues)
    assert exp.codes == ["InQueue", "QueueOverShare", "DispatchDue"]
    assert "80%" in exp.findings[1].message and "weight share 50%" in exp.findings[1].message
    # Under its share, or not granted anything yet: nothing to say.
    for share in (0.5, None):
        fair = [agent_queue("team-a", share=share, weight_share=0.5)]
        assert "QueueOverShare" not in why(queued_task("me", -100), fair).codes


def test_queues_it_may_not_read_are_said_not_guessed() -> None:
    exp = why(queued_task("me", -100), None, queue_place=QueuePlace(1, 1))
    assert exp.codes == ["InQueue", "DispatchDue"]
    assert "could not be read" in exp.findings[0].message


@pytest.mark.parametrize("text", ["[link=https://evil.example]x[/link]", "[/]", "\x1b[31mred"])
def test_a_verdict_message_is_printed_as_text(text: str) -> None:
    exp = why(task(queue="team-a", status=queued(("QueueNotFound", text))), [])
    out = printed(exp)
    assert "\x1b" not in out
    assert render.safe(text) in out
