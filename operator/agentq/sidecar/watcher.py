"""One watch of the task Leases granted to this worker, and the read of each task.

The watch is a list-then-watch on ``leases`` in the sidecar's namespace with a
server-side label selector (``agentq.dev/lease=task,agentq.dev/worker=<worker>``),
so the API server sends only this worker's Leases. It resumes from the last
resourceVersion it saw; a 410 Gone (the version is too old) or a broken
connection lists again, after a jittered backoff when the API server is away,
so an API server restart is ridden out without exiting. A listing replaces what
we knew: a Lease that is no longer there ended its attempt.

A new attempt is offered to the agent once its AgentTask has been read (one
GET): the payload, the task's lease duration and heartbeat interval (the task's
spec is what the operator judges by), and its UID, which must match the UID the
Lease names. A cross-namespace claim (an ``agentq-xtask-`` Lease) is not read from
the API server, where the sidecar may not read the team's AgentTasks, but from the
operator (``operator_claims``): a 403 or 404 is tried again with backoff while the
attempt is current (the operator may not have seen the Lease yet), a 410 (the claim
ended) drops it, and without an operator URL it is dropped at once, said in the log.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

from pydantic import ValidationError

from agentq import GROUP, VERSION, protocol
from agentq.clock import Clock
from agentq.kube import Backoff
from agentq.models import AgentTaskSpec
from agentq.sidecar import metrics
from agentq.sidecar.attempts import Attempt, Attempts
from agentq.sidecar.changes import Changes
from agentq.sidecar.kubeapi import ApiError, KubeApi, custom_path, lease_path
from agentq.sidecar.operator_claims import ClaimError, OperatorClaims

log = logging.getLogger("agentq.sidecar.watcher")

Body = dict[str, Any]
WATCH_SECONDS = 240


def selector(worker: str) -> str:
    return (
        f"{protocol.LABEL_LEASE_KIND}=task,{protocol.LABEL_WORKER}={protocol.label_value(worker)}"
    )


class TaskLeaseWatcher:
    def __init__(
        self,
        api: KubeApi,
        clock: Clock,
        attempts: Attempts,
        changes: Changes,
        *,
        namespace: str,
        worker: str,
        serve_from_rv: Callable[[], int],
        claims: OperatorClaims | None = None,
    ) -> None:
        self.api = api
        self.claims = claims  # where cross-namespace claims' tasks are read (None: nowhere)
        self.clock = clock
        self.attempts = attempts
        self.changes = changes
        self.namespace = namespace
        self.worker = worker
        self.serve_from_rv = serve_from_rv
        self.synced = False  # listed, and the watch since then is connected
        self.relists = 0
        self._fetches: set[asyncio.Task[None]] = set()
        self._resync = asyncio.Event()  # end the current watch and list again
        self._may_watch = asyncio.Event()  # set while we hold the worker Lease

    def resume(self) -> None:
        """The worker Lease was acquired: list (again), since which Leases are ours changed."""
        self._may_watch.set()
        self._resync.set()

    def pause(self) -> None:
        """The worker Lease was lost: watch nothing until it is acquired again."""
        self._may_watch.clear()
        self._resync.set()
        self.synced = False

    async def run(self, stop: asyncio.Event) -> None:
        backoff = Backoff(initial=0.2, maximum=5.0)
        while not stop.is_set():
            if not self._may_watch.is_set():
                waiter = asyncio.ensure_future(self._may_watch.wait())
                stopper = asyncio.ensure_future(stop.wait())
                await asyncio.wait({waiter, stopper}, return_when=asyncio.FIRST_COMPLETED)
                waiter.cancel()
                stopper.cancel()
                continue
            try:
                await self._list_and_watch(stop)
                backoff.reset()
            except ApiError as err:
                self.synced = False
                if err.status == 410:
                    log.info("task Lease watch expired (410 Gone); listing again")
                    continue
                log.warning("task Lease watch: %s; retrying", err)
                await backoff.sleep(stop)
            except Exception:  # never let the watch die: the agent would wait forever
                self.synced = False
                log.exception("task Lease watch failed; retrying")
                await backoff.sleep(stop)

    async def _list_and_watch(self, stop: asyncio.Event) -> None:
        self._resync.clear()
        params = {"labelSelector": selector(self.worker)}
        listing = await self.api.request(
            "GET", lease_path(self.namespace), params=params, resource="leases"
        )
        self.relists += 1
        if self._resync.is_set():
            # The worker Lease was lost (or taken again) while the listing was on its way:
            # applied now, it would set up attempts that lose_all has just ended.
            return
        rv = str((listing.get("metadata") or {}).get("resourceVersion") or "")
        items = [item for item in listing.get("items") or [] if isinstance(item, dict)]
        new = self.attempts.resync(
            items, self.clock.monotonic(), serve_from_rv=self.serve_from_rv()
        )
        for attempt in new:
            self._fetch(attempt)
        self.synced = True
        self.changes.notify()
        while not stop.is_set() and not self._resync.is_set():
            events = self.api.watch(
                lease_path(self.namespace),
                resource="leases",
                params={**params, "resourceVersion": rv},
                timeout_seconds=WATCH_SECONDS,
            )
            resync = asyncio.ensure_future(self._resync.wait())
            try:
                async with contextlib.aclosing(_until(events, resync)) as stream:
                    async for event in stream:
                        if self._resync.is_set():
                            return  # ready together with the event: a relist follows
                        obj = event.get("object") or {}
                        rv = str((obj.get("metadata") or {}).get("resourceVersion") or rv)
                        kind = event.get("type")
                        if kind == "BOOKMARK":
                            continue
                        if kind == "DELETED":
                            self.attempts.deleted(obj)
                        elif kind in ("ADDED", "MODIFIED"):
                            created = self.attempts.observe(
                                obj, self.clock.monotonic(), serve_from_rv=self.serve_from_rv()
                            )
                            if created is not None:
                                self._fetch(created)
                        self.changes.notify()
            finally:
                resync.cancel()

    # -- reading the task -------------------------------------------------------------

    def _fetch(self, attempt: Attempt) -> None:
        task = asyncio.create_task(self._read_task(attempt))
        self._fetches.add(task)
        task.add_done_callback(self._fetches.discard)

    async def _read_task(self, attempt: Attempt) -> None:
        if attempt.cross:
            await self._read_claim(attempt)
            return
        backoff = Backoff(initial=0.2, maximum=2.0)
        path = custom_path(GROUP, VERSION, self.namespace, "agenttasks", attempt.task)
        while self.attempts.current.get(attempt.task) is attempt:
            try:
                task = await self.api.request("GET", path, resource="agenttasks")
                self._activate(attempt, task)
                return
            except ApiError as err:
                if err.status == 404:
                    self.attempts.drop(attempt, f"task {attempt.task} does not exist")
                    self.changes.notify()
                    return
                log.warning("reading task %s: %s; retrying", attempt.task, err)
            except Exception:  # this task's end is unobserved: never leave the attempt pending
                log.exception("reading task %s failed; retrying", attempt.task)
            await asyncio.sleep(backoff.next())

    async def _read_claim(self, attempt: Attempt) -> None:
        """A cross-namespace claim's task, from the operator (see the module docstring)."""
        if self.claims is None:
            log.error(
                "task %s is a claim of another namespace's task (Lease %s), whose payload "
                "only the operator hands out, and no --operator-url is set; not serving it",
                attempt.task,
                attempt.lease_name,
            )
            self.attempts.drop(attempt, "no --operator-url to read a cross-namespace task from")
            self.changes.notify()
            return
        backoff = Backoff(initial=0.2, maximum=5.0)
        while self.attempts.current.get(attempt.task) is attempt:
            try:
                task = await self.claims.read(self.namespace, attempt.lease_name)
                metrics.CLAIM_READS.labels(code="200").inc()
                self._activate(attempt, task)
                return
            except ClaimError as err:
                metrics.CLAIM_READS.labels(code=err.code).inc()
                if err.status == 410:
                    self.attempts.drop(attempt, f"the operator says the claim ended: {err.message}")
                    self.changes.notify()
                    return
                if err.status == 404:
                    log.info(
                        "the operator does not know claim %s yet; retrying", attempt.lease_name
                    )
                elif err.status in (401, 403):
                    log.warning(
                        "the operator refused to hand over claim %s (HTTP %s: %s); retrying",
                        attempt.lease_name,
                        err.status,
                        err.message,
                    )
                elif err.tls:
                    log.error(
                        "reading claim %s from the operator: %s; retrying",
                        attempt.lease_name,
                        err.message,
                    )
                else:
                    log.warning(
                        "reading claim %s from the operator: %s; retrying", attempt.lease_name, err
                    )
            except Exception:  # never leave the attempt pending for good
                metrics.CLAIM_READS.labels(code="error").inc()
                log.exception("reading claim %s from the operator failed; retrying", attempt.task)
            await asyncio.sleep(backoff.next())

    def _activate(self, attempt: Attempt, task: Body) -> None:
        spec = task.get("spec") or {}
        lease_seconds = attempt.lease_seconds
        heartbeat = attempt.heartbeat_seconds
        budgets: dict[str, tuple[int, int]] = {}
        try:
            parsed = AgentTaskSpec.model_validate(spec)
            lease_seconds = float(parsed.lease_duration_seconds)
            heartbeat = parsed.effective_heartbeat_interval_seconds
            budgets = {b.name: (b.requests, b.tokens) for b in parsed.budgets or ()}
        except ValidationError as err:
            # The API server validated it; a spec we cannot read keeps the Lease's timing.
            log.warning("task %s: unreadable spec (%s); using the Lease's duration", task, err)
        uid = (task.get("metadata") or {}).get("uid")
        if attempt.attempt <= 0:
            with contextlib.suppress(TypeError, ValueError):
                attempt.attempt = int((task.get("status") or {}).get("attempt") or 0)
        if self.attempts.activate(
            attempt,
            uid=str(uid) if uid else None,
            payload=spec.get("payload"),
            lease_seconds=lease_seconds,
            heartbeat_seconds=heartbeat,
            budgets=budgets,
        ):
            log.info(
                "task %s assigned (attempt %s, token %s)",
                attempt.task,
                attempt.attempt,
                attempt.token,
            )
        self.changes.notify()

    async def close(self) -> None:
        for task in list(self._fetches):
            task.cancel()
        await asyncio.gather(*self._fetches, return_exceptions=True)


async def _until(events: Any, stop: asyncio.Future[Any]) -> Any:
    """The events of an async iterator until ``stop`` completes (then the stream is closed)."""
    iterator = events.__aiter__()
    try:
        while True:
            step = asyncio.ensure_future(iterator.__anext__())
            done, _ = await asyncio.wait({step, stop}, return_when=asyncio.FIRST_COMPLETED)
            if step not in done:
                step.cancel()
                with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration, ApiError):
                    await step
                return
            try:
                yield step.result()
            except StopAsyncIteration:
                return
    finally:
        with contextlib.suppress(Exception):
            await iterator.aclose()
