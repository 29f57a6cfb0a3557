"""Dispatch: the oldest pending tasks into the DRR core, and each grant it decides.

Each step pops the heads of the pending queues (``cache.PendingQueue``, oldest
first per namespace and capability set) into the scheduling core for as long as
workers have room and fewer than ``DISPATCH_BATCH`` grants are in flight; a
capability set no available worker covers is skipped whole. A re-dispatch
prefers another worker than the ones its failed attempts ran on (the task's
avoid set, ``claims.workers_to_avoid``).

A grant is the status compare-and-swap (phase Assigned, worker, attempt, a new
fencing token from ``TokenAllocator``), then the claim's Lease, then its Event.
A lost race (409) or a refusal gives the decision back to the core (``abort``),
and a task whose writes are refused for good back to the queue when its pause ends;
an unknown outcome leaves the core's load to follow what the task's status says,
and the task back in the queue ``RETRY_SECONDS`` later if it is still pending. A
grant that finds this replica no longer sure to lead when its turn to be sent
comes (``Controller.call``) is not sent: the decision goes back to the core and
the task back to the queue.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from agentq import claims, lifecycle, protocol
from agentq.operator import metrics
from agentq.operator.cache import TIMER_BACKOFF, TIMER_TASK
from agentq.operator.commit import RETRY_SECONDS
from agentq.operator.port import KubeError, NotLeading, Status
from agentq.scheduler import Assignment, Scheduler, TaskSpec
from agentq.views import TaskView

if TYPE_CHECKING:
    from agentq.operator.controller import Controller

log = logging.getLogger("agentq.controller")


class Dispatcher:
    """Grants pending tasks to workers (see the module docstring)."""

    def __init__(self, controller: Controller) -> None:
        self.c = controller
        self.grants: set[asyncio.Task[Any]] = set()  # grants in flight
        self._refill: asyncio.Task[None] | None = None  # the token refill in flight

    def dispatch(self) -> None:
        """Pop the oldest dispatchable heads into the DRR core while workers have room."""
        c = self.c
        budget = c.config.dispatch_batch - len(self.grants)
        if budget <= 0:
            return
        for namespace in c.queue.namespaces():
            scheduler = c.schedulers.get(namespace)
            if scheduler is None:
                continue
            blocked: set[frozenset[str]] = set()
            while budget > 0:
                best: tuple[str, str, frozenset[str]] | None = None
                for required in c.queue.sets(namespace):
                    if required in blocked:
                        continue
                    head = c.queue.head(namespace, required)
                    if head is not None and (best is None or head < best[:2]):
                        best = (head[0], head[1], required)
                if best is None:
                    break
                _, name, required = best
                key = (namespace, name)
                task = c.tasks.get(key)
                if key in c.busy:
                    # A write about it is in flight (its reclaim, say): it stays at the head
                    # and the set waits for the next step.
                    blocked.add(required)
                    continue
                if (
                    task is None
                    or not task.pending
                    or task.problem is not None
                    or c.backoff_due(task) is not None  # its timer queues it again
                ):
                    c.queue.pop(namespace, required)
                    continue
                token = c.tokens.take(task.status.fencing_token or 0)
                if token is None:
                    self._refill_tokens()
                    return
                planned = scheduler.plan(
                    [
                        TaskSpec(
                            name=name,
                            required=required,
                            cost=task.spec.cost,
                            # A re-dispatch prefers another worker than the failed ones.
                            avoid=claims.workers_to_avoid(task.status),
                        )
                    ]
                )
                if not planned:
                    blocked.add(required)  # no worker can take this set now: skip it whole
                    continue
                c.queue.pop(namespace, required)
                budget -= 1
                c.busy.add(key)
                c.publisher.mark((namespace, planned[0].worker))
                grant = c.spawn(self._grant(scheduler, task, planned[0], token))
                # Counted until done, even if cancelled before it ran (leadership lost).
                self.grants.add(grant)
                grant.add_done_callback(self.grants.discard)

    def _refill_tokens(self) -> None:
        """Reserve the next block of fencing tokens, once at a time. In flight is judged by
        the task itself, not a flag its body clears: a refill cancelled before it ran
        (leadership lost in the step that spawned it) never runs a ``finally``, and a
        flag left set would stop every dispatch for good after the lead came back."""
        c = self.c
        if self._refill is not None and not self._refill.done():
            return

        async def refill() -> None:
            try:
                await c.tokens.refill()
            except KubeError as err:
                log.warning("could not reserve fencing tokens: %s", err)
                await asyncio.sleep(RETRY_SECONDS)

        self._refill = c.spawn(refill())

    async def _grant(
        self, scheduler: Scheduler, task: TaskView, assignment: Assignment, token: int
    ) -> None:
        c = self.c
        key = task.key
        committed = False
        try:
            transition = lifecycle.grant(
                task.status,
                worker=assignment.worker,
                lease_name=protocol.task_lease_name(task.name),
                token=token,
                now=c.clock.now(),
            )
            reply = await c.write_task_status(task, transition.patch)
            if reply.status is Status.INVALID:
                scheduler.abort(assignment)
                await c.committer.refused_for_good(task, transition, reply.message)
                until = c.unwritable.get(key)
                if until is not None:  # left alone for a while: back in the queue after it
                    c.push_timer(until, (TIMER_BACKOFF, key))
                return
            if not reply.ok or reply.body is None:
                scheduler.abort(assignment)
                c.stats.conflicts += 1
                metrics.COMMIT_CONFLICTS.labels("AgentTask").inc()
                return
            committed = True
            c.observe_task(reply.body)
            updated = c.tasks.get(key)
            if updated is None:
                return  # deleted meanwhile: no Lease for it
            await c.committer.write_grant(updated, c.leases.get(c.task_lease_key(updated)))
            c.stats.grants += 1
            c.committer.record(updated, transition)
            metrics.DISPATCHES.labels(task.namespace).inc()
            since = c.pending_since.pop(key, None)
            if since is not None:
                metrics.DISPATCH_LATENCY.observe(c.clock.monotonic() - since)
        except NotLeading:
            # Not sent: our lease may have passed to a standby while this grant waited.
            if committed:  # the status is written, its Lease not: a leader repairs it
                c.push_timer(c.clock.monotonic() + RETRY_SECONDS, (TIMER_TASK, key))
            else:
                scheduler.abort(assignment)
                c.requeue(key)
        except KubeError as err:
            if not committed:
                scheduler.abort(assignment)
                # Unknown outcome: if the grant was written, the watch may have shown it
                # already (and will, if not): the core's load follows the task's status.
                c.sync_load(key)
                # If it was not, the task is still pending: back into the queue after a
                # pause, as a retry's backoff (a written grant's event takes it out of the
                # queue; a second grant on the old status would lose its CAS).
                c.push_timer(c.clock.monotonic() + RETRY_SECONDS, (TIMER_BACKOFF, key))
            c.stats.unknown += 1
            log.warning("grant of %s/%s had an unknown outcome: %s", *key, err)
            c.push_timer(c.clock.monotonic() + RETRY_SECONDS, (TIMER_TASK, key))
        finally:
            c.done(key)
            c.redecide_if_changed(task, None)


__all__ = ["Dispatcher"]
