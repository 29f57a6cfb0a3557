"""Realistic AgentTask / AgentWorker / AgentQueue / Event dicts for the ops unit tests.

Statuses are produced by the operator's own state machine (``agentq.lifecycle``),
applied as the merge patches the operator writes, so a change in what the
operator records shows up here as a failing ``explain`` test.
"""

from __future__ import annotations

import datetime
import random
from typing import Any

from agentq import lifecycle, protocol
from agentq.clock import rfc3339
from agentq.models import AgentTaskStatus, RetryBackoff, parse_task_status

NOW = datetime.datetime(2026, 1, 1, 12, 0, 0, tzinfo=datetime.UTC)
NS = "agents"


def at(seconds: float) -> datetime.datetime:
    """``NOW`` shifted by ``seconds`` (negative: in the past)."""
    return NOW + datetime.timedelta(seconds=seconds)


def task(
    name: str = "job",
    *,
    requires: tuple[str, ...] = ("llm",),
    status: dict[str, Any] | None = None,
    created: float = -600,
    annotations: dict[str, str] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    return {
        "apiVersion": "agentq.dev/v1alpha1",
        "kind": "AgentTask",
        "metadata": {
            "name": name,
            "namespace": NS,
            "uid": f"uid-{name}",
            "creationTimestamp": rfc3339(at(created)),
            "annotations": annotations or {},
        },
        "spec": {"requiredCapabilities": list(requires), "leaseDurationSeconds": 30, **spec},
        **({"status": status} if status is not None else {}),
    }


def worker(
    name: str,
    *capabilities: str,
    phase: str | None = "Ready",
    paused: bool = False,
    in_flight: int = 0,
    max_in_flight: int = 1,
    weight: float = 1,
    served: float = 0,
    ready_message: str | None = None,
) -> dict[str, Any]:
    status: dict[str, Any] = {}
    if phase is not None:
        status = {"phase": phase, "inFlight": in_flight, "servedCost": served, "deficit": 0.0}
    if ready_message is not None:
        status["conditions"] = [
            {
                "type": "Ready",
                "status": "False",
                "reason": "NotReady",
                "message": ready_message,
                "lastTransitionTime": rfc3339(at(-60)),
            }
        ]
    return {
        "apiVersion": "agentq.dev/v1alpha1",
        "kind": "AgentWorker",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "capabilities": list(capabilities),
            "weight": weight,
            "maxInFlight": max_in_flight,
            "paused": paused,
        },
        "status": status,
    }


def agent_queue(
    name: str,
    *,
    parent: str | None = None,
    weight: float = 1,
    max_in_flight: int | None = None,
    pending: int = 0,
    in_flight: int = 0,
    served: float = 0,
    share: float | None = None,
    weight_share: float | None = 1.0,
    ready: str = "True",  # or the reason of Ready False
) -> dict[str, Any]:
    """An AgentQueue (cluster-scoped) with the status the operator writes
    (``operator/queue_status.py``)."""
    spec: dict[str, Any] = {
        "weight": weight,
        "namespaceSelector": {},
        "workerNamespace": NS,
    }
    if parent is not None:
        spec["parent"] = parent
    if max_in_flight is not None:
        spec["maxInFlight"] = max_in_flight
    status: dict[str, Any] = {"pending": pending, "inFlight": in_flight, "servedCost": served}
    if share is not None:
        status["share"] = share
    if weight_share is not None:
        status["weightShare"] = weight_share
    status["conditions"] = [
        {
            "type": "Ready",
            "status": "True" if ready == "True" else "False",
            "reason": "Ready" if ready == "True" else ready,
            "message": "",
            "lastTransitionTime": rfc3339(at(-300)),
        }
    ]
    return {
        "apiVersion": "agentq.dev/v1alpha1",
        "kind": "AgentQueue",
        "metadata": {"name": name, "generation": 1},
        "spec": spec,
        "status": status,
    }


def queued(verdict: tuple[str, str] | None, queue: str = "team-a") -> dict[str, Any]:
    """A Pending task's status after the operator's verdict on its queue: ``Queued:
    False`` with the verdict's (reason, message), or (None) ``Queued: True`` as written
    when a queue admits a task it had refused."""
    status = parse_task_status({"phase": "Pending", "attempt": 0, "reclaims": 0})
    if verdict is None:
        refused = lifecycle.not_queued(status, reason="QueueNotFound", message="", now=at(-90))
        status = refused.apply(status)
        step = lifecycle.queued(status, message=f"AgentQueue {queue} admits it", now=at(-60))
    else:
        reason, message = verdict
        step = lifecycle.not_queued(status, reason=reason, message=message, now=at(-60))
    return step.apply(status).to_dict()


def event(reason: str, message: str, when: float, *, kind: str = "Normal", count: int = 1) -> dict:
    return {
        "metadata": {"name": f"job.{reason}.{when}", "namespace": NS},
        "reason": reason,
        "message": message,
        "type": kind,
        "count": count,
        "firstTimestamp": rfc3339(at(when)),
        "lastTimestamp": rfc3339(at(when)),
    }


class Story:
    """A task's status built by the operator's transitions, with the events it records."""

    def __init__(self) -> None:
        self.status: dict[str, Any] = {"phase": "Pending", "attempt": 0, "reclaims": 0}
        self.events: list[dict[str, Any]] = []
        self.rng = random.Random(0)
        self.tokens = 0

    @property
    def _now(self) -> AgentTaskStatus:
        """The status so far, typed, as the operator hands it to the state machine."""
        return parse_task_status(self.status)

    def _apply(self, transition: lifecycle.Transition, when: float) -> Story:
        for key, value in transition.patch.items():
            if value is None:
                self.status.pop(key, None)
            else:
                self.status[key] = value
        for reason, message, warning in transition.extra_events:
            kind = "Warning" if warning else "Normal"
            self.events.append(event(reason, message, when, kind=kind))
        if transition.reason:
            kind = "Warning" if transition.warning else "Normal"
            self.events.append(event(transition.reason, transition.message, when, kind=kind))
        return self

    def grant(self, worker: str, when: float) -> Story:
        self.tokens += 1  # the operator's cluster-wide counter, here for one task
        return self._apply(
            lifecycle.grant(
                self._now, worker=worker, lease_name="lease", now=at(when), token=self.tokens
            ),
            when,
        )

    def start(self, when: float) -> Story:
        return self._apply(lifecycle.start(self._now, now=at(when)), when)

    def fail(
        self,
        when: float,
        reason: str = "LeaseExpired",
        *,
        max_reclaims: int = 3,
        backoff: RetryBackoff | None = None,
    ) -> Story:
        return self._apply(
            lifecycle.fail_attempt(
                self._now,
                reason=reason,
                message=f"{reason} happened",
                max_reclaims=max_reclaims,
                backoff=backoff or RetryBackoff(initial_seconds=0, jitter=0),
                now=at(when),
                rand=self.rng.random(),
            ),
            when,
        )

    def succeed(self, when: float) -> Story:
        report = protocol.Report(
            token=int(self.status["fencingToken"]),
            worker=str(self.status["worker"]),
            outcome="Succeeded",
            result={"ok": True},
        )
        return self._apply(lifecycle.succeed(self._now, report, now=at(when)), when)

    def fail_terminal(self, when: float) -> Story:
        report = protocol.Report(
            token=int(self.status["fencingToken"]),
            worker=str(self.status["worker"]),
            outcome="Failed",
            error=protocol.ErrorInfo(reason="BadInput", message="no such file", retryable=False),
        )
        return self._apply(lifecycle.fail_terminal(self._now, report, now=at(when)), when)

    def hold(self, when: float) -> Story:
        return self._apply(lifecycle.hold(self._now, reason="LeaseExpired", now=at(when)), when)

    def grace(self, until: float, when: float) -> Story:
        return self._apply(lifecycle.grace(self._now, until=at(until), now=at(when)), when)

    def requeue(self, when: float, request: str = "r1") -> Story:
        return self._apply(lifecycle.requeue(self._now, now=at(when), request=request), when)
