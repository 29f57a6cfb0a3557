"""What the operator publishes of each AgentQueue: its status and its gauges (docs/tenancy.md).

The status is a report for people; no decision reads it back (``servedCost``
only seeds the next leader's count):

- ``pending``, ``inFlight``: the pending tasks that name the queue or a queue
  below it (whatever their verdict: a detached queue's tasks wait, and count),
  and the claimed (Assigned or Running) ones, as the indexes count them from the
  task records;
- ``servedCost``: the cumulative cost granted from it (its subtree's): the value
  its status showed when this leader first looked at it, plus the cost of every
  grant this leader committed from it since. A new leader (a restart, a failover)
  continues from the status, as a worker's served cost does: what the last leader
  granted after its last write of it (at most ``QUEUE_STATUS_INTERVAL``'s worth)
  is lost, and a grant whose outcome stayed unknown is not counted;
- ``share``: the queue's part of the cost granted to it and its siblings (the
  queues with the same parent; the top-level ones for a top-level queue) since this
  leader took the lead -- the window is the lead, kept simple; absent until one of
  them is granted something. ``weightShare``: its weight over the sum of its
  siblings' weights (its own included). Implicit leaves (a namespace's tasks
  without ``spec.queue``) are no AgentQueue: in neither;
- conditions ``Attached`` (False, reason ``ParentNotFound`` or ``Cycle``, the
  message naming the missing ancestor or the cycle; Unknown for a spec that does
  not fit the schema) and ``Ready`` (True: its tasks may be granted, or an inner
  queue; False: ``InvalidSpec``, ``NotAttached``, ``NoWorkerNamespace``).

When, and how often:

- What each queue should show is compared with what it shows at most once a
  second (``LOOK_SECONDS``), and at once when a queue or a namespace changed or a
  write of ours ended; a timer brings the next look when something is due.
- A change of its conditions (or of its spec's generation) is due at once; a
  change of its counts alone at most every ``QUEUE_STATUS_INTERVAL`` per queue
  (counted from when this leader started, for a queue it has not written yet).
  All the writes together stay within ``QUEUE_STATUS_QPS``, changed conditions
  first.
- One write per queue at a time (two in flight could land in either order); its
  reply is observed like a watch event, and the queue compared again. The writes
  go through the request gate: only a leader's are sent, and losing the lead
  cancels them. A refused write is not retried before ``REFUSED_SECONDS`` (RBAC)
  or ``UNWRITABLE_SECONDS`` (the API server refuses its contents).

The gauges (``agentq_queue_*``: pending, in flight, served cost, share error, weight
share) are set at each look; a deleted queue's series go with it.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agentq.clock import Clock, rfc3339
from agentq.models import QUEUE_PLURAL, AgentQueueStatus
from agentq.operator import metrics
from agentq.operator.config import OperatorConfig
from agentq.operator.gate import RequestGate
from agentq.operator.indexes import Indexes
from agentq.operator.port import Kube, KubeError, Reply, Status
from agentq.operator.store import Store
from agentq.operator.tenants import NO_WORKER_NAMESPACE, Topology, owned
from agentq.operator.work import (
    REFUSED_SECONDS,
    RETRY_SECONDS,
    TIMER_QUEUES,
    UNWRITABLE_SECONDS,
    Agenda,
    Stats,
)
from agentq.scheduler.tenancy import Charge
from agentq.views import QueueView

__all__ = [
    "LOOK_SECONDS",
    "QueueFigures",
    "QueueStatuses",
    "conditions_of",
    "figures",
    "same_status",
]

log = logging.getLogger("agentq.controller")

#: The queues' statuses are compared with what they should show at most this often.
LOOK_SECONDS = 1.0

# The one timer of the queue statuses: look again then.
_LOOK = (TIMER_QUEUES, ("", ""))

ATTACHED, READY = "Attached", "Ready"
INVALID_SPEC = "InvalidSpec"
NOT_ATTACHED = "NotAttached"

#: A condition as the operator writes it: (type, status, reason, message).
Cond = tuple[str, str, str, str]


# -- what a queue should show (pure) ---------------------------------------------------


@dataclass(frozen=True, slots=True)
class QueueFigures:
    """The counts of one queue's status."""

    pending: int
    in_flight: int
    served_cost: float
    share: float | None
    weight_share: float | None
    # The queue or one above it holds its spec.maxInFlight: its share is held down by
    # the cap its admin set, not by unfairness (AgentqQueueBeyondShare stays quiet).
    capped: bool = False


def _subtree(topo: Topology, name: str) -> list[str]:
    """``name`` and every queue below it (each once: parents may form a cycle)."""
    seen, stack = {name}, [name]
    while stack:
        for child in topo.children.get(stack.pop(), ()):
            if child not in seen:
                seen.add(child)
                stack.append(child)
    return sorted(seen)


def figures(
    queues: Mapping[str, QueueView],
    topo: Topology,
    *,
    pending: Mapping[str, int],
    claims: Mapping[str, int],
    served: Mapping[str, float],
    granted: Mapping[str, float],
) -> dict[str, QueueFigures]:
    """Every queue's counts: ``pending`` and ``claims`` per queue named by tasks (summed
    over each subtree), ``served`` its cumulative served cost, ``granted`` the cost
    granted from it since this leader started (the window of ``share``)."""
    by_parent: dict[str | None, list[str]] = {}
    for name, spec in topo.specs.items():
        by_parent.setdefault(spec.parent, []).append(name)
    out: dict[str, QueueFigures] = {}
    in_flight = {
        name: sum(
            claims.get(q, 0) for q in (_subtree(topo, name) if name in topo.specs else [name])
        )
        for name in {*queues, *topo.specs}
    }
    for name in queues:
        below = _subtree(topo, name) if name in topo.specs else [name]
        share: float | None = None
        weight_share: float | None = None
        mine = topo.specs.get(name)
        if mine is not None:
            siblings = by_parent[mine.parent]
            weights = sum(topo.specs[s].weight for s in siblings)
            weight_share = mine.weight / weights
            total = sum(granted.get(s, 0.0) for s in siblings)
            if total > 0:
                share = min(1.0, granted.get(name, 0.0) / total)
        capped = mine is not None and any(
            (cap := topo.specs[q].max_in_flight) is not None and in_flight[q] >= cap
            for q in topo.ancestors(name)
            if q in topo.specs
        )
        out[name] = QueueFigures(
            pending=sum(pending.get(q, 0) for q in below),
            in_flight=in_flight[name],
            served_cost=served.get(name, 0.0),
            share=share,
            weight_share=weight_share,
            capped=capped,
        )
    return out


def conditions_of(view: QueueView, topo: Topology) -> tuple[Cond, Cond]:
    """The queue's ``Attached`` and ``Ready`` conditions (see the module docstring)."""
    name, spec = view.name, view.spec
    if spec is None:
        why = view.problem.message if view.problem is not None else "its spec is invalid"
        return (ATTACHED, "Unknown", INVALID_SPEC, why), (READY, "False", INVALID_SPEC, why)
    if name in topo.detached:
        why = f"AgentQueue {name} is not attached: {topo.detached[name]}"
        return (
            (ATTACHED, "False", topo.detached_reason[name], why),
            (READY, "False", NOT_ATTACHED, why + "; its tasks wait"),
        )
    attached: Cond = (
        ATTACHED,
        "True",
        "Attached",
        "a top-level queue" if spec.parent is None else f"its parent {spec.parent} is attached",
    )
    if topo.children.get(name):
        return attached, (READY, "True", "Ready", "an inner queue: its children hold the tasks")
    if spec.worker_namespace is None:
        return attached, (
            READY,
            "False",
            NO_WORKER_NAMESPACE,
            "a leaf queue that names no workerNamespace: its tasks wait",
        )
    return attached, (
        READY,
        "True",
        "Ready",
        f"its tasks go to the AgentWorkers of namespace {spec.worker_namespace}",
    )


def status_of(
    view: QueueView, numbers: QueueFigures, conds: tuple[Cond, Cond], stamp: str
) -> dict[str, Any]:
    """The status to write (a JSON merge patch: None removes a field); a condition's
    transition time moves only when its status flips."""
    shown = {c.type: c for c in view.status.conditions or []}
    written = []
    for kind, status, reason, message in conds:
        before = shown.get(kind)
        moved = before is None or before.status.value != status
        written.append(
            {
                "type": kind,
                "status": status,
                "reason": reason,
                "message": message,
                "lastTransitionTime": (
                    stamp if before is None or moved else rfc3339(before.last_transition_time)
                ),
            }
        )
    ours = {c[0] for c in conds}
    return {
        "pending": numbers.pending,
        "inFlight": numbers.in_flight,
        "servedCost": round(numbers.served_cost, 6),
        "share": None if numbers.share is None else round(numbers.share, 4),
        "weightShare": None if numbers.weight_share is None else round(numbers.weight_share, 4),
        "conditions": [
            *(c.to_dict() for c in view.status.conditions or [] if c.type not in ours),
            *written,
        ],
        "observedGeneration": view.generation,
    }


def _close(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is b
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)


def same_status(shown: AgentQueueStatus, want: Mapping[str, Any]) -> tuple[bool, bool]:
    """(the conditions and generation shown are the ones wanted, the counts too)."""
    have = {(c.type, c.status.value, c.reason, c.message) for c in shown.conditions or []}
    conds = (
        all((c["type"], c["status"], c["reason"], c["message"]) in have for c in want["conditions"])
        and shown.observed_generation == want["observedGeneration"]
    )
    counts = (
        shown.pending == want["pending"]
        and shown.in_flight == want["inFlight"]
        and _close(shown.served_cost, want["servedCost"])
        and _close(shown.share, want["share"])
        and _close(shown.weight_share, want["weightShare"])
    )
    return conds, counts


# -- when to write it (the glue) ---------------------------------------------------------


@dataclass(slots=True)
class _Queue:
    """This leader's memory of one AgentQueue."""

    uid: str
    base: float = 0.0  # its status.servedCost as seen before this leader's first write
    granted: float = 0.0  # cost granted from it since this leader started
    frozen: bool = False  # written by this leader: ``base`` no longer follows the status
    written_at: float | None = None
    writing: bool = False
    hold_until: float = -math.inf  # a refused write: not again before


class QueueStatuses:
    """Each AgentQueue's status and gauges; owns when each may next be written."""

    def __init__(
        self,
        *,
        store: Store,
        indexes: Indexes,
        agenda: Agenda,
        gate: RequestGate,
        kube: Kube,
        clock: Clock,
        config: OperatorConfig,
        stats: Stats,
    ) -> None:
        self.store = store
        self.indexes = indexes
        self.agenda = agenda
        self.gate = gate
        self.kube = kube
        self.clock = clock
        self.config = config
        self.stats = stats
        self.queues: dict[str, _Queue] = {}
        self.since = clock.monotonic()  # counts wait an interval from here
        self.stale = True  # look at the next step, whatever the time
        self._looked = -math.inf
        self._series: set[str] = set()  # queues with gauges
        self._budget = max(1.0, config.queue_status_qps)
        self._budget_at = clock.monotonic()

    def reset(self) -> None:
        """This replica starts leading: served cost continues from what the statuses show,
        the window of ``share`` starts now, counts wait an interval. (The writes of the
        last time it led were cancelled with the lead.)"""
        self.queues.clear()
        self.since = self.clock.monotonic()
        self.stale = True

    def changed(self) -> None:
        """A queue or a namespace changed: conditions may have, look at the next step."""
        self.stale = True

    def timer(self) -> None:
        self.stale = True

    def granted(self, charge: Charge) -> None:
        """A grant of ``charge.cost`` from ``charge.queue`` was committed: it counts on
        the queue and each of its ancestors (implicit leaves are no AgentQueue)."""
        for name in charge.path:
            view = self.store.queues.get(name)
            if view is None:
                continue
            self._queue(view).granted += charge.cost
        self.agenda.at(self._looked + LOOK_SECONDS, _LOOK)

    def _queue(self, view: QueueView) -> _Queue:
        queue = self.queues.get(view.name)
        if queue is None or queue.uid != view.uid:  # new, or deleted and made again
            queue = self.queues[view.name] = _Queue(uid=view.uid)
        if not queue.frozen:
            shown = view.status.served_cost
            if shown is not None and math.isfinite(shown) and shown >= 0:
                queue.base = max(queue.base, shown)
        return queue

    def publish(self) -> None:
        """Look at every queue's status if it is time, and write those due (see the module
        docstring)."""
        now = self.clock.monotonic()
        qps = self.config.queue_status_qps
        self._budget = min(max(1.0, qps), self._budget + (now - self._budget_at) * qps)
        self._budget_at = now
        if not (self.store.queues or self.queues or self._series):
            return
        if not self.stale and now < self._looked + LOOK_SECONDS:
            self.agenda.at(self._looked + LOOK_SECONDS, _LOOK)  # something may have moved
            return
        self.stale = False
        self._looked = now
        self._look(now)

    def _look(self, now: float) -> None:
        views = self.store.queues
        for name in [n for n in self.queues if n not in views]:
            del self.queues[name]
        for name in self._series - views.keys():
            metrics.forget_queue(name)
            self._series.discard(name)
        topo = self.indexes.topology
        queues = {name: self._queue(view) for name, view in views.items()}
        numbers = figures(
            views,
            topo,
            pending=self.indexes.queue_pending,
            claims=self.indexes.queue_claims,
            served={name: q.base + q.granted for name, q in queues.items()},
            granted={name: q.granted for name, q in queues.items()},
        )
        stamp = rfc3339(self.clock.now())
        due: list[tuple[bool, str, dict[str, Any]]] = []
        soonest = math.inf
        for name, view in views.items():
            if not owned(name, topo, self.config.namespaces):
                # Another operator's (it watches the queue's workers): no write, no series.
                if name in self._series:
                    metrics.forget_queue(name)
                    self._series.discard(name)
                continue
            self._gauges(name, numbers[name])
            queue = queues[name]
            if queue.writing:
                continue  # compared again when its write ends
            if now < queue.hold_until:
                soonest = min(soonest, queue.hold_until)
                continue
            want = status_of(view, numbers[name], conditions_of(view, topo), stamp)
            same_conditions, same_counts = same_status(view.status, want)
            if same_conditions and same_counts:
                continue
            urgent = not same_conditions
            at = now
            if not urgent:
                written = queue.written_at if queue.written_at is not None else self.since
                at = max(now, written + self.config.queue_status_interval)
            if at > now:
                soonest = min(soonest, at)
                continue
            due.append((not urgent, name, want))
        for _, name, want in sorted(due, key=lambda d: (d[0], d[1])):
            if self._budget < 1:
                soonest = min(soonest, now + (1 - self._budget) / self.config.queue_status_qps)
                break
            self._budget -= 1
            queue = queues[name]
            queue.written_at = now
            queue.writing = queue.frozen = True
            self.stats.queue_status_writes += 1
            self.gate.spawn(self._write(name, queue.uid, want))
        if soonest < math.inf:
            self.agenda.at(soonest, _LOOK)

    def _gauges(self, name: str, numbers: QueueFigures) -> None:
        self._series.add(name)
        metrics.QUEUE_PENDING.labels(name).set(numbers.pending)
        metrics.QUEUE_IN_FLIGHT.labels(name).set(numbers.in_flight)
        metrics.QUEUE_SERVED_COST.labels(name).set(numbers.served_cost)
        metrics.QUEUE_CAPPED.labels(name).set(1 if numbers.capped else 0)
        if numbers.weight_share is not None:
            metrics.QUEUE_WEIGHT_SHARE.labels(name).set(numbers.weight_share)
        else:
            with contextlib.suppress(KeyError):
                metrics.QUEUE_WEIGHT_SHARE.remove(name)
        if numbers.share is not None and numbers.weight_share is not None:
            metrics.QUEUE_SHARE_ERROR.labels(name).set(numbers.share - numbers.weight_share)
        else:
            with contextlib.suppress(KeyError):
                metrics.QUEUE_SHARE_ERROR.remove(name)

    async def _write(self, name: str, uid: str, status: dict[str, Any]) -> None:
        reply: Reply | None = None
        try:
            # A report, not a decision: no precondition, last write wins (one write per
            # queue at a time, so the last one sent is the last one made).
            reply = await self.gate.call(
                self.kube.patch_status, QUEUE_PLURAL, "", name, None, status
            )
        except KubeError as err:
            log.info("status of AgentQueue %s: unknown outcome (%s)", name, err)
        finally:
            queue = self.queues.get(name)
            if queue is not None and queue.uid == uid:
                queue.writing = False
            self.stale = True  # compared again (the gate pokes the loop)
        if queue is None or queue.uid != uid:
            return
        if reply is None:
            queue.hold_until = self.clock.monotonic() + RETRY_SECONDS
        elif reply.status is Status.INVALID:
            # The same write would be refused again: not before a while.
            metrics.UNPROCESSABLE.labels("AgentQueue", "StatusRefused").inc()
            log.error("status of AgentQueue %s refused: %s", name, reply.message)
            queue.hold_until = self.clock.monotonic() + UNWRITABLE_SECONDS
        elif reply.status is Status.FORBIDDEN:
            self.stats.refused += 1
            log.error("status of AgentQueue %s refused: %s", name, reply.message)
            queue.hold_until = self.clock.monotonic() + REFUSED_SECONDS
        elif reply.ok and reply.body is not None:
            self.store.observe_queue(reply.body)
