"""The controller loop: decides every transition and commits it, in numbered steps.

Watches feed the store and the lease tracker (``observe_*``); one loop, run
only by the leader, then works a pass at a time:

1. workers    - mirror AgentWorkers (and their Lease freshness) into the schedulers
2. load       - mirror the tasks the API server says are in flight into the schedulers
3. claims     - for each in-flight task: repair a half-made grant, mark Running, copy
                progress, commit a valid report or refuse a stale one, and act on an
                expired lease or a progress deadline (onLeaseExpiry)
4. requeues   - honour ``agentq requeue`` requests on Held / DeadLettered / Failed tasks
5. dispatch   - plan Pending tasks with the scheduling core, commit each grant
6. publish    - worker status and metrics

Every write is a compare-and-swap on the resourceVersion the decision was made
on; on a conflict the decision is dropped (and, for a grant, given back to the
scheduler with ``abort``) and the next pass decides again from fresh state.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import logging
import random
from collections.abc import Awaitable, Iterable
from dataclasses import dataclass
from typing import Any

from kubernetes import client
from pydantic import ValidationError

from agentq import lifecycle, protocol
from agentq.clock import Clock, micro_rfc3339, parse_time, rfc3339
from agentq.expiry import LeaseRecord, LeaseTracker
from agentq.models import RetryBackoff
from agentq.operator import metrics
from agentq.operator.config import OperatorConfig
from agentq.operator.kube import Kube
from agentq.operator.store import Body, Key, Store, key_of
from agentq.scheduler import Assignment, Scheduler, TaskSpec, WorkerSpec

log = logging.getLogger("agentq.controller")
TASKS = "agenttasks"
WORKERS = "agentworkers"
LeaseKey = tuple[str, str, str]


def lease_key(namespace: str, name: str) -> LeaseKey:
    return ("lease", namespace, name)


def _spec(body: Body) -> dict[str, Any]:
    return dict(body.get("spec") or {})


def _status(body: Body) -> dict[str, Any]:
    return dict(body.get("status") or {})


def _rv(body: Body) -> str | None:
    rv = (body.get("metadata") or {}).get("resourceVersion")
    return str(rv) if rv is not None else None


def _backoff(spec: dict[str, Any]) -> RetryBackoff:
    """The task's retry backoff; the defaults if the API server let through a bad one."""
    try:
        return RetryBackoff.model_validate(spec.get("retryBackoff") or {})
    except ValidationError:
        log.warning("unreadable retryBackoff %r; using the defaults", spec.get("retryBackoff"))
        return RetryBackoff()


def merge_transitions(transitions: list[lifecycle.Transition]) -> lifecycle.Transition | None:
    if not transitions:
        return None
    patch: dict[str, Any] = {}
    for t in transitions:
        patch.update(t.patch)
    last = transitions[-1]
    return lifecycle.Transition(
        patch=patch,
        reason=last.reason,
        message=last.message,
        warning=last.warning,
        extra_events=tuple(e for t in transitions for e in t.extra_events),
    )


@dataclass
class _Grace:
    token: int
    deadline: float  # monotonic


class Controller:
    """Holds the schedulers and the lease tracker; runs passes while leader."""

    def __init__(
        self,
        *,
        store: Store,
        kube: Kube,
        clock: Clock,
        config: OperatorConfig,
        rng: random.Random | None = None,
    ) -> None:
        self.store = store
        self.kube = kube
        self.clock = clock
        self.config = config
        self.rng = rng or random.Random()
        self.tracker = LeaseTracker()
        self.schedulers: dict[str, Scheduler] = {}
        self.leading = not config.leader_election
        self._grace: dict[Key, _Grace] = {}
        self._refused: set[tuple[Key, str]] = set()  # (lease key, report text)
        self._worker_status: dict[Key, tuple[str, float]] = {}
        self._pending_since: dict[Key, float] = {}
        # Workers whose task Lease expired, and when: not eligible until their own worker
        # Lease is seen renewed after that, so a re-dispatch does not go straight back to
        # a worker that may be dead but whose worker Lease has not run out yet.
        self._suspect: dict[Key, float] = {}
        self._writes = asyncio.Semaphore(config.write_concurrency)

    # -- feeding (called from watch handlers; never blocks) ----------------------------

    def observe_task(self, body: Body, *, deleted: bool = False) -> None:
        if deleted:
            self.store.tasks.delete(body)
            self._pending_since.pop(key_of(body), None)
        else:
            self.store.tasks.put(body)
        self.store.poke()

    def observe_worker(self, body: Body, *, deleted: bool = False) -> None:
        if deleted:
            self.store.workers.delete(body)
        else:
            self.store.workers.put(body)
        self.store.poke()

    def observe_lease(self, body: Body, *, deleted: bool = False) -> None:
        namespace, name = key_of(body)
        key = lease_key(namespace, name)
        if deleted:
            self.store.leases.delete(body)
            self.tracker.forget(key)
            self.store.poke()
            return
        if not self.store.leases.put(body):
            return  # older than what we hold: our own write already told us more
        meta = body.get("metadata") or {}
        spec = body.get("spec") or {}
        annotations = meta.get("annotations") or {}
        record = LeaseRecord(
            holder=spec.get("holderIdentity"),
            renew_time=spec.get("renewTime"),
            duration=float(spec.get("leaseDurationSeconds") or self.config.default_lease_seconds),
            token=protocol.lease_token(annotations),
            progress=annotations.get(protocol.ANNOTATION_PROGRESS),
        )
        age = 0.0
        is_worker = (meta.get("labels") or {}).get(protocol.LABEL_LEASE_KIND) == "worker"
        if is_worker and self.tracker.record(key) is None:
            # A worker Lease seen for the first time proves readiness only if its holder
            # renewed it recently by our wall clock; otherwise it is stale until it changes.
            renewed = parse_time(spec.get("renewTime"))
            if renewed is None or (self.clock.now() - renewed).total_seconds() > record.duration:
                age = record.duration
        self.tracker.observe(key, record, self.clock.monotonic(), age=age)
        self.store.poke()

    # -- the loop ----------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await self.store.wait_changed(self.next_wakeup())
            if stop.is_set():
                return
            if not self.leading:
                continue
            try:
                await self.reconcile_once()
            except Exception:  # a pass must never kill the loop; the next one retries
                log.exception("controller pass failed")
                await asyncio.sleep(1.0)

    def set_leading(self, leading: bool) -> None:
        if leading and not self.leading:
            # A new leader starts from what the API server says, not from old memory.
            self.schedulers.clear()
            self._grace.clear()
        self.leading = leading
        metrics.LEADER.set(1 if leading else 0)
        self.store.poke()

    def next_wakeup(self) -> float:
        """Seconds until the earliest known deadline, at most the reconcile interval."""
        now = self.clock.monotonic()
        soonest = now + self.config.reconcile_interval
        for key in self.tracker.known():
            expires = self.tracker.expires_at(key)
            if expires is not None and expires > now:
                soonest = min(soonest, expires)
        for grace in self._grace.values():
            soonest = min(soonest, max(now, grace.deadline))
        # A task waiting out its retry backoff becomes dispatchable at its notBefore.
        wall = self.clock.now()
        for body in self.store.tasks:
            not_before = parse_time(_status(body).get("notBefore"))
            if not_before is not None and not_before > wall:
                soonest = min(soonest, now + (not_before - wall).total_seconds())
        return max(0.05, soonest - now)

    async def reconcile_once(self) -> None:
        self._sync_workers()  # 1
        self._sync_load()  # 2
        await self._claims()  # 3
        await self._requeues()  # 4
        self._sync_workers()  # again: step 3 may have made a worker suspect
        self._sync_load()  # and may have freed capacity
        await self._dispatch()  # 5
        await self._publish()  # 6

    # 1 -- workers ----------------------------------------------------------------------

    def worker_ready(self, namespace: str, name: str) -> bool:
        key = lease_key(namespace, protocol.worker_lease_name(name))
        if not self.tracker.fresh(key, self.clock.monotonic()):
            return False
        suspect_since = self._suspect.get((namespace, name))
        if suspect_since is None:
            return True
        changed = self.tracker.last_change(key)
        if changed is not None and changed > suspect_since:
            del self._suspect[(namespace, name)]
            return True
        return False

    def _scheduler(self, namespace: str) -> Scheduler:
        scheduler = self.schedulers.get(namespace)
        if scheduler is None:
            scheduler = self.schedulers[namespace] = Scheduler()
        return scheduler

    def _sync_workers(self) -> None:
        seen: dict[str, set[str]] = {}
        for body in self.store.workers:
            namespace, name = key_of(body)
            spec = _spec(body)
            scheduler = self._scheduler(namespace)
            joined = not scheduler.has_worker(name)
            scheduler.upsert_worker(
                WorkerSpec(
                    name=name,
                    capabilities=frozenset(spec.get("capabilities") or ()),
                    weight=float(spec.get("weight", 1)),
                    max_in_flight=int(spec.get("maxInFlight", 1)),
                    paused=bool(spec.get("paused", False)),
                    ready=self.worker_ready(namespace, name),
                )
            )
            if joined:
                # A fresh core (restart, new leader) continues the cumulative count.
                served = _status(body).get("servedCost")
                if isinstance(served, int | float) and served >= 0:
                    scheduler.carry_over_served(name, float(served))
            seen.setdefault(namespace, set()).add(name)
        for namespace, scheduler in self.schedulers.items():
            for name in scheduler.workers():
                if name not in seen.get(namespace, set()):
                    scheduler.remove_worker(name)

    # 2 -- load -------------------------------------------------------------------------

    def _sync_load(self) -> None:
        """Make each scheduler's in-flight set equal to what the task statuses say."""
        truth: dict[str, dict[str, tuple[str, float]]] = {}
        phases: dict[Key, str] = {}
        for body in self.store.tasks:
            namespace, name = key_of(body)
            status = _status(body)
            phases[(namespace, name)] = str(status.get("phase") or "")
            if status.get("phase") in lifecycle.ACTIVE_PHASES and status.get("worker"):
                cost = float(_spec(body).get("cost", 1))
                truth.setdefault(namespace, {})[name] = (str(status["worker"]), cost)
        for namespace, scheduler in self.schedulers.items():
            wanted = truth.get(namespace, {})
            held: dict[str, str] = {}
            for worker in scheduler.workers():
                for task in scheduler.worker_state(worker).tasks:
                    held[task] = worker
            for task, worker in held.items():
                if wanted.get(task, (None,))[0] != worker:
                    completed = phases.get((namespace, task)) == "Succeeded"
                    scheduler.release(task, completed=completed)
            known = set(scheduler.workers())
            for task, (worker, cost) in wanted.items():
                if held.get(task) != worker and worker in known:
                    scheduler.restore(Assignment(task=task, worker=worker, cost=cost))

    # 3 -- claims -----------------------------------------------------------------------

    async def _claims(self) -> None:
        jobs: list[Awaitable[object]] = []
        for body in self.store.tasks:
            status = _status(body)
            if status.get("phase") in lifecycle.ACTIVE_PHASES or self._lease_of(body) is not None:
                jobs.append(self._claim(body))
        await self._gather(jobs)

    def _lease_of(self, task: Body) -> Body | None:
        namespace, name = key_of(task)
        return self.store.leases.get((namespace, protocol.task_lease_name(name)))

    async def _claim(self, task: Body) -> None:
        namespace, name = key_of(task)
        status = _status(task)
        spec = _spec(task)
        phase = status.get("phase")
        lease = self._lease_of(task)
        token = int(status.get("fencingToken") or 0)
        worker = status.get("worker")

        if lease is not None:
            report_text = (lease["metadata"].get("annotations") or {}).get(
                protocol.ANNOTATION_REPORT
            )
            if report_text and await self._report(task, lease, report_text):
                return
        if phase not in lifecycle.ACTIVE_PHASES:
            if lease is not None and phase != "Held":
                # The attempt is over (a deletion lost a race, or the operator died before
                # it): remove the Lease so the old holder's next write finds nothing.
                async with self._writes:
                    await self.kube.delete_lease(namespace, lease["metadata"]["name"], _rv(lease))
            return
        lease_spec = (lease or {}).get("spec") or {}
        lease_token = protocol.lease_token((lease or {}).get("metadata", {}).get("annotations"))
        if lease is None or lease_token != token or lease_spec.get("holderIdentity") != worker:
            if lease_token is not None and lease_token > token:
                log.error(
                    "lease of %s/%s has token %s above the task's %s",
                    namespace,
                    name,
                    lease_token,
                    token,
                )
                return
            await self._write_lease(task)  # a grant whose Lease write did not happen
            return

        key = lease_key(namespace, lease["metadata"]["name"])
        now = self.clock.monotonic()
        transitions: list[lifecycle.Transition] = []
        if phase == "Assigned" and lease_spec.get("renewTime") != lease_spec.get("acquireTime"):
            transitions.append(lifecycle.start(status, now=self.clock.now()))
        marker = (lease["metadata"].get("annotations") or {}).get(protocol.ANNOTATION_PROGRESS)
        if marker is not None and marker != status.get("progress"):
            transitions.append(lifecycle.progress(status, marker=marker))

        deadline = spec.get("progressDeadlineSeconds")
        if self.tracker.expired(key, now):
            expiry = self._on_expiry(task, status, spec, token, now)
            if expiry is not None:
                transitions.append(expiry)
        elif (task_key := (namespace, name)) in self._grace:
            del self._grace[task_key]  # the holder came back within its grace period
            transitions.append(
                lifecycle.Transition(patch={"graceUntil": None}, reason="", message="")
            )
        elif (
            deadline
            and phase == "Running"
            and self.tracker.progress_stalled_for(key, now) >= float(deadline)
        ):
            transitions.append(
                self._fail(
                    status,
                    spec,
                    reason="ProgressDeadlineExceeded",
                    message=f"no progress for {deadline}s while the lease was renewed",
                )
            )
        merged = merge_transitions(transitions)
        if merged is not None:
            await self._commit(task, merged, lease=lease)

    def _on_expiry(
        self, task: Body, status: dict[str, Any], spec: dict[str, Any], token: int, now: float
    ) -> lifecycle.Transition | None:
        policy = spec.get("onLeaseExpiry", "Redispatch")
        key = key_of(task)
        if status.get("worker"):
            self._suspect.setdefault((key[0], str(status["worker"])), now)
        message = f"lease held by {status.get('worker')} was not renewed in time"
        if policy == "Hold":
            return lifecycle.hold(status, reason="LeaseExpired", now=self.clock.now())
        if policy == "GracePeriod":
            grace = self._grace.get(key)
            if grace is None or grace.token != token:
                seconds = float(spec.get("gracePeriodSeconds") or 0)
                self._grace[key] = _Grace(token=token, deadline=now + seconds)
                until = self.clock.now() + datetime.timedelta(seconds=seconds)
                return lifecycle.grace(status, until=until, now=self.clock.now())
            if now < grace.deadline:
                return None
            del self._grace[key]
            message += f", nor reported within the {spec.get('gracePeriodSeconds')}s grace period"
        failed = self._fail(status, spec, reason="LeaseExpired", message=message)
        # The expiry is an event of its own, before the Reclaimed / DeadLettered it causes.
        return dataclasses.replace(
            failed, extra_events=(("LeaseExpired", message), *failed.extra_events)
        )

    def _fail(
        self,
        status: dict[str, Any],
        spec: dict[str, Any],
        *,
        reason: str,
        message: str,
        error: dict[str, Any] | None = None,
    ) -> lifecycle.Transition:
        max_reclaims = spec.get("maxReclaims")
        return lifecycle.fail_attempt(
            status,
            reason=reason,
            message=message,
            max_reclaims=int(self.config.max_reclaims if max_reclaims is None else max_reclaims),
            backoff=_backoff(spec),
            now=self.clock.now(),
            rng=self.rng,
            error=error,
        )

    async def _report(self, task: Body, lease: Body, text: str) -> bool:
        """Commit a valid report, or refuse a stale one. True if the task was handled."""
        namespace, name = key_of(task)
        status = _status(task)
        lease_meta = lease["metadata"]
        # One refusal per distinct report: renewals change the Lease's resourceVersion
        # but not the stale report it may still carry.
        seen_key = ((namespace, lease_meta["name"]), text)
        try:
            report = protocol.Report.decode(text)
        except protocol.ProtocolError as err:
            if seen_key not in self._refused:
                self._refused.add(seen_key)
                await self.kube.event(
                    task, reason="StaleReportRefused", message=str(err), warning=True
                )
            return False
        current = (
            status.get("phase") in lifecycle.ACTIVE_PHASES
            and report.token == int(status.get("fencingToken") or 0)
            and report.worker == status.get("worker")
            and (lease.get("spec") or {}).get("holderIdentity") == report.worker
            and protocol.lease_token(lease_meta.get("annotations")) == report.token
        )
        if not current:
            if seen_key not in self._refused:
                self._refused.add(seen_key)
                metrics.STALE_REPORTS.inc()
                await self.kube.event(
                    task,
                    reason="StaleReportRefused",
                    message=(
                        f"refused a {report.outcome} report from {report.worker} with token "
                        f"{report.token}: the current attempt is {status.get('attempt')} on "
                        f"{status.get('worker')} with token {status.get('fencingToken')} "
                        f"(phase {status.get('phase')})"
                    ),
                    warning=True,
                )
                log.warning("refused stale report on %s/%s: %s", namespace, name, text[:200])
            return False
        spec = _spec(task)
        now = self.clock.now()
        if report.outcome == "Succeeded":
            transition = lifecycle.succeed(status, report, now=now)
        elif report.error is not None and not report.error.retryable:
            transition = lifecycle.fail_terminal(status, report, now=now)
        else:
            error = report.error or protocol.ErrorInfo(reason="Failed")
            transition = self._fail(
                status,
                spec,
                reason=error.reason,
                message=error.message or "the agent reported a retryable failure",
                error={"reason": error.reason, "message": error.message, "retryable": True},
            )
        metrics.COMPLETIONS.labels(report.outcome).inc()
        await self._commit(task, transition, lease=lease)
        return True

    async def _write_lease(self, task: Body) -> None:
        namespace, name = key_of(task)
        status = _status(task)
        spec = _spec(task)
        meta = task["metadata"]
        now = micro_rfc3339(self.clock.now())
        worker = str(status["worker"])
        lease = client.V1Lease(
            metadata=client.V1ObjectMeta(
                name=protocol.task_lease_name(name),
                namespace=namespace,
                labels={
                    protocol.LABEL_LEASE_KIND: "task",
                    protocol.LABEL_TASK: protocol.label_value(name),
                    protocol.LABEL_WORKER: protocol.label_value(worker),
                },
                annotations={
                    protocol.ANNOTATION_TOKEN: str(status["fencingToken"]),
                    protocol.ANNOTATION_ATTEMPT: str(status.get("attempt") or 1),
                },
                owner_references=[
                    client.V1OwnerReference(
                        api_version=task.get("apiVersion", "agentq.dev/v1alpha1"),
                        kind="AgentTask",
                        name=name,
                        uid=meta["uid"],
                        controller=True,
                        block_owner_deletion=False,
                    )
                ],
            ),
            spec=client.V1LeaseSpec(
                holder_identity=worker,
                lease_duration_seconds=int(
                    spec.get("leaseDurationSeconds") or self.config.default_lease_seconds
                ),
                acquire_time=now,
                renew_time=now,
                lease_transitions=int(status.get("attempt") or 1) - 1,
            ),
        )
        async with self._writes:
            written = await self.kube.put_lease(namespace, lease)
        if written is not None:
            self.observe_lease(self.kube.lease_to_dict(written))

    # 4 -- requeues ---------------------------------------------------------------------

    async def _requeues(self) -> None:
        jobs: list[Awaitable[object]] = []
        for body in self.store.tasks:
            request = (body["metadata"].get("annotations") or {}).get(protocol.ANNOTATION_REQUEUE)
            status = _status(body)
            if (
                request
                and request != status.get("requeueHandled")
                and status.get("phase") in ("Held", "DeadLettered", "Failed")
            ):
                transition = lifecycle.requeue(status, now=self.clock.now(), request=request)
                jobs.append(self._commit(body, transition, lease=self._lease_of(body)))
        await self._gather(jobs)

    # 5 -- dispatch ---------------------------------------------------------------------

    def _dispatchable(self) -> dict[str, list[Body]]:
        wall = self.clock.now()
        out: dict[str, list[Body]] = {}
        for body in self.store.tasks:
            status = _status(body)
            if status.get("phase") not in (None, "Pending"):
                continue
            not_before = parse_time(status.get("notBefore"))
            if not_before is not None and not_before > wall:
                continue
            namespace, _ = key_of(body)
            out.setdefault(namespace, []).append(body)
            self._pending_since.setdefault(key_of(body), self.clock.monotonic())
        for bodies in out.values():
            bodies.sort(key=lambda b: (b["metadata"].get("creationTimestamp") or "", key_of(b)[1]))
        return out

    async def _dispatch(self) -> None:
        jobs: list[Awaitable[object]] = []
        for namespace, bodies in self._dispatchable().items():
            scheduler = self.schedulers.get(namespace)
            if scheduler is None:
                continue
            batch = bodies[: self.config.dispatch_batch]
            by_name = {key_of(b)[1]: b for b in batch}
            specs = [
                TaskSpec(
                    name=key_of(b)[1],
                    required=frozenset(_spec(b).get("requiredCapabilities") or ()),
                    cost=float(_spec(b).get("cost", 1)),
                )
                for b in batch
            ]
            for assignment in scheduler.plan(specs):
                jobs.append(self._grant(scheduler, by_name.pop(assignment.task), assignment))
        await self._gather(jobs)
        # New tasks nobody could take yet still show a phase in `kubectl get agenttasks`.
        queued = lifecycle.Transition(
            patch={"phase": "Pending", "attempt": 0, "reclaims": 0}, reason="", message=""
        )
        await self._gather(
            self._commit(body, queued, lease=None)
            for body in self.store.tasks
            if not _status(body).get("phase")
        )

    async def _grant(self, scheduler: Scheduler, task: Body, assignment: Assignment) -> None:
        namespace, name = key_of(task)
        transition = lifecycle.grant(
            _status(task),
            worker=assignment.worker,
            lease_name=protocol.task_lease_name(name),
            now=self.clock.now(),
        )
        try:
            committed = await self._commit(task, transition, lease=None)
        except Exception:
            scheduler.abort(assignment)
            raise
        if not committed:
            scheduler.abort(assignment)
            return
        updated = self.store.tasks.get((namespace, name))
        if updated is not None:
            await self._write_lease(updated)
        metrics.DISPATCHES.labels(namespace).inc()
        since = self._pending_since.pop((namespace, name), None)
        if since is not None:
            metrics.DISPATCH_LATENCY.observe(self.clock.monotonic() - since)

    # -- committing ----------------------------------------------------------------------

    async def _commit(
        self, task: Body, transition: lifecycle.Transition, *, lease: Body | None
    ) -> bool:
        """Write ``transition`` with a CAS on the task; record events; clean up the Lease."""
        namespace, name = key_of(task)
        async with self._writes:
            updated = await self.kube.patch_status(
                TASKS, namespace, name, _rv(task), transition.patch
            )
        if updated is None:
            metrics.COMMIT_CONFLICTS.labels("AgentTask").inc()
            log.info(
                "transition %s of %s/%s lost a race; will re-decide",
                transition.reason,
                namespace,
                name,
            )
            return False
        self.store.tasks.put(updated)
        phase = transition.phase
        for reason, message in transition.extra_events:
            await self.kube.event(updated, reason=reason, message=message, warning=True)
        if transition.reason:
            await self.kube.event(
                updated,
                reason=transition.reason,
                message=transition.message,
                warning=transition.warning,
            )
            log.info("%s/%s %s: %s", namespace, name, transition.reason, transition.message)
        if transition.reason in ("Reclaimed", "DeadLettered"):
            reason = str((transition.patch.get("error") or {}).get("reason") or "Unknown")
            metrics.RECLAIMS.labels(reason).inc()
        if phase == "DeadLettered":
            metrics.DEAD_LETTERS.labels(namespace).inc()
        if phase == "Held":
            metrics.HELD.inc()
        if phase is not None and phase not in lifecycle.ACTIVE_PHASES and lease is not None:
            # The attempt is over: remove its Lease so a zombie's next write finds nothing
            # (a Held task keeps it, for the person who looks at it).
            self._grace.pop((namespace, name), None)
            if phase != "Held":
                async with self._writes:
                    await self.kube.delete_lease(namespace, lease["metadata"]["name"], _rv(lease))
        return True

    async def _gather(self, jobs: Iterable[Awaitable[object]]) -> None:
        results = await asyncio.gather(*jobs, return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                log.error("a write failed: %r", result, exc_info=result)

    # 6 -- publish ----------------------------------------------------------------------

    async def _publish(self) -> None:
        jobs: list[Awaitable[object]] = []
        now = self.clock.monotonic()
        for body in self.store.workers:
            namespace, name = key_of(body)
            scheduler = self.schedulers.get(namespace)
            if scheduler is None or not scheduler.has_worker(name):
                continue
            state = scheduler.worker_state(name)
            ready = self.worker_ready(namespace, name)
            paused = bool(_spec(body).get("paused", False))
            phase = "Draining" if paused else ("Ready" if ready else "NotReady")
            metrics.WORKER_DEFICIT.labels(namespace, name).set(state.deficit)
            metrics.WORKER_IN_FLIGHT.labels(namespace, name).set(state.in_flight)
            metrics.WORKER_READY.labels(namespace, name).set(1 if ready else 0)
            status = {
                "phase": phase,
                "inFlight": state.in_flight,
                "inFlightCost": round(state.in_flight_cost, 6),
                "servedCost": round(state.served_cost, 6),
                "deficit": round(state.deficit, 6),
                "assignedTasks": sorted(state.tasks)[:100],
            }
            fingerprint = repr(sorted(status.items()))
            sent = self._worker_status.get((namespace, name))
            if sent is not None and (
                sent[0] == fingerprint
                or (
                    now - sent[1] < self.config.worker_status_interval
                    and _status(body).get("phase") == phase
                )
            ):
                continue
            old = _status(body)
            if sent is None and all(old.get(k) == v for k, v in status.items()):
                self._worker_status[(namespace, name)] = (fingerprint, now)
                continue
            stamp = rfc3339(self.clock.now())
            previous_ready = next(
                (c for c in old.get("conditions") or [] if c.get("type") == "Ready"), None
            )
            ready_state = "True" if phase == "Ready" else "False"
            if previous_ready is None or previous_ready.get("status") != ready_state:
                status["conditions"] = [
                    {
                        "type": "Ready",
                        "status": ready_state,
                        "reason": phase,
                        "message": {
                            "Ready": "the worker Lease is renewed",
                            "NotReady": "the worker Lease is not renewed",
                            "Draining": "paused: no new tasks",
                        }[phase],
                        "lastTransitionTime": stamp,
                    }
                ]
            self._worker_status[(namespace, name)] = (fingerprint, now)
            jobs.append(self._write_worker_status(body, status))
        await self._gather(jobs)
        phases: dict[str, int] = {}
        pending: dict[str, int] = {}
        for body in self.store.tasks:
            phase = str(_status(body).get("phase") or "Pending")
            phases[phase] = phases.get(phase, 0) + 1
            if phase == "Pending":
                caps = ",".join(sorted(_spec(body).get("requiredCapabilities") or ())) or "-"
                pending[caps] = pending.get(caps, 0) + 1
        metrics.TASKS_BY_PHASE.clear()
        for phase, count in phases.items():
            metrics.TASKS_BY_PHASE.labels(phase).set(count)
        metrics.PENDING.clear()
        for caps, count in pending.items():
            metrics.PENDING.labels(caps).set(count)

    async def _write_worker_status(self, body: Body, status: dict[str, Any]) -> None:
        namespace, name = key_of(body)
        async with self._writes:
            # Worker status is a report, not a decision: no precondition, last write wins.
            updated = await self.kube.patch_status(WORKERS, namespace, name, None, status)
        if updated is not None:
            self.store.workers.put(updated)
