"""The client's judgement, pure: when a task has ended and how, what a wait reports for
what a LIST and a WATCH showed, and the manifests it builds and checks."""

from __future__ import annotations

from typing import Any

import pytest

from agentq import protocol
from agentq.client import (
    SPEC_FIELDS,
    End,
    ManifestError,
    Outcome,
    TaskCancelled,
    TaskDeadLettered,
    TaskDeleted,
    TaskFailed,
    TaskNotFound,
    Tracker,
    WaitTimeout,
    check_manifest,
    final_end,
    task_manifest,
)
from agentq.models import TaskPhase
from builders import task

pytestmark = pytest.mark.unit


def body(name: str, phase: str | None = None, *, uid: str = "u1", **status: Any) -> dict:
    obj = task(name).namespace("ns").obj()
    obj["metadata"]["uid"] = uid
    obj["status"] = {**({"phase": phase} if phase else {}), **status}
    return obj


@pytest.mark.parametrize(
    ("phase", "end"),
    [
        (None, None),
        ("Pending", None),
        ("Assigned", None),
        ("Running", None),
        ("Held", None),
        ("Succeeded", End.SUCCEEDED),
        ("Failed", End.FAILED),
        ("DeadLettered", End.DEAD_LETTERED),
        ("Cancelled", End.CANCELLED),
    ],
)
def test_a_task_has_ended_in_a_final_phase(phase: str | None, end: End | None) -> None:
    assert final_end(body("t", phase)) == end


def test_every_final_phase_has_an_end() -> None:
    finals = [p for p in TaskPhase if p.is_final]
    assert {final_end(body("t", str(p))) for p in finals} == {
        End.SUCCEEDED,
        End.FAILED,
        End.DEAD_LETTERED,
        End.CANCELLED,
    }


def test_a_final_phase_with_a_requeue_not_yet_honoured_has_not_ended() -> None:
    failed = body("t", "Failed")
    failed["metadata"]["annotations"] = {protocol.ANNOTATION_REQUEUE: "r2"}
    assert final_end(failed) is None
    failed["status"]["requeueHandled"] = "r2"
    assert final_end(failed) is End.FAILED


def test_named_tasks_end_as_the_watch_shows_them() -> None:
    ended: list[Outcome] = []
    tracker = Tracker([("ns", "a"), ("ns", "b"), ("ns", "ghost")])
    tracker.on_end = ended.append
    tracker.listed([body("a", "Pending"), body("b", "Running")])
    assert [(o.name, o.end) for o in ended] == [("ghost", End.NOT_FOUND)]
    assert not tracker.done
    tracker.event("MODIFIED", body("a", "Running"))
    tracker.event("MODIFIED", body("other", "Succeeded"))  # not waited on
    tracker.event("MODIFIED", body("a", "Succeeded", result={"n": 1}))
    tracker.event("MODIFIED", body("a", "Failed"))  # after its end: ignored
    tracker.event("DELETED", body("b", "Running"))
    assert tracker.done
    assert [(o.name, o.end) for o in ended] == [
        ("ghost", End.NOT_FOUND),
        ("a", End.SUCCEEDED),
        ("b", End.DELETED),
    ]
    assert ended[1].result == {"n": 1}
    assert ended[2].phase == "Running"  # what it was when it went


def test_a_task_deleted_once_finished_reports_its_outcome() -> None:
    tracker = Tracker([("ns", "a")])
    tracker.listed([body("a", "Running")])
    tracker.event("DELETED", body("a", "Cancelled"))
    assert tracker.ended[("ns", "a")].end is End.CANCELLED


def test_a_relist_that_misses_a_task_means_it_was_deleted_meanwhile() -> None:
    tracker = Tracker([("ns", "a"), ("ns", "b")])
    tracker.listed([body("a", "Running"), body("b", "Running")])
    tracker.listed([body("b", "Succeeded")])  # after a 410: a went while we were away
    assert tracker.ended[("ns", "a")].end is End.DELETED
    assert tracker.ended[("ns", "b")].end is End.SUCCEEDED


def test_a_namesake_is_not_the_task_waited_on() -> None:
    tracker = Tracker([("ns", "a")])
    tracker.listed([body("a", "Running", uid="first")])
    tracker.event("ADDED", body("a", "Succeeded", uid="second"))
    assert tracker.ended[("ns", "a")].end is End.DELETED


def test_a_selector_follows_the_tasks_it_matched_at_the_start() -> None:
    tracker = Tracker()
    assert not tracker.done  # nothing listed yet
    tracker.listed([body("b", "Running"), body("a", "Succeeded")])
    assert list(tracker.keys or {}) == [("ns", "a"), ("ns", "b")]
    tracker.event("ADDED", body("late", "Pending"))  # created after the wait began
    assert ("ns", "late") not in (tracker.keys or {})
    assert [o.name for o in tracker.unfinished(5)] == ["b"]
    assert tracker.unfinished(5)[0].end is End.TIMEOUT


def test_an_empty_selector_match_is_done_at_once() -> None:
    tracker = Tracker()
    tracker.listed([])
    assert tracker.done and not tracker.ended


def test_a_seed_stands_for_the_first_listing() -> None:
    tracker = Tracker([("ns", "a")])
    tracker.seed(body("a"))
    assert tracker.listings == 1 and not tracker.done
    tracker.listed([])  # a relist that misses it: deleted, not "not found"
    assert tracker.ended[("ns", "a")].end is End.DELETED


def test_an_older_namesakes_change_replayed_from_an_earlier_create_is_not_ours() -> None:
    """A watch of several submitted tasks starts from the oldest create: it replays
    changes of an earlier task named like a later one, made before that one existed."""
    tracker = Tracker([("ns", "a"), ("ns", "b")])
    seeded = body("b", uid="new-b")
    seeded["metadata"]["resourceVersion"] = "40"
    tracker.seed(body("a", uid="a"))
    tracker.seed(seeded)
    old = body("b", "Running", uid="old-b")
    old["metadata"]["resourceVersion"] = "35"
    tracker.event("MODIFIED", old)
    assert ("ns", "b") not in tracker.ended
    later = body("b", "Pending", uid="newer-b")
    later["metadata"]["resourceVersion"] = "50"  # ours deleted and made again since
    tracker.event("ADDED", later)
    assert tracker.ended[("ns", "b")].end is End.DELETED


@pytest.mark.parametrize(
    ("end", "error", "bases"),
    [
        (End.FAILED, TaskFailed, ()),
        (End.DEAD_LETTERED, TaskDeadLettered, (TaskFailed,)),
        (End.CANCELLED, TaskCancelled, ()),
        (End.NOT_FOUND, TaskNotFound, ()),
        (End.DELETED, TaskDeleted, (TaskNotFound,)),
        (End.TIMEOUT, WaitTimeout, (TimeoutError,)),
    ],
)
def test_each_end_raises_its_own_error(end: End, error: type, bases: tuple[type, ...]) -> None:
    outcome = Outcome("ns", "t", end, {"phase": "Failed", "error": {"reason": "Boom"}})
    with pytest.raises(error) as raised:
        outcome.value()
    for base in bases:
        assert isinstance(raised.value, base)
    assert raised.value.outcome is outcome
    assert raised.value.name == "t" and raised.value.namespace == "ns"
    assert raised.value.error == {"reason": "Boom"}
    assert str(raised.value).startswith("agenttask ns/t: ")


def test_a_success_gives_its_result() -> None:
    outcome = Outcome("ns", "t", End.SUCCEEDED, {"phase": "Succeeded", "result": [1, 2]})
    assert outcome.ok and outcome.value() == [1, 2] and outcome.exception() is None
    ref = Outcome("ns", "t", End.SUCCEEDED, {"phase": "Succeeded", "resultRef": "s3://b/k"})
    assert ref.value() is None and ref.result_ref == "s3://b/k"


@pytest.mark.parametrize(
    ("end", "status", "text"),
    [
        (End.SUCCEEDED, {}, "Succeeded"),
        (
            End.FAILED,
            {"error": {"reason": "AgentError", "message": "out of memory"}},
            "Failed: AgentError: out of memory",
        ),
        (
            End.DEAD_LETTERED,
            {"reclaims": 3, "error": {"reason": "LeaseExpired"}},
            "DeadLettered after 3 failed attempts: LeaseExpired",
        ),
        (
            End.CANCELLED,
            {"error": {"reason": "Cancelled", "message": "cancelled (spec.cancel)"}},
            "Cancelled: Cancelled: cancelled (spec.cancel)",
        ),
        (End.NOT_FOUND, {}, "not found"),
        (End.DELETED, {"phase": "Running"}, "deleted while waited on (it was Running)"),
        (
            End.TIMEOUT,
            {
                "phase": "Pending",
                "conditions": [
                    {"type": "Unschedulable", "status": "True", "message": "no worker offers gpu"}
                ],
            },
            "not finished within 5s: it is Pending (no worker offers gpu)",
        ),
        (
            End.TIMEOUT,
            {"phase": "Running", "worker": "w1"},
            "not finished within 5s: it is Running on worker w1",
        ),
    ],
)
def test_each_outcome_says_what_happened(end: End, status: dict, text: str) -> None:
    assert Outcome("ns", "t", end, status, waited=5).describe() == text


def test_an_outcome_as_json() -> None:
    outcome = Outcome("ns", "t", End.FAILED, {"phase": "Failed", "error": {"reason": "X"}})
    assert outcome.to_dict() == {
        "namespace": "ns",
        "name": "t",
        "outcome": "Failed",
        "phase": "Failed",
        "result": None,
        "resultRef": None,
        "error": {"reason": "X"},
        "message": "Failed: X",
    }


# --- manifests -------------------------------------------------------------------------------


def test_a_manifest_from_keyword_arguments() -> None:
    built = task_manifest(
        name="job",
        namespace="ns",
        labels={"team": "nlp"},
        required_capabilities=["llm"],
        cost=2.5,
        payload={"doc": 1},
        lease_duration_seconds=30,
        heartbeat_interval_seconds=5,
        max_reclaims=0,
        cancel=None,  # None: left out
        active_deadline_seconds=600,
        ttl_seconds_after_finished=60,
        spec={"priority": 3},
    )
    assert built == {
        "apiVersion": "agentq.dev/v1alpha1",
        "kind": "AgentTask",
        "metadata": {"name": "job", "namespace": "ns", "labels": {"team": "nlp"}},
        "spec": {
            "requiredCapabilities": ["llm"],
            "cost": 2.5,
            "payload": {"doc": 1},
            "leaseDurationSeconds": 30,
            "heartbeatIntervalSeconds": 5,
            "maxReclaims": 0,
            "activeDeadlineSeconds": 600,
            "ttlSecondsAfterFinished": 60,
            "priority": 3,
        },
    }


def test_every_keyword_names_a_field_of_the_crd() -> None:
    from agentq.models import AgentTaskSpec

    aliases = {f.alias or n for n, f in AgentTaskSpec.model_fields.items()}
    assert set(SPEC_FIELDS.values()) <= aliases


def test_without_a_name_the_api_server_makes_one() -> None:
    assert task_manifest()["metadata"] == {"generateName": "task-"}
    assert task_manifest(generate_name="sum-")["metadata"] == {"generateName": "sum-"}
    with pytest.raises(ManifestError, match="not both"):
        task_manifest(name="a", generate_name="b-")


def test_a_misspelt_keyword_is_refused_naming_the_fields() -> None:
    with pytest.raises(TypeError, match=r"unknown AgentTask field\(s\) lease_seconds"):
        task_manifest(lease_seconds=3)


@pytest.mark.parametrize(
    ("manifest", "message"),
    [
        ([1], "is a mapping, not list"),
        ({"kind": "Pod", "apiVersion": "v1", "metadata": {"name": "p"}}, r"got v1 Pod \(in 'p'\)"),
        ({"kind": "AgentTask", "metadata": {"name": "p"}}, r"got \(no apiVersion\) AgentTask"),
        ({"kind": "AgentTask", "apiVersion": "agentq.dev/v1alpha1"}, "metadata.name or"),
        (
            {"kind": "AgentTask", "apiVersion": "agentq.dev/v1alpha1", "metadata": "x"},
            "metadata is not a mapping",
        ),
        (
            {
                "kind": "AgentTask",
                "apiVersion": "agentq.dev/v1alpha1",
                "metadata": {"name": "t", "namespace": "other"},
            },
            r"namespace of the manifest \(other\) does not match .* \(ns\)",
        ),
    ],
)
def test_a_manifest_that_is_no_agent_task_is_refused(manifest: Any, message: str) -> None:
    with pytest.raises(ManifestError, match=message):
        check_manifest(manifest, namespace="ns")


def test_a_manifest_gets_the_namespace_asked_for() -> None:
    given = task("t").obj()
    checked = check_manifest(given, namespace="ns")
    assert checked["metadata"]["namespace"] == "ns"
    assert "namespace" not in given["metadata"]  # a copy
    assert check_manifest(task("t").namespace("a").obj())["metadata"]["namespace"] == "a"
