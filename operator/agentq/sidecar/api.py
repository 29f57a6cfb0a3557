"""The agent's HTTP API (aiohttp), served on loopback; described in docs/agent-api.md
and docs/agent-api.openapi.yaml. Every call passes the ``auth.Guard`` first (Host,
the pod's secret, Content-Type). Metrics and health are also served, without the
secret, by a second app on a port of their own (``health_app``), so they can be
scraped and probed without exposing the API.

Handlers never call the API server for a heartbeat: they record it and wake the
renewal loop. Only complete and fail write (the report, on the claim's Lease)
and answer once the API server has accepted it. Every answer is JSON, errors
included (``{"error": CODE, "message": ...}``), and no input can crash the
process: an unexpected exception in a handler is a 500 with a message, logged,
and the server goes on.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import logging
import secrets
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from prometheus_client import generate_latest

from agentq import protocol
from agentq.clock import Clock
from agentq.sidecar import agent_input, metrics
from agentq.sidecar.attempts import AgentError, Attempt, Attempts
from agentq.sidecar.auth import Guard
from agentq.sidecar.changes import Changes
from agentq.sidecar.renewer import Renewer
from agentq.sidecar.watcher import TaskLeaseWatcher
from agentq.sidecar.worker_lease import WorkerLeaseKeeper

log = logging.getLogger("agentq.sidecar.api")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _json(body: dict[str, Any], status: int = 200) -> web.Response:
    return web.json_response(body, status=status)


class AgentApi:
    """The handlers, over the sidecar's state."""

    def __init__(
        self,
        *,
        clock: Clock,
        attempts: Attempts,
        changes: Changes,
        renewer: Renewer,
        keeper: WorkerLeaseKeeper,
        watcher: TaskLeaseWatcher,
        worker: str,
        namespace: str,
        identity: str,
        loops: Callable[[], list[str]],
        guard: Guard,
    ) -> None:
        self.clock = clock
        self.attempts = attempts
        self.changes = changes
        self.renewer = renewer
        self.keeper = keeper
        self.watcher = watcher
        self.worker = worker
        self.namespace = namespace
        self.identity = identity
        self.loops = loops  # names of internal loops that have died (liveness)
        self.stopping = False
        self.guard = guard

    def app(self) -> web.Application:
        app = web.Application(
            client_max_size=agent_input.MAX_BODY_BYTES, middlewares=[self._errors, self._guard]
        )
        app.router.add_get("/v1/assignments", self.list_assignments)
        app.router.add_get("/v1/assignments/{task}", self.get_assignment)
        app.router.add_post("/v1/assignments/{task}/heartbeat", self.heartbeat)
        app.router.add_post("/v1/assignments/{task}/complete", self.complete)
        app.router.add_post("/v1/assignments/{task}/fail", self.fail)
        app.router.add_get("/v1/status", self.status)
        app.router.add_post("/v1/drain", self.drain)
        app.router.add_get("/healthz", self.healthz)
        app.router.add_get("/readyz", self.readyz)
        return app

    def health_app(self) -> web.Application:
        """Metrics and health, for Prometheus and the kubelet's probes: no secret, and
        nothing an agent's task is made of (no payload, token or result)."""
        app = web.Application(middlewares=[self._errors])
        app.router.add_get("/metrics", self.metrics)
        app.router.add_get("/healthz", self.healthz)
        app.router.add_get("/readyz", self.readyz)
        return app

    # -- plumbing ----------------------------------------------------------------------

    @web.middleware
    async def _errors(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except AgentError as err:
            metrics.AGENT_ERRORS.labels(err.code).inc()
            response = _json(err.body(), err.status)
            if err.status == 401:
                response.headers["WWW-Authenticate"] = 'Bearer realm="agentq-sidecar"'
            return response
        except web.HTTPException as err:
            # aiohttp's own refusals (unknown path, wrong method, body too large) as JSON.
            code = {
                404: "NotFound",
                405: "MethodNotAllowed",
                413: "PayloadTooLarge",
            }.get(err.status, "BadRequest")
            metrics.AGENT_ERRORS.labels(code).inc()
            message = err.reason
            if err.status == 413:
                message = f"request body over {agent_input.MAX_BODY_BYTES} bytes"
            elif err.status == 404:
                message = f"no such endpoint: {request.method} {request.path[:200]}"
            response = _json({"error": code, "message": message}, err.status)
            if err.status == 405 and "Allow" in err.headers:
                response.headers["Allow"] = err.headers["Allow"]
            return response
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("unexpected error serving %s %s", request.method, request.path[:200])
            metrics.AGENT_ERRORS.labels("Internal").inc()
            return _json(
                {"error": "Internal", "message": "unexpected error in the sidecar (logged)"}, 500
            )

    @web.middleware
    async def _guard(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        # Before routing's answer: a caller without the secret learns nothing, not even
        # which paths exist.
        self.guard.check_host(request.headers.get("Host"))
        self.guard.check_credential(request.headers.get("Authorization"))
        if request.match_info.http_exception is None:  # else its 404 / 405 is the answer
            self.guard.check_content_type(
                request.method, request.body_exists, request.headers.get("Content-Type", "")
            )
        return await handler(request)

    def _now(self) -> tuple[float, datetime.datetime]:
        return self.clock.monotonic(), self.clock.now()

    def _require_serving(self) -> None:
        if self.stopping:
            raise AgentError(503, "ShuttingDown", "the sidecar is shutting down")
        if not self.keeper.held(self.clock.monotonic()):
            raise AgentError(503, "NotReady", f"the sidecar is {self.keeper.describe()}")

    async def _body(self, request: web.Request) -> dict[str, Any]:
        if request.content_length is not None and (
            request.content_length > agent_input.MAX_BODY_BYTES
        ):
            raise agent_input.too_large(
                f"request body is {request.content_length} bytes; "
                f"the limit is {agent_input.MAX_BODY_BYTES}"
            )
        return agent_input.parse_json(await request.read())

    def _find(self, task: str, token: int) -> Attempt:
        """The attempt the agent names, or the AgentError to answer. "Unknown" (404) is
        said only once this sidecar knows its attempts: until it holds the worker Lease,
        has listed the task Leases and read the task, it may just not know it yet (a
        restarted sidecar), and a 404 would make the agent drop finished work."""
        try:
            return self.attempts.find(task, token)
        except AgentError as err:
            if err.status != 404:
                raise
            pending = self.attempts.current.get(task)
            if not self.keeper.held(self.clock.monotonic()):
                why = self.keeper.describe()
            elif not self.watcher.synced:
                why = "listing the task Leases of this worker"
            elif pending is not None and pending.token == token:
                why = f"reading task {task}"
            else:
                raise
            raise AgentError(
                503, "NotReady", f"the sidecar is {why}; retry shortly", task=task
            ) from None

    def _describe(self, attempt: Attempt) -> dict[str, Any]:
        now, wall = self._now()
        return attempt.describe(now, wall)

    # -- assignments -------------------------------------------------------------------

    async def list_assignments(self, request: web.Request) -> web.Response:
        _only_query(request, {"wait", "after", "until"})
        wait = agent_input.wait_seconds(request.query.get("wait"))
        after = agent_input.after_version(request.query.get("after"))
        until = agent_input.until(request.query.get("until"))
        self._require_serving()
        if wait > 0:
            deadline = self.clock.monotonic() + wait
            ready = self._poll_over(after, until)
            # Checked at each change (``Changes.notify``) and at least once a second:
            # the worker Lease also lapses by the clock alone.
            while not ready():
                left = deadline - self.clock.monotonic()
                if left <= 0:
                    break
                await self.changes.wait_until(ready, min(left, 1.0))
            self._require_serving()
        listing = self.attempts.listing()
        metrics.ASSIGNMENTS.set(len(listing))
        return _json(
            {
                "worker": self.worker,
                "namespace": self.namespace,
                "version": self.attempts.version,
                "assignments": [self._describe(a) for a in listing],
            }
        )

    def _poll_over(self, after: int | None, until: str) -> Callable[[], bool]:
        """When a long poll answers. Without ``after``: once there is an assignment.
        With it: once the listing changed since that version, or (``until=offers``) once
        an assignment was offered or withdrawn since. At once when the sidecar stops
        serving (shutdown, worker Lease lost), and when ``after`` is ahead of this
        sidecar's version (the agent's last answer came from an earlier start)."""
        attempts = self.attempts

        def ready() -> bool:
            if self.stopping or not self.keeper.held(self.clock.monotonic()):
                return True
            if after is None:
                return attempts.any_listed()
            if until == agent_input.UNTIL_OFFERS:
                return attempts.offered > after or attempts.version < after
            return attempts.version != after

        return ready

    async def get_assignment(self, request: web.Request) -> web.Response:
        task = agent_input.task_name(request.match_info["task"])
        _only_query(request, set())
        attempt = self.attempts.current.get(task)
        if attempt is None or attempt.state == "pending":
            raise AgentError(
                404, "UnknownTask", f"task {task} is not assigned to worker {self.worker}"
            )
        return _json(self._describe(attempt))

    async def heartbeat(self, request: web.Request) -> web.Response:
        task = agent_input.task_name(request.match_info["task"])
        _only_query(request, set())
        beat = agent_input.heartbeat(await self._body(request))
        if self.stopping:
            raise AgentError(503, "ShuttingDown", "the sidecar is shutting down")
        found = self._find(task, beat.token)
        # Checked against the attempt before anything is recorded: a refused report
        # changes nothing, and nothing invalid reaches the Lease.
        usage = found.check_usage(beat.usage) if beat.usage is not None else None
        throttle = self._throttle(found, beat.throttled)
        attempt = self.attempts.beat(
            task, beat.token, beat.progress, self.clock.monotonic(), usage=usage, throttle=throttle
        )
        metrics.HEARTBEATS.inc()
        self.changes.notify()
        return _json(self._describe(attempt))

    async def complete(self, request: web.Request) -> web.Response:
        task = agent_input.task_name(request.match_info["task"])
        _only_query(request, set())
        done = agent_input.complete(await self._body(request))
        report = protocol.Report(
            token=done.token,
            worker=self.worker,
            outcome="Succeeded",
            result=done.result,
            result_ref=done.result_ref,
        )
        return await self._report(task, done.token, report, done.usage)

    async def fail(self, request: web.Request) -> web.Response:
        task = agent_input.task_name(request.match_info["task"])
        _only_query(request, set())
        failed = agent_input.fail(await self._body(request))
        report = protocol.Report(
            token=failed.token, worker=self.worker, outcome="Failed", error=failed.error
        )
        return await self._report(task, failed.token, report, failed.usage, failed.throttled)

    def _throttle(
        self, attempt: Attempt, asked: agent_input.ThrottleRequest | None
    ) -> protocol.Throttle | None:
        """The throttle to write (a fresh id: the operator applies each once), or None."""
        if asked is None:
            return None
        ident = f"{attempt.token}-{secrets.token_hex(8)}"
        return attempt.check_throttle(asked.budget, asked.retry_after, ident)

    async def _report(
        self,
        task: str,
        token: int,
        report: protocol.Report,
        usage: dict[str, Any] | None = None,
        throttled: agent_input.ThrottleRequest | None = None,
    ) -> web.Response:
        agent_input.encode_report(report)  # too large already without its usage: 413
        if self.stopping:
            raise AgentError(503, "ShuttingDown", "the sidecar is shutting down")
        try:
            attempt = self._find(task, token)
        except AgentError:
            ended = self.attempts.ended_report(task, token)
            if ended is not None and ended == self._ended_text(task, token, report, usage):
                # The same report again, after the operator already ended the attempt.
                return _json({"task": task, "token": token, "state": "reported"})
            raise
        # The final usage: what the agent reported before, with this report's on top
        # (400 InvalidUsage / InvalidThrottle before anything is written).
        total = attempt.check_usage(usage) if usage is not None else attempt.usage
        throttle = self._throttle(attempt, throttled)
        report = dataclasses.replace(report, usage=dict(total) or None)
        agent_input.encode_report(report)
        await self.renewer.report(attempt, report, throttle)
        return _json(self._describe(attempt))

    def _ended_text(
        self, task: str, token: int, report: protocol.Report, usage: dict[str, Any] | None
    ) -> str | None:
        """The report as it would have been written for an attempt that has ended."""
        before = self.attempts.ended_usage(task, token)
        try:
            total = before
            if usage is not None:
                total = protocol.merge_usage(before, protocol.parse_usage(usage, previous=before))
            return dataclasses.replace(report, usage=dict(total) or None).encode()
        except protocol.ProtocolError:
            return None

    async def drain(self, request: web.Request) -> web.Response:
        """The pod goes away (its agent got SIGTERM): no new task for this worker; its
        claims stay renewed until the agent reports them or the sidecar stops. Idempotent."""
        await self._body(request)  # a JSON object (nothing in it is read yet)
        if self.stopping:
            raise AgentError(503, "ShuttingDown", "the sidecar is shutting down")
        self.keeper.drain()
        return _json(
            {
                "worker": self.worker,
                "draining": True,
                "assignments": len(self.attempts.listing()),
            },
            202,
        )

    # -- health ---------------------------------------------------------------------------

    async def status(self, request: web.Request) -> web.Response:
        now = self.clock.monotonic()
        return _json(
            {
                "worker": self.worker,
                "namespace": self.namespace,
                "identity": self.identity,
                "workerLease": self.keeper.describe(),
                "workerLeaseHeld": self.keeper.held(now),
                "watchSynced": self.watcher.synced,
                "watchListings": self.watcher.relists,
                "stopping": self.stopping,
                "draining": self.keeper.draining,
                "assignments": len(self.attempts.listing()),
                "version": self.attempts.version,
                "renewals": self.renewer.renewals,
                "workerLeaseRenewals": self.keeper.renewals,
                "renewalRequests": self.renewer.renewal_requests,
                "apiRequests": {
                    f"{verb} {resource}": n
                    for (verb, resource), n in self.keeper.api.requests.items()
                },
            }
        )

    async def healthz(self, request: web.Request) -> web.Response:
        dead = self.loops()
        if dead:
            return _json({"status": "failing", "deadLoops": dead}, 503)
        return _json({"status": "ok"})

    async def readyz(self, request: web.Request) -> web.Response:
        now = self.clock.monotonic()
        reasons = []
        if self.stopping:
            reasons.append("shutting down")
        if not self.keeper.held(now):
            reasons.append(self.keeper.describe())
        if not self.watcher.synced:
            reasons.append("the task Lease watch is not connected")
        if reasons:
            return _json({"status": "not ready", "reasons": reasons}, 503)
        return _json({"status": "ready"})

    async def metrics(self, request: web.Request) -> web.Response:
        now = self.clock.monotonic()
        metrics.WORKER_LEASE_HELD.set(1 if self.keeper.held(now) else 0)
        metrics.WATCH_SYNCED.set(1 if self.watcher.synced else 0)
        metrics.ASSIGNMENTS.set(len(self.attempts.listing()))
        return web.Response(
            body=generate_latest(metrics.REGISTRY),
            headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"},
        )


def _only_query(request: web.Request, allowed: set[str]) -> None:
    unknown = sorted(set(request.query) - allowed)
    if unknown:
        raise agent_input.bad(f"unknown query parameter(s): {', '.join(map(repr, unknown[:10]))}")
    repeated = sorted(k for k in set(request.query) if len(request.query.getall(k)) > 1)
    if repeated:
        # ``?wait=1&wait=true`` is not one value: refused, not read as its first.
        raise agent_input.bad(f"query parameter(s) given more than once: {', '.join(repeated)}")
