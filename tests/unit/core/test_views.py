"""Typed views of watched objects: nothing the operator reads can raise, and nothing it
does not read is kept."""

from __future__ import annotations

import json
from typing import Any

import pytest

from agentq import protocol, views
from agentq.models import TaskPhase
from builders import budget, task


def nested(depth: int) -> str:
    return '{"a":' * depth + "1" + "}" * depth


@pytest.mark.parametrize("depth", [500, 3_000, 20_000])
def test_an_object_nested_deeper_than_python_recurses_decodes_without_error(depth: int) -> None:
    text = (
        '{"metadata":{"name":"t","namespace":"ns","uid":"u","resourceVersion":"3"},'
        f'"spec":{{"cost":2,"payload":{nested(depth)}}},"status":{{"phase":"Pending"}}}}'
    )
    body = views.decode(text)
    view = views.task_view(body, size=len(text))
    assert view.name == "t" and view.spec.cost == 2 and view.phase is TaskPhase.PENDING
    assert view.problem is not None and view.problem.reason == "PayloadTooDeep"


def test_the_iterative_decoder_agrees_with_json_where_both_work() -> None:
    doc = {"a": [1, -2.5e3, 'x"y\\u00e9', True, False, None, {"b": []}], "c": {}}
    text = json.dumps(doc)
    assert views._decode_iteratively(text, 100) == doc
    assert views._decode_iteratively(json.dumps({"a": {"b": {"c": 1}}}), 2) == {
        "a": {"b": views.TOO_DEEP}
    }
    with pytest.raises(ValueError):
        views._decode_iteratively('{"a": [1, 2', 100)


def test_a_task_view_keeps_neither_payload_nor_result() -> None:
    body = task("t").requires("llm").payload({"big": "x" * 1000}).namespace("ns").obj()
    body["status"] = {"phase": "Succeeded", "result": {"big": "y" * 1000}, "fencingToken": 4}
    view = views.task_view(body)
    assert view.status.result is None
    assert not hasattr(view.spec, "payload") or view.spec.payload is None
    assert view.status.fencing_token == 4
    assert view.spec.required_capabilities == frozenset({"llm"})


def test_a_task_too_large_to_grant_is_a_problem() -> None:
    body = task("t").payload({"blob": "x" * (views.MAX_TASK_BYTES + 10)}).namespace("ns").obj()
    view = views.task_view(body)  # a listed object: its size is estimated from its payload
    assert view.problem is not None and view.problem.reason == "ObjectTooLarge"


def test_a_payload_too_large_is_a_problem() -> None:
    body = task("t").payload({"blob": "x" * (300 * 1024)}).namespace("ns").obj()
    view = views.task_view(body)
    assert view.problem is not None and view.problem.reason == "PayloadTooLarge"


def test_a_status_field_that_does_not_fit_is_dropped_not_fatal() -> None:
    body: dict[str, Any] = task("t").namespace("ns").obj()
    body["status"] = {"phase": "Running", "worker": "w", "fencingToken": "seven", "attempt": 1}
    view = views.task_view(body)
    assert view.phase is TaskPhase.RUNNING and view.status.fencing_token is None
    assert view.status_problem == "fencingToken"


def test_a_lease_view_parses_its_token_strictly() -> None:
    def lease(token: str, **extra: Any) -> views.LeaseView:
        return views.lease_view(
            {
                "metadata": {
                    "name": "agentq-task-t1",
                    "namespace": "ns",
                    "labels": {protocol.LABEL_LEASE_KIND: "task"},
                    "annotations": {protocol.ANNOTATION_TOKEN: token, **extra},
                },
                "spec": {"holderIdentity": "w", "leaseDurationSeconds": True},
            }
        )

    assert lease("12").token == 12
    assert lease("1.9").token is None and lease("1.9").token_text == "1.9"
    assert lease("12").subject == "t1"  # from the name when the label is missing
    assert lease("12").duration is None  # true is not a duration
    assert lease("3", **{protocol.ANNOTATION_TASK_UID: "u1"}).task_uid == "u1"


def test_a_budget_view_keeps_a_bad_spec_as_a_problem_and_a_bad_status_field_dropped() -> None:
    good = budget("openai").requests_per_minute(60).obj()
    good["metadata"].update(uid="u", resourceVersion="4", generation=2)
    good["status"] = {"inUse": 1, "throttledUntil": "2025-01-01T00:00:10Z", "waiting": -3}
    view = views.budget_view(good)
    assert view.spec is not None and view.spec.requests_per_minute == 60
    assert view.problem is None and (view.uid, view.resource_version) == ("u", "4")
    assert view.generation == 2
    assert view.status.in_use == 1 and view.status.waiting is None  # -3: dropped
    assert view.status.throttled_until is not None

    bad = views.budget_view(budget("b").requests_per_minute(0).obj())
    assert bad.spec is None
    assert bad.problem is not None and bad.problem.reason == "InvalidSpec"
    assert "requestsPerMinute" in bad.problem.message
