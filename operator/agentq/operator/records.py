"""The records of the store: one per watched object, with the operator's memory of it.

``TaskRecord``, ``WorkerRecord`` and ``LeaseRecord`` each hold the object's typed view
(``agentq.views``) and what the operator remembers of it (grace, backoff, writes in
flight, readiness, publish state...); ``Tombstones`` keep the resourceVersion at which
deleted objects went, so a late reply does not bring one back. ``newer`` compares
resourceVersions. The store (``agentq.operator.store``) owns the records.

Pure data: no I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from agentq.claims import Readiness
from agentq.expiry import Observation
from agentq.views import Key, LeaseView, TaskView, WorkerView

__all__ = [
    "TOMBSTONE_SECONDS",
    "Grace",
    "LeaseRecord",
    "PublishState",
    "TaskRecord",
    "Tombstones",
    "WorkerRecord",
    "newer",
    "rv_int",
]


# The least time a tombstone is kept (``Tombstones``): well over a request timeout (10 s
# by default; the controller keeps them longer when the timeout is set longer).
TOMBSTONE_SECONDS = 60.0


def rv_int(resource_version: str) -> int | None:
    """resourceVersions are etcd revisions (increasing integers) on every supported API
    server; a non-numeric one is taken as newer than anything (None)."""
    try:
        return int(resource_version)
    except ValueError:
        return None


def newer(new: str, old: str) -> bool:
    """Whether ``new`` is a later version than ``old`` (equal is not newer)."""
    a, b = rv_int(new), rv_int(old)
    if a is None or b is None:
        return new != old
    return a > b


@dataclass
class Grace:
    """A grace period started for the claim with ``token``; ends at ``deadline``."""

    token: int
    deadline: float  # monotonic


@dataclass(slots=True)
class TaskRecord:
    view: TaskView
    grace: Grace | None = None  # of the current claim, once started (leader memory)
    progress_written: float | None = None  # when status.progress was last written
    pending_since: float | None = None  # when it last became pending (latency metric)
    backoff: tuple[str, float] | None = None  # (status.notBefore, its end on our clock)
    deadline: tuple[str, float] | None = None  # (status.startTime, activeDeadline on our clock)
    retry_at: float | None = None  # pending: not granted before (a refused or deposed grant)
    redecide_at: float | None = None  # decided again then (a write's unknown outcome, ...)
    lost_race_at: str | None = None  # a grant on this resourceVersion lost its CAS: wait
    unwritable_until: float | None = None  # its writes are refused for good: left alone
    busy: bool = False  # a write about it is in flight
    waiting: bool = False  # marked while busy: decided again when the write ends
    granting: str | None = None  # the worker a grant in flight goes to
    # Refused by an AgentBudget at the head of its set: (reason, message, since when):
    # the condition Budgeted says so once it waited WAIT_REPORT_SECONDS (dispatch.py).
    budget_wait: tuple[str, str, float] | None = None
    write: int = 0  # which write is in flight (``start_write``'s ticket): only it ends it
    # A grant to this worker whose outcome is unknown (its request timed out): it may
    # still land, so its slot stays held and the task is not granted again until a
    # newer view of the task says what happened, or until the monotonic time given.
    doubt: tuple[str, float] | None = None
    # The namespace of the worker of the grant in flight or in doubt, when it is not the
    # task's (a claim across namespaces); None: the task's own.
    claim_ns: str | None = None
    # The grant's Lease in another namespace could not be written (that namespace is
    # gone or terminating, or refuses us): (the fencing token, since when on our clock,
    # why). Once that lasted the claim's lease duration, the attempt is failed as an
    # expired one would be (``claims.Seen.lease_unwritable``).
    lease_unwritable: tuple[int, float, str] | None = None
    # The API server refused the revoke mark on the claim's Lease for good (422): (the
    # fencing token, why). The decision then ends the claim without it
    # (``claims.Seen.revoke_refused``).
    revoke_refused: tuple[int, str] | None = None

    @property
    def key(self) -> Key:
        return self.view.key


@dataclass(slots=True)
class PublishState:
    """When a worker's status may next be written, and whether a write is out."""

    due: float | None = None  # when its status may be written (None: nothing to write)
    urgent: bool = False  # a change of readiness or phase is waiting
    written_at: float | None = None  # when we last wrote it
    writing: bool = False  # a write is in flight


@dataclass(slots=True)
class WorkerRecord:
    view: WorkerView
    readiness: tuple[Readiness, str] | None = None  # as last evaluated
    suspect_since: float | None = None  # a claim of it expired then, not renewed since
    unlabelled: bool = False  # its Lease exists without our label (a direct read said)
    diagnosed_at: float = -math.inf  # when that read was last sent
    offered: frozenset[str] = frozenset()  # capabilities it offers (none if unreadable)
    publish: PublishState = field(default_factory=PublishState)

    @property
    def key(self) -> Key:
        return self.view.key


@dataclass(slots=True)
class LeaseRecord:
    view: LeaseView
    seen: Observation  # when its holder was last seen to renew it (our clock)
    refused_report: str | None = None  # the report on it that was refused already
    deleting: bool = False  # our delete of it is on its way
    revoked_at: float | None = None  # when it was first seen revoked (our clock)
    # The resourceVersion at which a read of the task it names was refused (403: a
    # namespace we may not read): not read again at every resync until it changes.
    unjudged: str | None = None

    @property
    def key(self) -> Key:
        return self.view.key


class Tombstones:
    """The resourceVersion at which recently deleted objects went, so a late reply does not
    bring one back: each kept for at least one period of ``age`` (the store's
    ``expire_tombstones``: ``TOMBSTONE_SECONDS`` or more) and at most two, and at most
    ``limit`` at once (a burst over it ages the older half early).

    A late reply comes within a request timeout, and a new leader's catch-up LIST is
    waited for (the controller does not age them meanwhile), so an older tombstone
    refuses nothing. Kept by count alone (the newest ``limit``), a steady rate of tasks
    finished and deleted held 10,000 of them: the operator's memory grew for half an
    hour at 5 tasks/s.
    Two plain dicts, the newer and the older generation: ``age`` drops the older one
    whole, so no entry carries a timestamp or a link."""

    def __init__(self, limit: int = 10_000) -> None:
        self.limit = limit
        self._new: dict[Key, str] = {}
        self._old: dict[Key, str] = {}

    def bury(self, key: Key, resource_version: str) -> None:
        self._old.pop(key, None)
        self._new[key] = resource_version
        if len(self._new) >= self.limit // 2:
            self.age()

    def buried(self, key: Key, resource_version: str) -> bool:
        """A body at ``resource_version`` is older than the deletion we saw."""
        gone = self._new.get(key)
        if gone is None:
            gone = self._old.get(key)
        return gone is not None and not newer(resource_version, gone)

    def holds(self, key: Key) -> bool:
        """Whether ``key`` went recently (whatever the version)."""
        return key in self._new or key in self._old

    def revive(self, key: Key) -> None:
        self._new.pop(key, None)
        self._old.pop(key, None)

    def age(self) -> None:
        """The older generation goes; the newer one becomes the older."""
        self._old, self._new = self._new, {}

    def __len__(self) -> int:
        return len(self._new) + len(self._old)
