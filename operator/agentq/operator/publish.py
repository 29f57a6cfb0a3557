"""What the operator publishes for people: AgentWorker status, and the gauges of its indexes.

Worker status is a report, not a decision: it is written when it changes, and
its count updates stay a small fraction of the dispatch writes.

- A change of a worker's phase or Ready condition is due at once (``urgent``),
  within ``WORKER_STATUS_QPS`` writes a second for all workers together.
- A change of its counts alone (in flight, served cost, assigned tasks) is due
  at most every ``WORKER_STATUS_INTERVAL`` per worker -- counted from when this
  leader started, for a worker it has not written yet -- and all such writes
  together stay within ``WORKER_COUNTS_QPS``. The deficit alone (it moves with
  every dispatch anywhere) never causes a write. The per-worker metrics
  (``agentq_worker_in_flight``, ...) follow the core within a second.
- One write per worker at a time: a change while its write is in flight is
  written after it (two writes in flight could land in either order and leave
  the older one). What the API server then shows is compared with what it should
  show (phase and Ready condition), and written again if another writer, an
  older leader's late write or a lost reply left it different.

Only the workers whose status is due are looked at in a step. The gauges the
indexes keep (tasks by phase, pending, unschedulable, oldest pending) are
refreshed at most once a second.
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Callable
from typing import Any

from agentq import claims, protocol
from agentq.claims import Readiness
from agentq.clock import Clock, rfc3339
from agentq.models import WORKER_PLURAL
from agentq.operator import metrics
from agentq.operator.config import OperatorConfig
from agentq.operator.cores import Cores
from agentq.operator.gate import RequestGate
from agentq.operator.indexes import Indexes
from agentq.operator.port import Kube, KubeError, Reply, Status
from agentq.operator.records import PublishState, WorkerRecord
from agentq.operator.store import Store
from agentq.operator.work import REFUSED_SECONDS, RETRY_SECONDS, TIMER_PUBLISH, Agenda, Stats
from agentq.scheduler import WorkerState
from agentq.views import Key, WorkerView

log = logging.getLogger("agentq.controller")


class Publisher:
    """Worker status and gauges; owns when each worker's status may next be written."""

    def __init__(
        self,
        *,
        store: Store,
        indexes: Indexes,
        cores: Cores,
        agenda: Agenda,
        gate: RequestGate,
        kube: Kube,
        clock: Clock,
        config: OperatorConfig,
        stats: Stats,
        finished: Callable[[], Counter[str]] = Counter,
    ) -> None:
        self.store = store
        self.indexes = indexes
        self.cores = cores
        self.agenda = agenda
        self.gate = gate
        self.kube = kube
        self.clock = clock
        self.config = config
        self.stats = stats
        self.finished = finished  # finished tasks by phase (they have no record)
        self.now: set[Key] = set()  # workers whose status is due this step
        self.moved: set[Key] = set()  # workers whose metrics are behind the core
        self.since = clock.monotonic()  # counts wait an interval from here
        self._budget = config.worker_status_qps
        self._counts_budget = min(1.0, config.worker_counts_qps)
        self._budget_at = clock.monotonic()
        self._last_gauges = -math.inf

    def reset(self) -> None:
        """This replica starts leading: nothing is due, counts wait an interval (the
        controller then marks every worker urgent, to compare what it shows). The writes
        of the last time it led were cancelled, and one cancelled before it ran never
        cleared its worker's ``writing``: left so, its status would never be written
        again."""
        for record in self.store.workers.values():
            record.publish = PublishState(written_at=record.publish.written_at)
        self.now.clear()
        self.since = self.clock.monotonic()

    def forget(self, key: Key) -> None:
        """The worker is gone: its series go too (its record went with it)."""
        self.now.discard(key)
        self.moved.discard(key)
        metrics.forget_worker(*key)

    def mark(self, key: Key, *, urgent: bool = False, delay: float = 0.0) -> None:
        """The worker's status may have changed: publish it when its interval allows
        (``urgent``: a change of readiness or phase, at once), not before ``delay``."""
        record = self.store.workers.get(key)
        if record is None:
            return
        state = record.publish
        now = self.clock.monotonic()
        self.moved.add(key)
        due = now + delay
        if urgent:
            state.urgent = True
        else:
            written = state.written_at if state.written_at is not None else self.since
            due = max(due, written + self.config.worker_status_interval)
        if state.due is not None and state.due <= due:
            return
        state.due = due
        if due <= now:
            self.now.add(key)
            self.agenda.poke()
        else:
            self.agenda.at(due, (TIMER_PUBLISH, key))

    def check(self, record: WorkerRecord) -> None:
        """The API server shows the worker's status: if its phase or Ready condition is
        not what it should be (an older write landed last, or someone else wrote), write
        it again. Not while our own write of it is in flight (its reply is compared)."""
        ready = record.readiness
        if ready is None or record.publish.writing:
            return
        worker = record.view
        shown = ready_condition(worker)
        if shown != (ready[0].value, ready[1]) or (
            worker.status.phase != claims.worker_phase(ready[0])
        ):
            if not record.publish.urgent:
                log.info(
                    "worker %s/%s: its status shows %s, not %s: written again",
                    *worker.key,
                    shown[0] if shown else "no Ready condition",
                    ready[0].value,
                )
            self.mark(worker.key, urgent=True)

    def timer(self, key: Key, now: float) -> None:
        """A publish timer of ``key`` fired."""
        record = self.store.workers.get(key)
        if record is None or record.publish.due is None:
            return
        if record.publish.due <= now:
            self.now.add(key)
        else:
            # Pushed for an earlier time that an urgent write has since moved: look again.
            self.agenda.at(record.publish.due, (TIMER_PUBLISH, key))

    def publish(self) -> None:
        """Write the status of the workers whose status is due and changed (see the module
        docstring)."""
        now = self.clock.monotonic()
        qps, counts_qps = self.config.worker_status_qps, self.config.worker_counts_qps
        elapsed = now - self._budget_at
        self._budget = min(qps, self._budget + elapsed * qps)
        self._counts_budget = min(max(1.0, counts_qps), self._counts_budget + elapsed * counts_qps)
        self._budget_at = now
        if not self.now:
            return
        stamp = rfc3339(self.clock.now())
        waiting = {True: 0, False: 0}  # workers put off for the budget, urgent or not
        for key in list(self.now):
            record = self.store.workers.get(key)
            if record is None:
                self.now.discard(key)
                continue
            state = record.publish
            if state.writing:
                continue  # when its write in flight is done (it pokes the loop)
            urgent = state.urgent
            budget = self._budget if urgent else self._counts_budget
            if budget < 1:
                # Over the rate: each waits for its turn of the budget (not all for the
                # same moment, to be put off again but one).
                rate = qps if urgent else counts_qps
                self.now.discard(key)
                state.due = now + (1 - budget + waiting[urgent]) / rate
                waiting[urgent] += 1
                self.agenda.at(state.due, (TIMER_PUBLISH, key))
                continue
            self.now.discard(key)
            state.urgent = False
            state.due = None
            status = self._status(record, stamp)
            worker = record.view
            same_ready = ready_condition(worker) == _ready_of(record)
            counts = {k: v for k, v in status.items() if k not in ("deficit", "conditions")}
            if same_ready and claims.same_worker_status(worker.status, counts):
                continue
            if urgent:
                self._budget -= 1
            else:
                self._counts_budget -= 1
            state.written_at = now
            state.writing = True
            self.stats.worker_status_writes += 1
            self.gate.spawn(self._write(worker, status, urgent=urgent))

    def _status(self, record: WorkerRecord, stamp: str) -> dict[str, Any]:
        key = record.key
        core = self.cores.get(key[0])
        if core is not None and core.has_worker(key[1]):
            state = core.worker_state(key[1])
        else:
            state = shown_counts(record.view)  # not in the core: its spec is unreadable
        ready = record.readiness or (Readiness.LEASE_MISSING, "no Lease seen yet")
        return claims.worker_status(
            record.view,
            ready,
            in_flight=state.in_flight,
            in_flight_cost=state.in_flight_cost,
            served_cost=state.served_cost,
            deficit=state.deficit,
            tasks=state.tasks,
            stamp=stamp,
        )

    async def _write(self, worker: WorkerView, status: dict[str, Any], *, urgent: bool) -> None:
        key = worker.key
        reply: Reply | None = None
        try:
            # Worker status is a report, not a decision: no precondition, last write wins
            # (one write per worker at a time, so the last one sent is the last one made).
            reply = await self.gate.call(
                self.kube.patch_status, WORKER_PLURAL, worker.namespace, worker.name, None, status
            )
        except KubeError as err:
            log.info("status of worker %s/%s: unknown outcome (%s)", *key, err)
        finally:
            record = self.store.workers.get(key)
            if record is not None:
                record.publish.writing = False
        if reply is None:
            # Written again after a pause (compared with what it should show by then).
            self.mark(key, urgent=urgent, delay=RETRY_SECONDS)
            return
        if reply.status is Status.INVALID:
            # The same write would be refused again: no retry (a later change may pass).
            metrics.UNPROCESSABLE.labels("AgentWorker", "StatusRefused").inc()
            log.error(
                "status of worker %s/%s refused: %s", worker.namespace, worker.name, reply.message
            )
            return
        if reply.status is Status.GONE:
            return  # the worker was deleted: its DELETED event follows
        if reply.status is Status.FORBIDDEN:
            self.stats.refused += 1
            log.error("status of worker %s/%s refused: %s", *key, reply.message)
            self.mark(key, urgent=urgent, delay=REFUSED_SECONDS)
            return
        if reply.ok and reply.body is not None:
            self.store.observe_worker(reply.body)
        # Compared with what it should show by the step (a change made while the write
        # was in flight, too).
        if key in self.store.workers:
            self.store.changed.workers[key] = None
            self.agenda.poke()

    def gauges(self) -> None:
        """The gauges kept by the indexes, refreshed at most once a second."""
        now = self.clock.monotonic()
        if now - self._last_gauges < 1.0:
            return
        self._last_gauges = now
        self._worker_metrics()
        for phase, count in (self.indexes.phases + self.finished()).items():
            metrics.TASKS_BY_PHASE.labels(phase).set(count)
        metrics.PENDING.clear()
        metrics.NAMESPACE_PENDING.clear()
        metrics.UNSCHEDULABLE.clear()
        metrics.OLDEST_PENDING.clear()
        queue = self.indexes.queue
        pending: dict[str, int] = {}
        by_namespace: dict[tuple[str, str], int] = {}
        oldest: dict[tuple[str, str], float] = {}
        for namespace in queue.namespaces():
            unschedulable = 0
            for lane in queue.lanes_of(namespace):
                for where, entry in queue.sets(lane).items():
                    required = where[0]
                    label = ",".join(sorted(required)) or "-"
                    pending[label] = pending.get(label, 0) + len(entry.members)
                    place = (namespace, label)
                    by_namespace[place] = by_namespace.get(place, 0) + len(entry.members)
                    if self.indexes.uncovered.get((namespace, required)):
                        unschedulable += len(entry.members)
                    head = queue.head(lane, where)
                    if head is not None:
                        record = self.store.tasks.get(protocol.claim_task(namespace, head[2]))
                        if record is not None and record.pending_since is not None:
                            age = now - record.pending_since
                            if age > oldest.get((namespace, label), -1.0):
                                oldest[(namespace, label)] = age
            metrics.UNSCHEDULABLE.labels(namespace).set(unschedulable)
        for (namespace, label), age in oldest.items():
            metrics.OLDEST_PENDING.labels(namespace, label).set(age)
        for label, count in pending.items():
            metrics.PENDING.labels(label).set(count)
        for (namespace, label), count in by_namespace.items():
            metrics.NAMESPACE_PENDING.labels(namespace, label).set(count)

    def _worker_metrics(self) -> None:
        """The per-worker gauges of the workers whose core state moved since the last time
        (their status counts may wait; these need not)."""
        moved, self.moved = self.moved, set()
        for key in moved:
            record = self.store.workers.get(key)
            if record is None:
                continue
            ready = record.readiness
            metrics.WORKER_READY.labels(*key).set(
                1 if ready is not None and ready[0] is Readiness.READY else 0
            )
            core = self.cores.get(key[0])
            if core is None or not core.has_worker(key[1]):
                continue  # not in the core (its spec is unreadable): readiness only
            state = core.worker_state(key[1])
            deficit = state.deficit
            if not math.isfinite(deficit):  # a denormal weight (as in the status)
                deficit = 0.0 if math.isnan(deficit) else math.copysign(1e300, deficit)
            metrics.WORKER_DEFICIT.labels(*key).set(deficit)
            metrics.WORKER_IN_FLIGHT.labels(*key).set(state.in_flight)


def _ready_of(record: WorkerRecord) -> tuple[str, str]:
    ready = record.readiness or (Readiness.LEASE_MISSING, "no Lease seen yet")
    return ready[0].value, ready[1]


def shown_counts(worker: WorkerView) -> WorkerState:
    """The counts a worker's status shows, for a worker the core does not hold (its
    readiness is written all the same; its counts stay what they were)."""
    shown = worker.status
    return WorkerState(
        deficit=shown.deficit or 0.0,
        in_flight=shown.in_flight or 0,
        in_flight_cost=shown.in_flight_cost or 0.0,
        served_cost=shown.served_cost or 0.0,
        tasks=frozenset(shown.assigned_tasks or ()),
    )


def ready_condition(worker: WorkerView) -> tuple[str, str] | None:
    """The (reason, message) of the worker's Ready condition as its status says."""
    for c in worker.status.conditions or []:
        if c.type == "Ready":
            return c.reason, c.message
    return None


__all__ = ["Publisher", "ready_condition"]
