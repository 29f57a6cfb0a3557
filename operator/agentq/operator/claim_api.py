"""The operator's claim API: a cross-namespace claim's task, for its holder only.

A claim of a task of a team's namespace by a worker of a pool namespace has its
Lease in the pool (docs/tenancy.md, "Cross-namespace claims"); the worker's
sidecar may not read the team's AgentTasks, so the operator hands the task over:

``GET /v1/claims/{lease namespace}/{lease name}`` with
``Authorization: Bearer <projected ServiceAccount token, audience agentq.dev/operator>``

1. no bearer token: 401;
2. a TokenReview for that audience (through the operator's own client, answers
   cached for ``REVIEW_SECONDS`` by the token's SHA-256, at most
   ``REVIEW_CACHE_SIZE`` of them; concurrent requests with one token share one
   review): the user must be ``system:serviceaccount:<lease namespace>:agentq-agent-<worker>``,
   or ``system:serviceaccount:<lease namespace>:agentq-pool-<pool>`` with a token
   bound to a pod (an autoscaled pool, docs/autoscaling.md): the worker is then the
   pod's name, as the admission policy ``agentq-agent-writes`` has it; else 403 (a
   token of another audience, another namespace's account, not an agent's account,
   a pool token bound to no pod);
3. the claim, from the injected lookup (the controller's store): none, 404 (this
   replica has not seen the Lease yet, or the claim is over: the sidecar tries
   again while its attempt is current); another worker's, 403; for a pool pod, a
   worker not owned by that very pod (the token's pod UID against the AgentWorker's
   owner reference), 403;
4. the AgentTask, read now (a quorum read): gone, or another object of that name
   (its UID), or already granted again (a higher ``status.fencingToken``): 410.

The answer is what a sidecar reads from an AgentTask of its own namespace:
``{"metadata": {name, namespace, uid}, "spec", "status": {"attempt"}}``. Every
answer is counted in ``agentq_claim_api_requests_total{code}`` (429: a new TokenReview
beyond the budget, REVIEW_RATE; ``refused``: a connection beyond MAX_CONNECTIONS,
closed unanswered). A TokenReview or
task read without an answer (or refused for the operator's own rights) is a 503:
the sidecar tries again.

Over TLS when the server is given a certificate and key (``claim_tls.py``: re-read
when they change; none loadable is a visible state, never a failed start); plain
HTTP otherwise, with a warning (docs/security.md, "The claim port").
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import re
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from aiohttp import web

from agentq import GROUP, VERSION, kube, protocol, views
from agentq.clock import Clock, SystemClock
from agentq.models import TASK_PLURAL
from agentq.operator import metrics
from agentq.operator.claim_tls import RELOAD_SECONDS, ServingCert

log = logging.getLogger("agentq.operator.claims")

AUDIENCE = "agentq.dev/operator"
AGENT_ACCOUNT_PREFIX = "agentq-agent-"
POOL_ACCOUNT_PREFIX = "agentq-pool-"
# What the API server says of a token bound to a pod (TokenReview status.user.extra).
EXTRA_POD_NAME = "authentication.kubernetes.io/pod-name"
EXTRA_POD_UID = "authentication.kubernetes.io/pod-uid"
REVIEW_SECONDS = 60.0
REVIEW_CACHE_SIZE = 4096
# A flood of unknown tokens (each would cost the API server a TokenReview) is refused
# before it reaches the API server: new reviews start at most REVIEW_RATE a second
# (REVIEW_BURST at once), REVIEW_CONCURRENCY of them in flight; beyond, 429 with
# Retry-After (the sidecar backs off and tries again). A refusal (a token not valid,
# not an agent's) is cached apart, in at most REFUSAL_CACHE_SIZE entries: a flood of
# bogus tokens never evicts an agent's good review.
REVIEW_RATE = 20.0
REVIEW_BURST = 40
REVIEW_CONCURRENCY = 8
REFUSAL_CACHE_SIZE = 256
RETRY_AFTER_SECONDS = 1
# The claim server's own limits (one GET with one bearer token is all it serves).
MAX_CONNECTIONS = 256
HANDSHAKE_SECONDS = 10.0
KEEPALIVE_SECONDS = 15.0
MAX_HEADERS = 32
MAX_LINE_CHARS = 4096
MAX_BODY_BYTES = 4096
TOKEN_REVIEW_PATH = "/apis/authentication.k8s.io/v1/tokenreviews"
MAX_TOKEN_CHARS = 16 * 1024
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?")

Body = dict[str, Any]


@dataclass(frozen=True)
class ClaimRef:
    """A current claim as the operator's store knows it."""

    task_namespace: str
    task_name: str
    task_uid: str
    worker: str
    token: int
    # The UID of the Pod owning the worker's AgentWorker (a pool's per-pod worker),
    # None when no pod owns it.
    worker_pod_uid: str | None = None


class ClaimLookup(Protocol):
    """The current claim whose Lease is ``lease_namespace``/``lease_name``, or None."""

    def __call__(self, lease_namespace: str, lease_name: str) -> ClaimRef | None: ...


def no_claims(lease_namespace: str, lease_name: str) -> ClaimRef | None:
    """A lookup that knows no claim (an operator built without cross-namespace claims)."""
    return None


@dataclass(frozen=True)
class Review:
    """What a TokenReview said: the account's namespace and worker, or why not.
    ``pod_uid``: a pool account's, the pod its token is bound to (the worker is that
    pod's name and must be owned by it); None for an ``agentq-agent-`` account."""

    namespace: str | None = None
    worker: str | None = None
    refusal: str = ""
    pod_uid: str | None = None


class Unavailable(Exception):
    """No answer to rely on from the API server (a TokenReview, a task read): 503."""


class Busy(Exception):
    """Too many TokenReviews asked for now (REVIEW_RATE, REVIEW_CONCURRENCY): 429."""


class ReviewBudget:
    """A token bucket of new TokenReviews (``rate`` a second, ``burst`` at once), and at
    most ``concurrency`` in flight."""

    def __init__(self, clock: Clock, rate: float, burst: int, concurrency: int) -> None:
        self.clock = clock
        self.rate = rate
        self.burst = float(burst)
        self.concurrency = concurrency
        self.tokens = float(burst)
        self.stamp = clock.monotonic()
        self.in_flight = 0

    def take(self) -> bool:
        """One more review may start now (the caller ends it with ``done``)."""
        now = self.clock.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        if self.in_flight >= self.concurrency or self.tokens < 1.0:
            return False
        self.tokens -= 1.0
        self.in_flight += 1
        return True

    def done(self) -> None:
        self.in_flight -= 1


def service_account(username: str) -> tuple[str, str] | None:
    """``(namespace, account)`` of ``system:serviceaccount:<namespace>:<account>``."""
    parts = username.split(":")
    if len(parts) != 4 or parts[:2] != ["system", "serviceaccount"]:
        return None
    return parts[2], parts[3]


def pool_account(username: str) -> bool:
    """Whether ``username`` is an autoscaled pool's account (``agentq-pool-<pool>``)."""
    account = service_account(username)
    return account is not None and account[1].startswith(POOL_ACCOUNT_PREFIX)


def agent_of(username: str) -> tuple[str, str] | None:
    """``(namespace, worker)`` of ``system:serviceaccount:<namespace>:agentq-agent-<worker>``."""
    parsed = service_account(username)
    if parsed is None:
        return None
    namespace, account = parsed
    worker = account.removeprefix(AGENT_ACCOUNT_PREFIX)
    if not namespace or worker == account or not worker:
        return None
    return namespace, worker


def pool_pod_of(username: str, extra: Any) -> tuple[str, str, str] | None:
    """``(namespace, pod name, pod UID)`` of
    ``system:serviceaccount:<namespace>:agentq-pool-<pool>`` whose token is bound to a
    pod (``extra``: the TokenReview's ``user.extra``)."""
    parsed = service_account(username)
    if parsed is None:
        return None
    namespace, account = parsed
    if not namespace or not account.startswith(POOL_ACCOUNT_PREFIX):
        return None
    if account == POOL_ACCOUNT_PREFIX or not isinstance(extra, dict):
        return None

    def one(key: str) -> str:
        values = extra.get(key)
        if not isinstance(values, list) or len(values) != 1 or not isinstance(values[0], str):
            return ""
        return values[0]

    name, uid = one(EXTRA_POD_NAME), one(EXTRA_POD_UID)
    if not name or not uid:
        return None
    return namespace, name, uid


def _error(code: int, error: str, message: str) -> web.Response:
    response = web.json_response({"error": error, "message": message}, status=code)
    if code == 401:
        response.headers["WWW-Authenticate"] = "Bearer"
    if code in (429, 503):
        response.headers["Retry-After"] = str(RETRY_AFTER_SECONDS)
    return response


class ClaimApi:
    """The claim API's handler and its TokenReview cache (see the module docstring)."""

    def __init__(
        self,
        client: kube.Client,
        lookup: ClaimLookup,
        *,
        clock: Clock | None = None,
        review_seconds: float = REVIEW_SECONDS,
        cache_size: int = REVIEW_CACHE_SIZE,
        refusal_cache_size: int = REFUSAL_CACHE_SIZE,
        review_rate: float = REVIEW_RATE,
        review_burst: int = REVIEW_BURST,
        review_concurrency: int = REVIEW_CONCURRENCY,
    ) -> None:
        self.client = client
        self.lookup = lookup
        self.clock = clock or SystemClock()
        self.review_seconds = review_seconds
        self.cache_size = cache_size
        self.refusal_cache_size = refusal_cache_size
        self.budget = ReviewBudget(self.clock, review_rate, review_burst, review_concurrency)
        # An agent's reviews, and apart the refusals (never evicting an agent's).
        self.reviews: OrderedDict[str, tuple[float, Review]] = OrderedDict()
        self.refusals: OrderedDict[str, tuple[float, Review]] = OrderedDict()
        self.token_reviews = 0  # TokenReviews sent
        self._reviewing: dict[str, asyncio.Future[Review]] = {}

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._counted], client_max_size=MAX_BODY_BYTES)
        app.router.add_get("/v1/claims/{namespace}/{name}", self.claim)
        return app

    @web.middleware
    async def _counted(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        try:
            response = await handler(request)
        except web.HTTPException as err:  # an unknown path or method
            response = _error(err.status, err.reason, err.text or err.reason)
        except Exception:
            log.exception("claim API: %s %s failed", request.method, request.path)
            response = _error(500, "InternalError", "the operator failed to answer")
        metrics.CLAIM_API_REQUESTS.labels(code=str(response.status)).inc()
        return response

    async def claim(self, request: web.Request) -> web.StreamResponse:
        namespace = request.match_info["namespace"]
        name = request.match_info["name"]
        token = _bearer(request.headers.get("Authorization", ""))
        if token is None:
            return _error(
                401,
                "Unauthorized",
                f"send a ServiceAccount token of audience {AUDIENCE} as 'Authorization: Bearer'",
            )
        try:
            review = await self.review(token)
        except Busy as err:
            return _error(429, "TooManyRequests", str(err))
        except Unavailable as err:
            return _error(503, "Unavailable", f"the token could not be reviewed: {err}")
        if review.namespace is None or review.worker is None:
            log.warning("claim %s/%s refused: %s", namespace, name, review.refusal)
            return _error(403, "Forbidden", review.refusal)
        if review.namespace != namespace:
            log.warning(
                "claim %s/%s refused: asked by worker %s of namespace %s",
                namespace,
                name,
                review.worker,
                review.namespace,
            )
            return _error(
                403, "Forbidden", f"an agent of namespace {review.namespace} asks for {namespace}'s"
            )
        if not _DNS_LABEL.fullmatch(namespace) or len(namespace) > 63:
            return _error(400, "BadRequest", f"{namespace[:100]!r} is not a namespace")
        if not _DNS_SUBDOMAIN.fullmatch(name) or len(name) > 253:
            return _error(400, "BadRequest", f"{name[:100]!r} is not a Lease name")
        ref = self.lookup(namespace, name)
        if ref is None:
            return _error(404, "NotFound", f"no current claim has the Lease {namespace}/{name}")
        if ref.worker != review.worker:
            log.warning(
                "claim %s/%s refused: held by worker %s, asked by worker %s",
                namespace,
                name,
                ref.worker,
                review.worker,
            )
            return _error(403, "Forbidden", f"the claim of {namespace}/{name} is not yours")
        if review.pod_uid is not None and ref.worker_pod_uid != review.pod_uid:
            log.warning(
                "claim %s/%s refused: AgentWorker %s is not owned by the asking pod (UID %s)",
                namespace,
                name,
                ref.worker,
                review.pod_uid,
            )
            return _error(
                403,
                "Forbidden",
                f"the claim of {namespace}/{name} is not yours: AgentWorker {ref.worker} "
                "is not owned by your pod",
            )
        try:
            task = await self._task(ref)
        except Unavailable as err:
            return _error(503, "Unavailable", f"the task could not be read: {err}")
        if isinstance(task, web.Response):
            return task
        meta = task.get("metadata") or {}
        status = task.get("status") or {}
        return web.json_response(
            {
                "metadata": {
                    "name": meta.get("name"),
                    "namespace": meta.get("namespace"),
                    "uid": meta.get("uid"),
                },
                "spec": task.get("spec") or {},
                "status": {"attempt": status.get("attempt")},
            }
        )

    async def _task(self, ref: ClaimRef) -> Body | web.Response:
        """The claim's AgentTask, or the 404/410 to answer."""
        path = kube.object_path(GROUP, VERSION, ref.task_namespace, TASK_PLURAL, ref.task_name)
        try:
            rsp = await self.client.request("GET", path)
        except (kube.TransportError, kube.CredentialError) as err:
            raise Unavailable(str(err)) from err
        where = f"{ref.task_namespace}/{ref.task_name}"
        if rsp.status == 404:
            return _error(410, "Gone", f"task {where} does not exist any more")
        if rsp.status != 200:
            log.error("claim API: reading task %s: HTTP %s", where, rsp.status)
            raise Unavailable(f"HTTP {rsp.status}")
        try:
            task = views.decode(rsp.raw)
        except ValueError as err:
            raise Unavailable(f"task {where} is not JSON: {err}") from err
        if not isinstance(task, dict):
            raise Unavailable(f"task {where} is not an object")
        if (task.get("metadata") or {}).get("uid") != ref.task_uid:
            return _error(410, "Gone", f"task {where} was deleted and made again")
        token = (task.get("status") or {}).get("fencingToken")
        if protocol.is_json_int(token) and token > ref.token:
            return _error(410, "Gone", f"task {where} was granted again (token {token})")
        if not protocol.is_json_int(token) or token < ref.token:
            return _error(404, "NotFound", f"task {where} does not show this claim yet")
        return task

    # -- TokenReviews ---------------------------------------------------------------

    async def review(self, token: str) -> Review:
        """The TokenReview of ``token``, from the cache while it is fresh; ``Busy`` when
        a new one would exceed the review budget."""
        key = hashlib.sha256(token.encode()).hexdigest()
        now = self.clock.monotonic()
        for cache in (self.reviews, self.refusals):
            cached = cache.get(key)
            if cached is not None:
                if cached[0] > now:
                    cache.move_to_end(key)
                    return cached[1]
                del cache[key]
        pending = self._reviewing.get(key)
        if pending is None:
            if not self.budget.take():
                raise Busy(
                    f"too many tokens to review now (at most {self.budget.rate:g} a second, "
                    f"{self.budget.concurrency} at once); try again"
                )
            pending = asyncio.ensure_future(self._review(token))
            self._reviewing[key] = pending

            def reviewed(_: object) -> None:
                self._reviewing.pop(key, None)
                self.budget.done()

            pending.add_done_callback(reviewed)
        review = await asyncio.shield(pending)
        cache, size = (
            (self.reviews, self.cache_size)
            if review.namespace is not None
            else (self.refusals, self.refusal_cache_size)
        )
        cache[key] = (self.clock.monotonic() + self.review_seconds, review)
        cache.move_to_end(key)
        while len(cache) > size:
            cache.popitem(last=False)
        return review

    async def _review(self, token: str) -> Review:
        self.token_reviews += 1
        body = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenReview",
            "spec": {"token": token, "audiences": [AUDIENCE]},
        }
        try:
            rsp = await self.client.request("POST", TOKEN_REVIEW_PATH, body=body)
        except (kube.TransportError, kube.CredentialError) as err:
            raise Unavailable(f"TokenReview: {err}") from err
        if rsp.status not in (200, 201):
            log.error(
                "claim API: TokenReview answered HTTP %s (the operator needs 'create "
                "tokenreviews'): %s",
                rsp.status,
                rsp.raw[:300].decode(errors="replace"),
            )
            raise Unavailable(f"TokenReview: HTTP {rsp.status}")
        try:
            status = (rsp.json() or {}).get("status") or {}
        except ValueError as err:
            raise Unavailable(f"TokenReview: {err}") from err
        if not status.get("authenticated"):
            why = status.get("error") or "not authenticated"
            return Review(refusal=f"the token is not valid for audience {AUDIENCE}: {why}")
        if AUDIENCE not in (status.get("audiences") or []):
            return Review(refusal=f"the token is not for audience {AUDIENCE}")
        user = status.get("user") or {}
        username = str(user.get("username") or "")
        if pool_account(username):
            pod = pool_pod_of(username, user.get("extra"))
            if pod is None:
                return Review(
                    refusal=f"{username}: a pool account's token bound to no pod is no worker"
                )
            return Review(namespace=pod[0], worker=pod[1], pod_uid=pod[2])
        agent = agent_of(username)
        if agent is None:
            return Review(
                refusal=f"{username or 'the caller'} is not an agent's ServiceAccount "
                f"({AGENT_ACCOUNT_PREFIX}<worker>, or {POOL_ACCOUNT_PREFIX}<pool> bound "
                "to a pod)"
            )
        return Review(namespace=agent[0], worker=agent[1])


class _Refused(asyncio.Protocol):
    """A connection beyond the server's limit: closed at once, unanswered."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.close()


def _bearer(header: str) -> str | None:
    scheme, _, token = header.partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token or len(token) > MAX_TOKEN_CHARS:
        return None
    return token


class ClaimServer:
    """The claim API served on a port of its own, with a client of its own (its
    TokenReviews and task reads never wait behind the controller's writes)."""

    def __init__(
        self,
        api: ClaimApi,
        runner: web.AppRunner,
        tls: ServingCert | None = None,
        listening: asyncio.Server | None = None,
    ) -> None:
        self.api = api
        self.runner = runner
        self.tls = tls
        self.listening = listening
        self.watching: asyncio.Task[None] | None = None

    @classmethod
    async def start(
        cls,
        kubeconfig: kube.KubeConfig,
        lookup: ClaimLookup | None,
        *,
        port: int,
        host: str = "0.0.0.0",
        timeout: float = 10.0,
        cert_file: str | None = None,
        key_file: str | None = None,
        reload_seconds: float = RELOAD_SECONDS,
        max_connections: int = MAX_CONNECTIONS,
    ) -> ClaimServer:
        """Serve on ``host:port``: over TLS with ``cert_file``/``key_file`` (claim_tls.py:
        re-read when they change; none loadable yet is no error here), else plain HTTP."""
        tls = ServingCert(cert_file or "", key_file or "") if cert_file or key_file else None
        if tls is not None:
            tls.reload()
        client = kube.Client(kubeconfig, pool=8, timeout=timeout)
        api = ClaimApi(client, lookup or no_claims)
        runner = web.AppRunner(
            api.app(),
            access_log=None,
            handle_signals=False,
            keepalive_timeout=KEEPALIVE_SECONDS,
            max_headers=MAX_HEADERS,
            max_line_size=MAX_LINE_CHARS,
            max_field_size=MAX_TOKEN_CHARS + 64,
        )
        await runner.setup()
        handlers = runner.server
        assert handlers is not None

        def connection() -> asyncio.BaseProtocol:
            # At most MAX_CONNECTIONS served at once; one more is closed unanswered.
            if len(handlers.connections) >= max_connections:
                metrics.CLAIM_API_REQUESTS.labels(code="refused").inc()
                return _Refused()
            return handlers()

        try:
            listening = await asyncio.get_running_loop().create_server(
                connection,
                host,
                port,
                reuse_address=True,
                ssl=tls.context if tls is not None else None,
                ssl_handshake_timeout=HANDSHAKE_SECONDS if tls is not None else None,
            )
        except BaseException:
            await runner.cleanup()
            await client.close()
            raise
        server = cls(api, runner, tls, listening)
        if tls is not None:
            server.watching = asyncio.create_task(tls.watch(reload_seconds), name="claim-tls")
            log.info("claim API on https://%s:%s (certificate %s)", host, port, cert_file)
        else:
            # No TLS gauges in plain mode: nothing for the claim port's TLS alerts to see.
            metrics.CLAIM_TLS_READY.clear()
            metrics.CLAIM_TLS_NOT_AFTER.clear()
            log.warning(
                "claim API on http://%s:%s WITHOUT TLS: tasks' payloads and the sidecars' "
                "tokens cross the pod network in clear text; give --claim-cert-file and "
                "--claim-key-file (docs/security.md)",
                host,
                port,
            )
        return server

    async def close(self) -> None:
        if self.watching is not None:
            self.watching.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self.watching
        if self.listening is not None:
            self.listening.close()
        with contextlib.suppress(Exception):
            await self.runner.cleanup()
        await self.api.client.close()


__all__ = [
    "AUDIENCE",
    "ClaimApi",
    "ClaimLookup",
    "ClaimRef",
    "ClaimServer",
    "Review",
    "agent_of",
    "no_claims",
    "pool_pod_of",
]
