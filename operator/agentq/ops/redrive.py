"""What ``agentq requeue`` selects and how fast it sends (pure).

A requeue is a request, not a write to status: the command sets the
``agentq.dev/requeue`` annotation to a fresh request id (with a resourceVersion
precondition, so it acts on what it saw) and the operator moves the task back
to Pending. Like SQS's redrive, a large batch can be paced (``--rate``) so the
fleet is not hit by every dead letter at once.
"""

from __future__ import annotations

import datetime
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from agentq.models import REQUEUABLE_PHASES, TaskPhase

Body = Mapping[str, Any]
# In the order people read them (the operator's set, one spelling).
REQUEUABLE = tuple(str(p) for p in reversed(TaskPhase) if p in REQUEUABLE_PHASES)


def phase_of(task: Body) -> str:
    return str((task.get("status") or {}).get("phase") or "Pending")


def key_of(task: Body) -> tuple[str, str]:
    meta = task.get("metadata") or {}
    return str(meta.get("namespace") or "default"), str(meta.get("name") or "?")


def refusal(task: Body) -> str | None:
    """Why ``task`` cannot be requeued now, or None if it can."""
    phase = phase_of(task)
    if phase in REQUEUABLE:
        return None
    return f"it is {phase}; only {', '.join(REQUEUABLE)} tasks can be requeued"


@dataclass(frozen=True)
class Skipped:
    namespace: str
    name: str
    phase: str
    reason: str

    def to_dict(self) -> dict[str, str]:
        return {
            "namespace": self.namespace,
            "name": self.name,
            "phase": self.phase,
            "reason": self.reason,
        }


@dataclass
class Selection:
    """The tasks to requeue, in order, and those left out with the reason."""

    chosen: list[Body] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)
    matched: int = 0  # listed tasks the selector matched, requeuable or not


def select(tasks: Iterable[Body], *, phases: Iterable[str] = REQUEUABLE) -> Selection:
    """The requeuable tasks among ``tasks`` (a selector's matches), oldest first.

    Tasks in other phases are not "skipped" (a selector naturally matches running
    ones too); they are only counted in ``matched``.
    """
    wanted = set(phases)
    selection = Selection()
    listed = list(tasks)
    selection.matched = len(listed)
    for task in listed:
        if phase_of(task) in wanted:
            selection.chosen.append(task)
    selection.chosen.sort(
        key=lambda t: (str((t.get("metadata") or {}).get("creationTimestamp") or ""), key_of(t))
    )
    return selection


def request_id(now: datetime.datetime, token: str | None = None) -> str:
    """A fresh, sortable request id: ``20260101T000000Z-1a2b3c4d``."""
    stamp = now.astimezone(datetime.UTC).strftime("%Y%m%dT%H%M%SZ")
    return f"{stamp}-{token or uuid.uuid4().hex[:8]}"


class Pacer:
    """Spaces calls evenly at ``rate`` per second; the first goes at once.

    ``rate=None`` means no pacing. The clock and sleep are injected so tests can
    check the spacing without waiting.
    """

    def __init__(
        self,
        rate: float | None,
        *,
        clock: Callable[[], float],
        sleep: Callable[[float], None],
    ) -> None:
        if rate is not None and rate <= 0:
            raise ValueError(f"rate must be > 0, not {rate}")
        self.interval = 1.0 / rate if rate else 0.0
        self.clock = clock
        self.sleep = sleep
        self._next: float | None = None

    def wait(self) -> None:
        now = self.clock()
        if self._next is not None and now < self._next:
            self.sleep(self._next - now)
            now = self._next
        self._next = now + self.interval
