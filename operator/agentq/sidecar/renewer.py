"""The renewal loop and the writes to task Leases (renewals and reports).

The loop runs apart from the HTTP handlers: a handler only records a heartbeat
and wakes the loop, so a busy or slow agent never delays a renewal, and a slow
API server never delays the agent's heartbeat answer. The loop renews what
``Attempts.due`` says is due, and only while the worker Lease is held.

Every write costs ONE API request: a replace (PUT) of the Lease we last wrote
or saw, carrying its resourceVersion. Only on a 409 is the Lease read again
(once): if its holder and fencing token are still ours the write is made again
on the fresh copy; otherwise the claim is lost. A 404 is lost too. Any other
failure (the API server away, 5xx, 429) is retried soon, while the lease lasts.
"""

from __future__ import annotations

import asyncio
import copy
import logging
from collections.abc import Callable
from typing import Any

from agentq import protocol
from agentq.clock import Clock, micro_rfc3339
from agentq.sidecar import metrics
from agentq.sidecar.attempts import (
    AgentError,
    Attempt,
    Attempts,
    LeaseView,
    lease_lost,
    slim,
)
from agentq.sidecar.changes import Changes
from agentq.sidecar.kubeapi import ApiError, KubeApi, lease_path
from agentq.sidecar.worker_lease import WorkerLeaseKeeper

log = logging.getLogger("agentq.sidecar.renewer")

Body = dict[str, Any]
MAX_CONCURRENT_WRITES = 16


class _Lost(Exception):
    """The Lease is gone or no longer ours; the message says why."""


class Renewer:
    def __init__(
        self,
        api: KubeApi,
        clock: Clock,
        attempts: Attempts,
        changes: Changes,
        keeper: WorkerLeaseKeeper,
        *,
        worker: str,
    ) -> None:
        self.api = api
        self.clock = clock
        self.attempts = attempts
        self.changes = changes
        self.keeper = keeper
        self.worker = worker
        self._locks: dict[tuple[str, int], asyncio.Lock] = {}
        self._writes = asyncio.Semaphore(MAX_CONCURRENT_WRITES)
        self._inflight: set[asyncio.Task[None]] = set()
        self.renewals = 0
        self.renewal_requests = 0

    # -- the loop --------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            now = self.clock.monotonic()
            if not self.keeper.held(now):
                # Nothing is renewed until the worker Lease is confirmed again; the keeper
                # says when (``changes``), a second at most.
                await self.changes.wait(1.0)
                continue
            for attempt in self.attempts.releasable():
                attempt.releasing = True
                task = asyncio.create_task(self._release(attempt))
                self._inflight.add(task)
                task.add_done_callback(self._inflight.discard)
            for attempt in self.attempts.due(now):
                due = attempt.due_at() or now
                attempt.writes += 1  # scheduled: not due again until this write ends
                task = asyncio.create_task(self._renew(attempt, due))
                self._inflight.add(task)
                task.add_done_callback(self._inflight.discard)
            soonest = self.attempts.next_due()
            delay = 1.0 if soonest is None else min(1.0, max(0.005, soonest - now))
            await self.changes.wait(delay)

    async def drain(self, timeout: float) -> None:
        """Wait (bounded) for the writes in flight, e.g. at shutdown."""
        if self._inflight:
            await asyncio.wait(set(self._inflight), timeout=timeout)

    # -- renewals --------------------------------------------------------------------------

    async def _renew(self, attempt: Attempt, due: float) -> None:
        try:
            async with self._lock(attempt), self._writes:
                if self.attempts.current.get(attempt.task) is not attempt:
                    return
                if attempt.state != "active" or not self.keeper.held(self.clock.monotonic()):
                    return
                progress = attempt.progress
                usage = attempt.usage
                throttle = attempt.throttles[0] if attempt.throttles else None
                try:
                    lease, sent, requests = await self._write(
                        attempt,
                        lambda body: self._renewal(body, progress, usage, throttle),
                        counted=True,
                    )
                except _Lost as lost:
                    self._lost(attempt, str(lost))
                    metrics.RENEWALS.labels("lost").inc()
                    return
                except Exception as err:  # any other failure too: this task's end is unobserved
                    retry = min(1.0, attempt.heartbeat_seconds / 4)
                    self.attempts.write_failed(attempt, self.clock.monotonic(), retry_in=retry)
                    metrics.RENEWALS.labels("error").inc()
                    log.warning(
                        "renewing %s failed: %s; retrying in %.1fs",
                        attempt.task,
                        err,
                        retry,
                        exc_info=not isinstance(err, ApiError),
                    )
                    return
                if self.attempts.current.get(attempt.task) is attempt:
                    self.attempts.renewed(attempt, lease, sent)
                    attempt.throttle_written(throttle)
                if throttle is not None:
                    metrics.THROTTLES.inc()
                self.renewals += 1
                metrics.RENEWALS.labels("ok").inc()
                metrics.RENEWAL_REQUESTS.observe(requests)
                metrics.RENEWAL_LATENCY.observe(max(0.0, self.clock.monotonic() - due))
        finally:
            attempt.writes -= 1
            self.changes.notify()

    async def _release(self, attempt: Attempt) -> None:
        """Let a revoked claim's Lease go (its holder cleared): the operator ends the task
        at once instead of waiting for the lease to run out. If the write fails, it runs
        out all the same (nothing renews it)."""
        try:
            async with self._lock(attempt), self._writes:
                if self.attempts.current.get(attempt.task) is not attempt:
                    return
                try:
                    await self._write(attempt, _let_go, counted=False)
                except _Lost:
                    pass  # gone already: over all the same
                except Exception as err:
                    log.warning("letting the revoked Lease of %s go failed: %s", attempt.task, err)
                    await asyncio.sleep(min(1.0, attempt.heartbeat_seconds / 4))
                    attempt.releasing = False  # tried again by the loop
                    return
                log.info(
                    "task %s (token %s): revoked (%s); its Lease let go",
                    attempt.task,
                    attempt.token,
                    attempt.revoked,
                )
                self.attempts.released(attempt)
        finally:
            self.changes.notify()

    def _renewal(
        self,
        body: Body,
        progress: str | None,
        usage: dict[str, protocol.Usage] | None = None,
        throttle: protocol.Throttle | None = None,
    ) -> None:
        """A renewal, with what the agent said since the last write: the progress
        marker, its usage (cumulative) and a throttle. Unchanged ones are rewritten as
        they are: no write is made for them alone (but a throttle: ``due_at``)."""
        body.setdefault("spec", {})["renewTime"] = micro_rfc3339(self.clock.now())
        extra: dict[str, str] = {}
        if progress is not None:
            extra[protocol.ANNOTATION_PROGRESS] = progress
        if usage:
            extra[protocol.ANNOTATION_USAGE] = protocol.encode_usage(usage)
        if throttle is not None:
            extra[protocol.ANNOTATION_THROTTLED] = throttle.encode()
        if extra:
            meta = body.setdefault("metadata", {})
            meta["annotations"] = {**(meta.get("annotations") or {}), **extra}

    # -- reports ---------------------------------------------------------------------------

    async def report(
        self,
        attempt: Attempt,
        report: protocol.Report,
        throttle: protocol.Throttle | None = None,
    ) -> None:
        """Write the attempt's report on its Lease (with its final usage, and
        ``throttle`` or else one still waiting); raises the AgentError to answer."""
        text = report.encode()
        attempt.writes += 1
        try:
            async with self._lock(attempt):
                if attempt.state == "reported":
                    if attempt.report == text:
                        return  # the same report again (a retry): already written
                    raise _already_reported(attempt)
                if self.attempts.current.get(attempt.task) is not attempt:
                    # It ended while we waited for the lock.
                    if self.attempts.ended_report(attempt.task, attempt.token) == text:
                        return
                    raise self.attempts_error(attempt)

                usage = report.usage or attempt.usage
                throttle = throttle or (attempt.throttles[0] if attempt.throttles else None)

                def change(body: Body) -> None:
                    self._renewal(body, attempt.progress, usage, throttle)
                    meta = body.setdefault("metadata", {})
                    meta["annotations"] = {
                        **(meta.get("annotations") or {}),
                        protocol.ANNOTATION_REPORT: text,
                    }

                attempt.sent_report = text
                try:
                    lease, sent, _ = await self._write(attempt, change, counted=False)
                except _Lost as lost:
                    self._lost(attempt, str(lost))
                    raise lease_lost(attempt.task, attempt.token, str(lost)) from None
                except ApiError as err:
                    raise AgentError(
                        503,
                        "ApiUnavailable",
                        f"could not write the report on the Lease ({err}); retry the same "
                        "request (it is idempotent)",
                    ) from err
                self.attempts.reported(attempt, lease, text, sent, usage)
                metrics.REPORTS.labels(report.outcome).inc()
                if throttle is not None:
                    metrics.THROTTLES.inc()
                log.info(
                    "task %s: reported %s (token %s)", attempt.task, report.outcome, attempt.token
                )
        finally:
            attempt.writes -= 1
            self.changes.notify()

    def attempts_error(self, attempt: Attempt) -> AgentError:
        try:
            self.attempts.find(attempt.task, attempt.token)
        except AgentError as err:
            return err
        return lease_lost(attempt.task, attempt.token, "the attempt ended")

    # -- the one-request write ------------------------------------------------------------

    async def _write(
        self, attempt: Attempt, change: Callable[[Body], None], *, counted: bool
    ) -> tuple[Body, float, int]:
        """Replace the attempt's Lease with ``change`` applied: one request, a re-read
        only on 409. Returns the written Lease, when the write was sent, and how many
        requests it took."""
        path = lease_path(attempt.namespace, attempt.lease_name)
        body = copy.deepcopy(attempt.lease)
        change(body)
        sent = self.clock.monotonic()
        try:
            written = await self._request("PUT", path, body, counted)
            return written, sent, 1
        except ApiError as err:
            if err.status == 404:
                raise _Lost("its Lease no longer exists (the attempt ended)") from None
            if err.status != 409:
                raise
        try:
            fresh = await self._request("GET", path, None, counted)
        except ApiError as err:
            if err.status == 404:
                raise _Lost("its Lease no longer exists (the attempt ended)") from None
            raise
        view = LeaseView.of(fresh)
        if view is None or view.holder != self.worker or view.token != attempt.token:
            holder = view.holder if view else None
            token = view.token if view else None
            raise _Lost(f"its Lease is now held by {holder or 'nobody'} with token {token}")
        attempt.lease = slim(fresh)
        body = copy.deepcopy(attempt.lease)
        change(body)
        sent = self.clock.monotonic()
        try:
            written = await self._request("PUT", path, body, counted)
        except ApiError as err:
            if err.status == 404:
                raise _Lost("its Lease no longer exists (the attempt ended)") from None
            raise
        return written, sent, 3

    async def _request(self, method: str, path: str, body: Body | None, counted: bool) -> Body:
        if counted:
            self.renewal_requests += 1
        return await self.api.request(method, path, body=body, resource="leases")

    def _lost(self, attempt: Attempt, reason: str) -> None:
        if self.attempts.current.get(attempt.task) is attempt:
            log.warning("task %s (token %s): lease lost: %s", attempt.task, attempt.token, reason)
            self.attempts.lost(attempt, reason)
        self.changes.notify()

    def _lock(self, attempt: Attempt) -> asyncio.Lock:
        key = (attempt.task, attempt.token)
        lock = self._locks.get(key)
        if lock is None:
            if len(self._locks) > 4 * (len(self.attempts.current) + 16):
                live = {(a.task, a.token) for a in self.attempts.current.values()}
                self._locks = {k: v for k, v in self._locks.items() if k in live or v.locked()}
            lock = self._locks[key] = asyncio.Lock()
        return lock


def _let_go(body: Body) -> None:
    body.setdefault("spec", {})["holderIdentity"] = None


def _already_reported(attempt: Attempt) -> AgentError:
    return AgentError(
        409,
        "AlreadyReported",
        f"attempt {attempt.attempt} of task {attempt.task} (token {attempt.token}) has already "
        "reported a different outcome; a report is final",
        task=attempt.task,
        token=attempt.token,
    )
