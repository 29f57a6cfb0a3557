"""Submit AgentTasks and wait for their outcome from Python: Celery's ``delay().get()``.

    from agentq.client import Client

    with Client(namespace="agents") as queue:
        task = queue.submit(payload={"doc": "s3://b/42.pdf"}, required_capabilities=["llm"])
        print(task.wait(timeout=600))  # the result, or TaskFailed / TaskCancelled / ...

What it owns:

- building and creating AgentTasks (keyword arguments named as the spec's fields in
  snake_case, or a whole manifest), always with strict field validation, so a typo is
  refused by the API server, whose message is raised as it is (``ApiError``);
- waiting by WATCH, never by polling: a LIST (or the create's answer) then one WATCH
  per task (a ``metadata.name`` field selector) or per label selector, resumed from
  the last resourceVersion when the server ends it, listed again after a ``410
  Gone``. A wait of an hour costs a LIST and about a dozen WATCH requests;
- the outcome of a task, typed: ``Outcome`` for each, ``wait()`` returning
  ``status.result`` or raising ``TaskFailed`` (``TaskDeadLettered``),
  ``TaskCancelled``, ``TaskNotFound`` (``TaskDeleted``) or ``WaitTimeout``;
- cancelling (a merge patch of ``spec.cancel``) and listing by label selector.

``AsyncClient`` is the implementation (on ``agentq.kube.Client``, agentq's one
Kubernetes client); ``Client`` runs it on an event loop of its own in a background
thread, so it can be used from any thread, with or without an event loop of yours.
"""

from agentq.client.aio import AsyncClient, AsyncTask, find_config
from agentq.client.blocking import Client, Task
from agentq.client.manifest import SPEC_FIELDS, check_manifest, task_manifest
from agentq.client.outcome import (
    ApiError,
    ClientError,
    End,
    ListTimeout,
    ManifestError,
    NoCluster,
    Outcome,
    TaskCancelled,
    TaskDeadLettered,
    TaskDeleted,
    TaskError,
    TaskFailed,
    TaskNotFound,
    Tracker,
    Unreachable,
    WaitTimeout,
    final_end,
)

__all__ = [
    "SPEC_FIELDS",
    "ApiError",
    "AsyncClient",
    "AsyncTask",
    "Client",
    "ClientError",
    "End",
    "ListTimeout",
    "ManifestError",
    "NoCluster",
    "Outcome",
    "Task",
    "TaskCancelled",
    "TaskDeadLettered",
    "TaskDeleted",
    "TaskError",
    "TaskFailed",
    "TaskNotFound",
    "Tracker",
    "Unreachable",
    "WaitTimeout",
    "check_manifest",
    "final_end",
    "find_config",
    "task_manifest",
]
