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
from typing import TYPE_CHECKING, Any

from agentq import claims
from agentq.claims import Readiness
from agentq.clock import rfc3339
from agentq.models import WORKER_PLURAL
from agentq.operator import metrics
from agentq.operator.cache import TIMER_PUBLISH, Key
from agentq.operator.commit import RETRY_SECONDS
from agentq.operator.port import KubeError, Reply, Status
from agentq.scheduler import WorkerState
from agentq.views import WorkerView

if TYPE_CHECKING:
    from agentq.operator.controller import Controller

log = logging.getLogger("agentq.controller")


class Publisher:
    """Worker status and gauges; owns when each worker's status may next be written."""

    def __init__(self, controller: Controller) -> None:
        self.c = controller
        config = controller.config
        self.due: dict[Key, float] = {}  # worker -> when its status may be written
        self.now: set[Key] = set()  # workers whose status is due this step
        self.urgent: set[Key] = set()  # ...of which a change of readiness or phase
        self.written: dict[Key, float] = {}  # worker -> when we last wrote its status
        self.writing: set[Key] = set()  # workers with a status write in flight
        self.moved: set[Key] = set()  # workers whose metrics are behind the core
        self.since = controller.clock.monotonic()  # counts wait an interval from here
        self._budget = config.worker_status_qps
        self._counts_budget = min(1.0, config.worker_counts_qps)
        self._budget_at = controller.clock.monotonic()
        self._last_gauges = -math.inf

    def reset(self) -> None:
        """This replica starts leading: nothing is due, counts wait an interval (the
        controller then marks every worker urgent, to compare what it shows). The writes
        of the last time it led were cancelled, and one cancelled before it ran never
        cleared its worker from ``writing``: left there, that worker's status would never
        be written again."""
        self.writing.clear()
        self.due.clear()
        self.now.clear()
        self.urgent.clear()
        self.since = self.c.clock.monotonic()

    def forget(self, key: Key) -> None:
        """The worker is gone: drop what we remember of it."""
        self.written.pop(key, None)
        self.due.pop(key, None)
        self.now.discard(key)
        self.urgent.discard(key)
        self.moved.discard(key)
        metrics.forget_worker(*key)

    def mark(self, key: Key, *, urgent: bool = False, delay: float = 0.0) -> None:
        """The worker's status may have changed: publish it when its interval allows
        (``urgent``: a change of readiness or phase, at once), not before ``delay``."""
        c = self.c
        now = c.clock.monotonic()
        self.moved.add(key)
        due = now + delay
        if urgent:
            self.urgent.add(key)
        else:
            due = max(due, self.written.get(key, self.since) + c.config.worker_status_interval)
        current = self.due.get(key)
        if current is not None and current <= due:
            return
        self.due[key] = due
        if due <= now:
            self.now.add(key)
            c.poke()
        else:
            c.push_timer(due, (TIMER_PUBLISH, key))

    def check(self, worker: WorkerView) -> None:
        """The API server shows ``worker``'s status: if its phase or Ready condition is not
        what it should be (an older write landed last, or someone else wrote), write it
        again. Not while our own write of it is in flight (its reply is compared)."""
        c = self.c
        ready = c.ready.of.get(worker.key)
        if not c.leading or ready is None or worker.key in self.writing:
            return
        shown = ready_condition(worker)
        if shown != (ready[0].value, ready[1]) or (
            worker.status.phase != claims.worker_phase(ready[0])
        ):
            if worker.key not in self.urgent:
                log.info(
                    "worker %s/%s: its status shows %s, not %s: written again",
                    *worker.key,
                    shown[0] if shown else "no Ready condition",
                    ready[0].value,
                )
            self.mark(worker.key, urgent=True)

    def timer(self, key: Key, now: float) -> None:
        """A publish timer of ``key`` fired."""
        due = self.due.get(key)
        if due is None:
            return
        if due <= now:
            self.now.add(key)
        else:
            # The timer keeps one entry per worker, the earliest: this one was pushed for
            # an earlier time that an urgent write has since moved. Look again then.
            self.c.push_timer(due, (TIMER_PUBLISH, key))

    def publish(self) -> None:
        """Write the status of the workers whose status is due and changed (see the module
        docstring)."""
        c = self.c
        now = c.clock.monotonic()
        qps, counts_qps = c.config.worker_status_qps, c.config.worker_counts_qps
        elapsed = now - self._budget_at
        self._budget = min(qps, self._budget + elapsed * qps)
        self._counts_budget = min(max(1.0, counts_qps), self._counts_budget + elapsed * counts_qps)
        self._budget_at = now
        if not self.now:
            return
        stamp = rfc3339(c.clock.now())
        waiting = {True: 0, False: 0}  # workers put off for the budget, urgent or not
        for key in list(self.now):
            if key in self.writing:
                continue  # when its write in flight is done (``_write`` pokes the loop)
            urgent = key in self.urgent
            budget = self._budget if urgent else self._counts_budget
            if budget < 1:
                # Over the rate: each waits for its turn of the budget (not all for the
                # same moment, to be put off again but one).
                rate = qps if urgent else counts_qps
                self.now.discard(key)
                self.due[key] = now + (1 - budget + waiting[urgent]) / rate
                waiting[urgent] += 1
                c.push_timer(self.due[key], (TIMER_PUBLISH, key))
                continue
            self.now.discard(key)
            self.urgent.discard(key)
            self.due.pop(key, None)
            worker = c.workers.get(key)
            if worker is None:
                continue
            scheduler = c.schedulers.get(key[0])
            ready = c.ready.of.get(key, (Readiness.LEASE_MISSING, "no Lease seen yet"))
            if scheduler is not None and scheduler.has_worker(key[1]):
                state = scheduler.worker_state(key[1])
            else:
                state = shown_counts(worker)  # not in the core: its spec is unreadable
            status = claims.worker_status(
                worker,
                ready,
                in_flight=state.in_flight,
                in_flight_cost=state.in_flight_cost,
                served_cost=state.served_cost,
                deficit=state.deficit,
                tasks=state.tasks,
                stamp=stamp,
            )
            same_ready = ready_condition(worker) == (ready[0].value, ready[1])
            counts = {k: v for k, v in status.items() if k not in ("deficit", "conditions")}
            if same_ready and claims.same_worker_status(worker.status, counts):
                continue
            if urgent:
                self._budget -= 1
            else:
                self._counts_budget -= 1
            self.written[key] = now
            self.writing.add(key)
            c.stats.worker_status_writes += 1
            c.spawn(self._write(worker, status, urgent=urgent))

    async def _write(self, worker: WorkerView, status: dict[str, Any], *, urgent: bool) -> None:
        c = self.c
        key = worker.key
        reply: Reply | None = None
        try:
            # Worker status is a report, not a decision: no precondition, last write wins
            # (one write per worker at a time, so the last one sent is the last one made).
            reply = await c.call(
                c.kube.patch_status, WORKER_PLURAL, worker.namespace, worker.name, None, status
            )
        except KubeError as err:
            log.info("status of worker %s/%s: unknown outcome (%s)", *key, err)
        finally:
            self.writing.discard(key)
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
        if reply.ok and reply.body is not None:
            c.observe_worker(reply.body)
        current = c.workers.get(key)
        if current is not None:
            self.check(current)  # a change made while the write was in flight, too

    def gauges(self) -> None:
        """The gauges kept by the indexes, refreshed at most once a second."""
        c = self.c
        now = c.clock.monotonic()
        if now - self._last_gauges < 1.0:
            return
        self._last_gauges = now
        self._worker_metrics()
        for phase, count in c.phase_counts.items():
            metrics.TASKS_BY_PHASE.labels(phase).set(count)
        metrics.PENDING.clear()
        metrics.UNSCHEDULABLE.clear()
        metrics.OLDEST_PENDING.clear()
        pending: dict[str, int] = {}
        for namespace in c.queue.namespaces():
            unschedulable = 0
            for required, entry in c.queue.sets(namespace).items():
                label = ",".join(sorted(required)) or "-"
                pending[label] = pending.get(label, 0) + len(entry.members)
                if c.uncovered.get((namespace, required)):
                    unschedulable += len(entry.members)
                head = c.queue.head(namespace, required)
                if head is not None:
                    since = c.pending_since.get((namespace, head[1]))
                    if since is not None:
                        metrics.OLDEST_PENDING.labels(namespace, label).set(now - since)
            metrics.UNSCHEDULABLE.labels(namespace).set(unschedulable)
        for label, count in pending.items():
            metrics.PENDING.labels(label).set(count)

    def _worker_metrics(self) -> None:
        """The per-worker gauges of the workers whose core state moved since the last time
        (their status counts may wait; these need not)."""
        c = self.c
        moved, self.moved = self.moved, set()
        for key in moved:
            if key not in c.workers:
                continue
            ready = c.ready.of.get(key)
            metrics.WORKER_READY.labels(*key).set(
                1 if ready is not None and ready[0] is Readiness.READY else 0
            )
            scheduler = c.schedulers.get(key[0])
            if scheduler is None or not scheduler.has_worker(key[1]):
                continue  # not in the core (its spec is unreadable): readiness only
            state = scheduler.worker_state(key[1])
            deficit = state.deficit
            if not math.isfinite(deficit):  # a denormal weight (as in the status)
                deficit = 0.0 if math.isnan(deficit) else math.copysign(1e300, deficit)
            metrics.WORKER_DEFICIT.labels(*key).set(deficit)
            metrics.WORKER_IN_FLIGHT.labels(*key).set(state.in_flight)


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
