"""What a wait for a task ends in (pure): the errors, ``Outcome``, and ``Tracker``, which
follows tasks through a LIST and WATCH events fed to it.

A task has ended for good in a final phase (Succeeded, Failed, DeadLettered,
Cancelled) unless a requeue the operator has not yet honoured is pending; a task
missing from the first LIST was never there (``NotFound``), one deleted later, or
replaced by a namesake (another UID), was ``Deleted``.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from agentq import protocol
from agentq.models import FINAL_PHASES

Body = dict[str, Any]
FINAL = {str(p) for p in FINAL_PHASES}


class ClientError(Exception):
    """Everything ``agentq.client`` raises derives from this."""


class NoCluster(ClientError, ConnectionError):
    """No usable API server: no kubeconfig, unreachable, or credentials refused."""


class Unreachable(NoCluster):
    """No answer from the API server (refused, reset, timed out)."""


class ManifestError(ClientError, ValueError):
    """The input is not an AgentTask manifest (nothing was sent)."""


class ApiError(ClientError):
    """The API server refused a request; ``str()`` is its message, as it wrote it."""

    def __init__(self, status: int, body: Mapping[str, Any], text: str) -> None:
        self.status = status
        self.body = dict(body)
        self.text = text
        self.reason = str(body.get("reason") or "")
        self.message = str(body.get("message") or text.strip() or f"HTTP {status}")
        super().__init__(self.message)


class TaskError(ClientError):
    """A task did not end in ``Succeeded``. ``status`` is its last status seen, ``error``
    its ``status.error`` (``reason``, ``message``, ``retryable``) when it has one."""

    def __init__(self, message: str, outcome: Outcome) -> None:
        super().__init__(message)
        self.outcome = outcome
        self.name = outcome.name
        self.namespace = outcome.namespace
        self.phase = outcome.phase
        self.status = outcome.status
        self.error = outcome.error


class TaskFailed(TaskError):
    """The task is ``Failed``: a non-retryable failure, or ``activeDeadlineSeconds`` passed
    (``error["reason"] == "DeadlineExceeded"``)."""


class TaskDeadLettered(TaskFailed):
    """The task is ``DeadLettered``: more failed attempts than ``maxReclaims`` allows."""


class TaskCancelled(TaskError):
    """The task is ``Cancelled`` (``spec.cancel``)."""


class TaskNotFound(TaskError):
    """There is no such task (never created, or deleted before the wait began)."""


class TaskDeleted(TaskNotFound):
    """The task was deleted while it was waited on, before it finished."""


class WaitTimeout(TaskError, TimeoutError):
    """The task had not finished when the wait's time ran out; ``phase`` is where it was."""


class ListTimeout(ClientError, TimeoutError):
    """A wait by label selector ran out of time before the API server answered its
    first LIST: which tasks match is not known (``selector``, ``namespace``: None for
    every namespace)."""

    def __init__(self, message: str, *, selector: str, namespace: str | None) -> None:
        super().__init__(message)
        self.selector = selector
        self.namespace = namespace


# --- outcomes (pure) -----------------------------------------------------------------------


class End(enum.StrEnum):
    """How a wait for one task ended."""

    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    DEAD_LETTERED = "DeadLettered"
    CANCELLED = "Cancelled"
    NOT_FOUND = "NotFound"
    DELETED = "Deleted"
    TIMEOUT = "Timeout"


_ERRORS: dict[End, type[TaskError]] = {
    End.FAILED: TaskFailed,
    End.DEAD_LETTERED: TaskDeadLettered,
    End.CANCELLED: TaskCancelled,
    End.NOT_FOUND: TaskNotFound,
    End.DELETED: TaskDeleted,
    End.TIMEOUT: WaitTimeout,
}


@dataclass(frozen=True)
class Outcome:
    """How the wait for one task ended, with the task's last status seen."""

    namespace: str
    name: str
    end: End
    status: Body = field(default_factory=dict)
    waited: float | None = None  # the wait's timeout, for a Timeout's message

    @property
    def ok(self) -> bool:
        return self.end is End.SUCCEEDED

    @property
    def phase(self) -> str | None:
        phase = self.status.get("phase")
        return str(phase) if phase else None

    @property
    def result(self) -> Any:
        """``status.result``: what the agent reported (None without one)."""
        return self.status.get("result")

    @property
    def result_ref(self) -> str | None:
        """``status.resultRef``: where the agent stored a result too large to report."""
        ref = self.status.get("resultRef")
        return str(ref) if ref is not None else None

    @property
    def error(self) -> dict[str, Any] | None:
        error = self.status.get("error")
        return dict(error) if isinstance(error, Mapping) else None

    def describe(self) -> str:
        """One line for people: ``Failed: AgentError: out of memory``."""
        error = self.error or {}
        why = ": ".join(str(p) for p in (error.get("reason"), error.get("message")) if p)
        if self.end is End.SUCCEEDED:
            return "Succeeded"
        if self.end is End.DEAD_LETTERED:
            attempts = self.status.get("reclaims")
            after = f" after {attempts} failed attempts" if attempts else ""
            return f"DeadLettered{after}" + (f": {why}" if why else "")
        if self.end in (End.FAILED, End.CANCELLED):
            return f"{self.end}" + (f": {why}" if why else "")
        if self.end is End.NOT_FOUND:
            return "not found"
        if self.end is End.DELETED:
            where = f" (it was {self.phase})" if self.phase else ""
            return f"deleted while waited on{where}"
        within = f" within {self.waited:g}s" if self.waited is not None else ""
        return f"not finished{within}: {_where(self.status)}"

    def exception(self) -> TaskError | None:
        """The error ``value()`` raises: None when the task succeeded."""
        kind = _ERRORS.get(self.end)
        if kind is None:
            return None
        return kind(f"agenttask {self.namespace}/{self.name}: {self.describe()}", self)

    def value(self) -> Any:
        """``result``, or raise the task's error (``TaskFailed`` & co.)."""
        err = self.exception()
        if err is not None:
            raise err
        return self.result

    def to_dict(self) -> dict[str, Any]:
        return {
            "namespace": self.namespace,
            "name": self.name,
            "outcome": str(self.end),
            "phase": self.phase,
            "result": self.result,
            "resultRef": self.result_ref,
            "error": self.error,
            "message": self.describe(),
        }


def _where(status: Mapping[str, Any]) -> str:
    phase = status.get("phase") or "Pending"
    worker = status.get("worker")
    text = f"it is {phase}" + (f" on worker {worker}" if worker else "")
    for condition in status.get("conditions") or []:
        if (
            isinstance(condition, Mapping)
            and condition.get("type") == "Unschedulable"
            and condition.get("status") == "True"
        ):
            text += f" ({condition.get('message') or 'unschedulable'})"
    return text


def final_end(body: Mapping[str, Any]) -> End | None:
    """The End of a task that has finished for good, else None.

    A final phase with a requeue request the operator has not honoured yet is not
    final: the task is about to go back to Pending.
    """
    status = body.get("status") or {}
    phase = status.get("phase")
    if phase not in FINAL:
        return None
    request = ((body.get("metadata") or {}).get("annotations") or {}).get(
        protocol.ANNOTATION_REQUEUE
    )
    if request and protocol.requeue_id(str(request)) != status.get("requeueHandled"):
        return None
    return End(phase)


def key_of(body: Mapping[str, Any]) -> tuple[str, str]:
    meta = body.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


class Tracker:
    """What a wait knows of the tasks it follows in one LIST+WATCH (pure).

    Fed the LIST's items (``listed``) and the WATCH's events (``event``); ``ended``
    fills as tasks end. ``keys`` None: every task the first LIST returns (a label
    selector's matches at the start, as ``kubectl wait -l``).
    """

    def __init__(self, keys: Iterable[tuple[str, str]] | None = None) -> None:
        self.keys: dict[tuple[str, str], None] | None = (
            dict.fromkeys(keys) if keys is not None else None
        )
        self.last: dict[tuple[str, str], Body] = {}
        self.uids: dict[tuple[str, str], str] = {}
        # A seeded task's create, as a number: events of an older namesake replayed by a
        # watch from an earlier create are not ours.
        self.created: dict[tuple[str, str], int] = {}
        self.ended: dict[tuple[str, str], Outcome] = {}
        self.listings = 0
        self.on_end: Callable[[Outcome], None] = lambda outcome: None

    @property
    def done(self) -> bool:
        return self.keys is not None and all(k in self.ended for k in self.keys)

    def seed(self, body: Mapping[str, Any]) -> None:
        """A body known fresh (the create's answer) stands for the first LIST."""
        key = key_of(body)
        if self.keys is None:
            self.keys = {key: None}
        self.listings += 1
        version = str((body.get("metadata") or {}).get("resourceVersion") or "")
        if version.isdigit():
            self.created[key] = int(version)
        self._see(key, body)

    def listed(self, items: Iterable[Mapping[str, Any]]) -> None:
        first = self.listings == 0
        self.listings += 1
        present: dict[tuple[str, str], Mapping[str, Any]] = {key_of(i): i for i in items}
        if self.keys is None:
            self.keys = dict.fromkeys(sorted(present))
        for key in self.keys:
            if key in self.ended:
                continue
            if key in present:
                self._see(key, present[key])
            else:
                # Missing at the start: never there; missing from a later LIST: deleted
                # while the watch was away.
                self._end(key, End.NOT_FOUND if first else End.DELETED)

    def event(self, kind: str, body: Mapping[str, Any]) -> None:
        key = key_of(body)
        if self.keys is None or key not in self.keys or key in self.ended:
            return
        if kind == "DELETED":
            uid = (body.get("metadata") or {}).get("uid")
            if key in self.uids and uid != self.uids[key]:
                return  # a later namesake went; ours was already judged gone
            self.last[key] = dict(body)
            self._end(key, final_end(body) or End.DELETED)
        elif kind in ("ADDED", "MODIFIED"):
            if self._older_namesake(key, body):
                return
            self._see(key, body)

    def _older_namesake(self, key: tuple[str, str], body: Mapping[str, Any]) -> bool:
        """``body`` is of another task of this name, changed before ours was created (a
        watch of several tasks starts from the oldest create)."""
        meta = body.get("metadata") or {}
        uid, version = str(meta.get("uid") or ""), str(meta.get("resourceVersion") or "")
        created = self.created.get(key)
        return (
            created is not None
            and bool(uid)
            and uid != self.uids.get(key)
            and version.isdigit()
            and int(version) < created
        )

    def _see(self, key: tuple[str, str], body: Mapping[str, Any]) -> None:
        uid = str((body.get("metadata") or {}).get("uid") or "")
        known = self.uids.setdefault(key, uid)
        if uid and known and uid != known:
            # Deleted and created again under the same name: the task we waited on is gone.
            self._end(key, End.DELETED)
            return
        self.last[key] = dict(body)
        end = final_end(body)
        if end is not None:
            self._end(key, end)

    def _end(self, key: tuple[str, str], end: End) -> None:
        body = self.last.get(key) or {}
        outcome = Outcome(key[0], key[1], end, dict(body.get("status") or {}))
        self.ended[key] = outcome
        self.on_end(outcome)

    def unfinished(self, waited: float | None) -> list[Outcome]:
        """A ``Timeout`` for each task followed that has not ended."""
        return [
            Outcome(
                k[0], k[1], End.TIMEOUT, dict((self.last.get(k) or {}).get("status") or {}), waited
            )
            for k in self.keys or {}
            if k not in self.ended
        ]
