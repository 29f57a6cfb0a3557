"""The operator's claim API (``agentq.operator.claim_api``): a cross-namespace claim's
task, for its holder only (docs/tenancy.md, "Cross-namespace claims").

The API server is a fake of the two requests it makes (a TokenReview, a GET of the
AgentTask); the claims are a fake lookup; requests are real HTTP to its aiohttp app.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import REGISTRY

from agentq import kube
from agentq.clock import FakeClock
from agentq.operator.claim_api import (
    AUDIENCE,
    TOKEN_REVIEW_PATH,
    ClaimApi,
    ClaimRef,
    agent_of,
    no_claims,
    pool_pod_of,
)
from harness import run

Body = dict[str, Any]
POOL = "pool"
LEASE = "agentq-xtask-team-a.job"
TASK_PATH = "/apis/agentq.dev/v1alpha1/namespaces/team-a/agenttasks/job"
URL = f"/v1/claims/{POOL}/{LEASE}"
REF = ClaimRef(task_namespace="team-a", task_name="job", task_uid="uid-1", worker="w1", token=7)


def account(namespace: str, name: str) -> Body:
    return {
        "authenticated": True,
        "user": {"username": f"system:serviceaccount:{namespace}:{name}"},
        "audiences": [AUDIENCE],
    }


def pool_pod(namespace: str, pod: str | None, uid: str | None) -> Body:
    """A TokenReview of pool account agentq-pool-p's token, bound to ``pod`` if given."""
    extra: Body = {}
    if pod is not None:
        extra["authentication.kubernetes.io/pod-name"] = [pod]
    if uid is not None:
        extra["authentication.kubernetes.io/pod-uid"] = [uid]
    return {
        "authenticated": True,
        "user": {"username": f"system:serviceaccount:{namespace}:agentq-pool-p", "extra": extra},
        "audiences": [AUDIENCE],
    }


def the_task(*, uid: str = "uid-1", token: int | None = 7) -> Body:
    status: Body = {"phase": "Assigned", "attempt": 2, "worker": "w1"}
    if token is not None:
        status["fencingToken"] = token
    return {
        "apiVersion": "agentq.dev/v1alpha1",
        "kind": "AgentTask",
        "metadata": {"name": "job", "namespace": "team-a", "uid": uid, "resourceVersion": "9"},
        "spec": {"payload": {"q": [1, 2]}, "leaseDurationSeconds": 45},
        "status": status,
    }


class FakeApiServer:
    """A TokenReview answer per token, an AgentTask per path; every request recorded."""

    def __init__(self) -> None:
        self.tokens: dict[str, Body] = {
            "w1-token": account(POOL, "agentq-agent-w1"),
            "w2-token": account(POOL, "agentq-agent-w2"),
            "other-ns-token": account("elsewhere", "agentq-agent-w1"),
            "default-token": account(POOL, "default"),
            "admin-token": {
                "authenticated": True,
                "user": {"username": "kubernetes-admin"},
                "audiences": [AUDIENCE],
            },
            "pod-1-token": pool_pod(POOL, "p-1", "pod-uid-1"),
            "pod-1-again-token": pool_pod(POOL, "p-1", "pod-uid-9"),  # same name, new pod
            "pod-2-token": pool_pod(POOL, "p-2", "pod-uid-2"),
            "pod-1-elsewhere-token": pool_pod("elsewhere", "p-1", "pod-uid-1"),
            "unbound-pool-token": pool_pod(POOL, None, None),
            "no-uid-pool-token": pool_pod(POOL, "p-1", None),
            "no-audience-token": {
                "authenticated": True,
                "user": {"username": f"system:serviceaccount:{POOL}:agentq-agent-w1"},
            },
        }
        self.tasks: dict[str, tuple[int, Body]] = {TASK_PATH: (200, the_task())}
        self.sent: list[tuple[str, str, Any]] = []
        self.review_fault: BaseException | None = None
        self.review_delay = 0.0

    async def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        params: Mapping[str, str] | None = None,
        **_: Any,
    ) -> kube.Response:
        self.sent.append((method, path, body))
        if method == "POST" and path == TOKEN_REVIEW_PATH:
            await asyncio.sleep(self.review_delay)
            if self.review_fault is not None:
                raise self.review_fault
            status = self.tokens.get(body["spec"]["token"], {"authenticated": False})
            if AUDIENCE not in body["spec"]["audiences"]:
                status = {"authenticated": False, "error": "audience"}
            return kube.Response(201, json.dumps({**body, "status": status}).encode())
        if method == "GET" and path in self.tasks:
            code, task = self.tasks[path]
            return kube.Response(code, json.dumps(task).encode())
        if method == "GET":
            return kube.Response(404, b'{"kind":"Status","code":404}')
        raise AssertionError(f"unexpected {method} {path}")

    def reviews(self) -> int:
        return sum(1 for method, path, _ in self.sent if path == TOKEN_REVIEW_PATH)


class Claims:
    """The fake lookup: the claims it knows, and what it was asked."""

    def __init__(self, *refs: tuple[str, str, ClaimRef]) -> None:
        self.refs = {(ns, name): ref for ns, name, ref in refs}
        self.asked: list[tuple[str, str]] = []

    def __call__(self, lease_namespace: str, lease_name: str) -> ClaimRef | None:
        self.asked.append((lease_namespace, lease_name))
        return self.refs.get((lease_namespace, lease_name))


@asynccontextmanager
async def serving(
    claims: Claims | None = None, *, cache_size: int = 4096, **limits: Any
) -> AsyncIterator[tuple[TestClient[Any, Any], FakeApiServer, ClaimApi, FakeClock]]:
    server = FakeApiServer()
    clock = FakeClock()
    api = ClaimApi(
        server,  # type: ignore[arg-type]
        claims if claims is not None else Claims((POOL, LEASE, REF)),
        clock=clock,
        cache_size=cache_size,
        **limits,
    )
    client: TestClient[Any, Any] = TestClient(TestServer(api.app()))
    await client.start_server()
    try:
        yield client, server, api, clock
    finally:
        await client.close()


async def ask(client: TestClient[Any, Any], token: str | None, url: str = URL) -> tuple[int, Body]:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    rsp = await client.get(url, headers=headers)
    return rsp.status, await rsp.json()


def counted(code: int) -> float:
    """agentq_claim_api_requests_total{code} now."""
    value = REGISTRY.get_sample_value("agentq_claim_api_requests_total", {"code": str(code)})
    return value or 0.0


@run
async def test_the_holder_gets_its_task_shaped_as_the_sidecar_reads_an_agenttask() -> None:
    claims = Claims((POOL, LEASE, REF))
    before = counted(200)
    async with serving(claims) as (client, server, _, _):
        code, body = await ask(client, "w1-token")
        assert code == 200, body
        assert body == {
            "metadata": {"name": "job", "namespace": "team-a", "uid": "uid-1"},
            "spec": {"payload": {"q": [1, 2]}, "leaseDurationSeconds": 45},
            "status": {"attempt": 2},
        }
        (review,) = [b for _, path, b in server.sent if path == TOKEN_REVIEW_PATH]
        assert review["kind"] == "TokenReview"
        assert review["spec"] == {"token": "w1-token", "audiences": [AUDIENCE]}
        assert claims.asked == [(POOL, LEASE)]
        assert ("GET", TASK_PATH, None) in server.sent
    assert counted(200) == before + 1


@run
async def test_no_bearer_token_is_401_and_nothing_is_reviewed() -> None:
    before = counted(401)
    async with serving() as (client, server, _, _):
        for headers in ({}, {"Authorization": "Basic dTpw"}, {"Authorization": "Bearer "}):
            rsp = await client.get(URL, headers=headers)
            assert rsp.status == 401
            assert rsp.headers["WWW-Authenticate"] == "Bearer"
            assert (await rsp.json())["error"] == "Unauthorized"
        assert server.sent == []
    assert counted(401) == before + 3


@run
async def test_tokens_that_are_not_this_workers_agent_account_are_refused() -> None:
    """Another audience (the API server's), no audience confirmed, another namespace's
    account, an account that is not an agent's, a user: 403, and the claim is not
    looked up."""
    claims = Claims((POOL, LEASE, REF))
    before = counted(403)
    async with serving(claims) as (client, server, _, _):
        for token in (
            "api-audience-token",  # unknown to the fake: not authenticated for ours
            "no-audience-token",
            "other-ns-token",
            "default-token",
            "admin-token",
        ):
            code, body = await ask(client, token)
            assert (code, body["error"]) == (403, "Forbidden"), token
        assert claims.asked == []
        assert not [path for _, path, _ in server.sent if path == TASK_PATH]
    assert counted(403) == before + 5


@run
async def test_another_workers_claim_is_refused_and_an_unknown_one_is_404() -> None:
    claims = Claims((POOL, LEASE, REF))
    async with serving(claims) as (client, server, _, _):
        code, body = await ask(client, "w2-token")
        assert (code, body["error"]) == (403, "Forbidden")
        code, body = await ask(client, "w1-token", f"/v1/claims/{POOL}/agentq-xtask-team-a.other")
        assert (code, body["error"]) == (404, "NotFound")
        assert not [path for _, path, _ in server.sent if path.startswith("/apis/agentq.dev")]
    async with serving(Claims()) as (client, _, _, _):
        assert (await ask(client, "w1-token"))[0] == 404


@run
async def test_a_task_that_is_gone_remade_or_granted_again_is_410() -> None:
    async with serving() as (client, server, _, _):
        server.tasks.clear()
        code, body = await ask(client, "w1-token")
        assert (code, body["error"]) == (410, "Gone")
        server.tasks[TASK_PATH] = (200, the_task(uid="uid-2"))
        assert (await ask(client, "w1-token"))[0] == 410
        server.tasks[TASK_PATH] = (200, the_task(token=8))
        assert (await ask(client, "w1-token"))[0] == 410
        # A task whose status does not show this claim's token yet: not yet (404).
        server.tasks[TASK_PATH] = (200, the_task(token=None))
        assert (await ask(client, "w1-token"))[0] == 404
        server.tasks[TASK_PATH] = (200, the_task())
        assert (await ask(client, "w1-token"))[0] == 200


@run
async def test_reviews_are_cached_for_a_minute_by_token_and_bounded() -> None:
    async with serving(cache_size=2) as (client, server, api, clock):
        for _ in range(3):
            assert (await ask(client, "w1-token"))[0] == 200
        assert (await ask(client, "w2-token"))[0] == 403
        assert (await ask(client, "w2-token"))[0] == 403  # a refusal is cached too
        assert server.reviews() == 2
        assert all("w1-token" not in key and "w2-token" not in key for key in api.reviews)
        clock.advance(61)
        assert (await ask(client, "w1-token"))[0] == 200
        assert server.reviews() == 3
        # Two agents' reviews at most: a third pushes out the least recently used.
        assert (await ask(client, "pod-1-token"))[0] == 403  # (no claim of p-1's)
        assert (await ask(client, "pod-2-token"))[0] == 403
        assert len(api.reviews) == 2
        assert server.reviews() == 5
        assert (await ask(client, "w1-token"))[0] == 200
        assert server.reviews() == 6


@run
async def test_a_flood_of_bogus_tokens_never_evicts_an_agents_review() -> None:
    """Refusals are cached apart, in a cache of their own size: distinct bogus tokens,
    however many, push out only each other."""
    async with serving(cache_size=2, refusal_cache_size=3, review_burst=100) as (
        client,
        server,
        api,
        _,
    ):
        assert (await ask(client, "w1-token"))[0] == 200
        for i in range(20):
            assert (await ask(client, f"bogus-{i}"))[0] == 403
        assert (len(api.reviews), len(api.refusals)) == (1, 3)
        assert server.reviews() == 21
        assert (await ask(client, "w1-token"))[0] == 200
        assert server.reviews() == 21  # from the cache
        assert (await ask(client, "bogus-19"))[0] == 403
        assert server.reviews() == 21


@run
async def test_new_reviews_beyond_the_rate_are_429_with_retry_after() -> None:
    """At most ``review_burst`` new TokenReviews at once, ``review_rate`` a second after:
    the rest are 429 with Retry-After, never sent; a cached review still answers."""
    before = counted(429)
    async with serving(review_rate=2.0, review_burst=3) as (client, server, _, clock):
        assert (await ask(client, "w1-token"))[0] == 200
        for i in range(2):
            assert (await ask(client, f"bogus-{i}"))[0] == 403
        rsp = await client.get(URL, headers={"Authorization": "Bearer bogus-2"})
        assert rsp.status == 429
        assert rsp.headers["Retry-After"] == "1"
        assert (await rsp.json())["error"] == "TooManyRequests"
        assert server.reviews() == 3
        assert (await ask(client, "w1-token"))[0] == 200  # cached: no review needed
        assert (await ask(client, "w2-token"))[0] == 429
        clock.advance(0.5)  # one more review's worth
        assert (await ask(client, "w2-token"))[0] == 403
        assert (await ask(client, "bogus-3"))[0] == 429
        assert server.reviews() == 4
    assert counted(429) == before + 3


@run
async def test_at_most_review_concurrency_reviews_are_in_flight() -> None:
    async with serving(review_concurrency=2, review_burst=100) as (client, server, api, _):
        server.review_delay = 0.05
        answers = await asyncio.gather(*(ask(client, f"bogus-{i}") for i in range(5)))
        assert sorted(code for code, _ in answers) == [403, 403, 429, 429, 429]
        assert server.reviews() == 2
        assert api.budget.in_flight == 0
        # One token asked at once by many shares its one review, within the bound.
        answers = await asyncio.gather(*(ask(client, "w1-token") for _ in range(5)))
        assert [code for code, _ in answers] == [200] * 5
        assert server.reviews() == 3


@run
async def test_concurrent_requests_with_one_token_share_one_review() -> None:
    async with serving() as (client, server, _, _):
        server.review_delay = 0.05
        answers = await asyncio.gather(*(ask(client, "w1-token") for _ in range(5)))
        assert [code for code, _ in answers] == [200] * 5
        assert server.reviews() == 1


@run
async def test_a_review_without_an_answer_is_503_and_not_cached() -> None:
    before = counted(503)
    async with serving() as (client, server, api, _):
        server.review_fault = kube.TransportError("connection refused")
        code, body = await ask(client, "w1-token")
        assert (code, body["error"]) == (503, "Unavailable")
        assert api.reviews == {}
        server.review_fault = None
        assert (await ask(client, "w1-token"))[0] == 200
        assert server.reviews() == 2
    assert counted(503) == before + 1


def test_an_agent_account_names_its_namespace_and_worker() -> None:
    assert agent_of("system:serviceaccount:pool:agentq-agent-w1") == ("pool", "w1")
    for name in (
        "system:serviceaccount:pool:agentq-agent-",
        "system:serviceaccount:pool:default",
        "system:serviceaccount::agentq-agent-w1",
        "system:serviceaccount:pool:agentq-agent-w1:x",
        "agentq-agent-w1",
    ):
        assert agent_of(name) is None, name
    assert no_claims(POOL, LEASE) is None


POD_REF = ClaimRef(
    task_namespace="team-a",
    task_name="job",
    task_uid="uid-1",
    worker="p-1",
    token=7,
    worker_pod_uid="pod-uid-1",
)


@run
async def test_a_pool_pod_reads_the_claims_of_the_worker_it_is_and_owns_alone() -> None:
    """An autoscaled pool's pods share account agentq-pool-<pool> (docs/autoscaling.md):
    a pod's token is the worker named after the pod it is bound to (as the admission
    policy has it), and only while that worker's AgentWorker is owned by that very pod
    (its UID): not another pod of the pool, not a new pod of the same name, not a pool
    token bound to no pod, not the pool's account of another namespace, not a pod whose
    name is a worker no pod owns (a person's, or an agentq-agent- account's)."""
    claims = Claims((POOL, LEASE, POD_REF))
    async with serving(claims) as (client, _, _, _):
        code, body = await ask(client, "pod-1-token")
        assert code == 200, body
        assert body["spec"]["payload"] == {"q": [1, 2]}
        for token, why in [
            ("pod-2-token", "not yours"),
            ("pod-1-again-token", "not owned by your pod"),
        ]:
            code, body = await ask(client, token)
            assert (code, body["error"]) == (403, "Forbidden"), token
            assert why in body["message"], body
        asked = len(claims.asked)
        for token in ("pod-1-elsewhere-token", "unbound-pool-token", "no-uid-pool-token"):
            code, body = await ask(client, token)
            assert (code, body["error"]) == (403, "Forbidden"), token
        assert len(claims.asked) == asked  # refused before any lookup
        # An agentq-agent-<worker> account is not held to an owner.
        assert (await ask(client, "w1-token"))[0] == 403  # p-1's claim, not w1's
    static = ClaimRef(
        task_namespace="team-a", task_name="job", task_uid="uid-1", worker="p-1", token=7
    )
    async with serving(Claims((POOL, LEASE, static))) as (client, _, _, _):
        code, body = await ask(client, "pod-1-token")
        assert (code, body["error"]) == (403, "Forbidden")
        assert "not owned by your pod" in body["message"]
    async with serving(Claims((POOL, LEASE, REF))) as (client, _, _, _):
        assert (await ask(client, "w1-token"))[0] == 200  # no owner needed for an agent account


def test_a_pool_account_names_its_namespace_pod_and_pod_uid() -> None:
    bound = {
        "authentication.kubernetes.io/pod-name": ["p-1"],
        "authentication.kubernetes.io/pod-uid": ["u-1"],
    }
    assert pool_pod_of("system:serviceaccount:pool:agentq-pool-llm", bound) == (
        "pool",
        "p-1",
        "u-1",
    )
    pool = "system:serviceaccount:pool:agentq-pool-llm"
    for name, extra in [
        (pool, {}),
        (pool, None),
        (pool, {**bound, "authentication.kubernetes.io/pod-uid": []}),
        (pool, {**bound, "authentication.kubernetes.io/pod-name": ["a", "b"]}),
        ("system:serviceaccount:pool:agentq-pool-", bound),
        ("system:serviceaccount:pool:agentq-agent-w1", bound),
        ("system:serviceaccount::agentq-pool-llm", bound),
        ("agentq-pool-llm", bound),
    ]:
        assert pool_pod_of(name, extra) is None, (name, extra)
