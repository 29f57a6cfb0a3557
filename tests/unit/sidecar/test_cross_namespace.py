"""Cross-namespace claims in the sidecar (docs/tenancy.md, "Cross-namespace claims").

A claim of task ``job`` of namespace ``team-a`` has its Lease here as
``agentq-xtask-team-a.job``; the agent knows it as task ``team-a~job``; its payload
comes from the operator's claim API, never from the API server (the sidecar has no
RBAC in team namespaces). The operator here is a small aiohttp app whose answers the
test sets; the API server is the in-memory FakeApi.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from agentq import protocol
from agentq.sidecar import metrics
from agentq.sidecar.attempts import AgentError, Attempts, LeaseView
from agentq.sidecar.kubeapi import lease_path
from agentq.sidecar.operator_claims import OperatorClaims
from harness import run
from sidecar_fakes import (
    NS,
    Sidecar,
    agent,
    cross_task_lease,
    task_lease,
    wait_for,
)

Body = dict[str, Any]
LEASE = protocol.cross_task_lease_name("team-a", "job")
TASK_ID = "team-a~job"


def test_the_protocol_names_a_cross_namespace_lease_and_splits_it_back() -> None:
    assert LEASE == "agentq-xtask-team-a.job"
    assert protocol.XTASK_LEASE_PREFIX == "agentq-xtask-"
    assert protocol.LABEL_TASK_NAMESPACE == "agentq.dev/task-namespace"
    rest = LEASE.removeprefix(protocol.XTASK_LEASE_PREFIX)
    assert protocol.split_cross_task(rest) == ("team-a", "job")
    # The task's own name may hold dots; the namespace never does.
    assert protocol.split_cross_task("team-a.job.v2") == ("team-a", "job.v2")
    for bad in ("nodot", ".job", "team-a."):
        assert protocol.split_cross_task(bad) is None
    long = protocol.cross_task_lease_name("n" * 63, "t" * 253)
    assert len(long) == 253 and long.startswith(protocol.XTASK_LEASE_PREFIX)
    # Never the name of a task Lease of the worker's own namespace.
    assert not protocol.task_lease_name("team-a.job").startswith(protocol.XTASK_LEASE_PREFIX)


def test_an_xtask_lease_is_an_attempt_known_by_namespace_dot_task() -> None:
    view = LeaseView.of(cross_task_lease())
    assert view is not None
    assert (view.name, view.task, view.task_namespace, view.task_uid) == (
        LEASE,
        TASK_ID,
        "team-a",
        "uid-x",
    )
    attempts = Attempts(namespace=NS, worker="w")
    attempt = attempts.observe(cross_task_lease(), 0.0)
    assert attempt is not None and attempt.cross and attempt.lease_name == LEASE
    assert attempt.task == TASK_ID and attempt.namespace == NS
    # A same-namespace task Lease is as before.
    same = attempts.observe(task_lease(), 0.0)
    assert same is not None and not same.cross and same.task == "job"


def test_a_pool_task_named_like_a_cross_claim_is_another_attempt() -> None:
    """Task "team-a.job" of the worker's namespace and task "job" of namespace "team-a":
    their Leases' names differ only by prefix, their ids never meet (``~`` is in no
    object name), so both are served, each on its own Lease."""
    attempts = Attempts(namespace=NS, worker="w")
    first = attempts.observe(task_lease("team-a.job", token=7), 0.0)
    second = attempts.observe(cross_task_lease(token=9), 1.0)
    assert first is not None and second is not None
    assert attempts.current["team-a.job"] is first and attempts.current[TASK_ID] is second
    assert first.lease_name == protocol.task_lease_name("team-a.job")
    assert second.lease_name == LEASE
    assert protocol.split_claim_id(TASK_ID) == ("team-a", "job")
    assert protocol.split_claim_id("team-a.job") is None


def test_the_agent_api_takes_both_kinds_of_task_id() -> None:
    from agentq.sidecar import agent_input

    assert agent_input.task_name(TASK_ID) == TASK_ID
    assert agent_input.task_name("job.v2") == "job.v2"
    for bad in ("~job", "team-a~", "team.a~job", "a~b~c", "Team~job"):
        with pytest.raises(AgentError):
            agent_input.task_name(bad)


def test_an_inherited_xtask_lease_is_told_lost_by_its_own_name() -> None:
    """find() looked an inherited Lease up by ``task_lease_name(task)``, a name a
    cross-namespace claim's Lease never has: the agent was told 404 UnknownTask."""
    attempts = Attempts(namespace=NS, worker="w")
    lease = cross_task_lease(token=5)
    lease["metadata"]["resourceVersion"] = "100"
    assert attempts.observe(lease, 0.0, serve_from_rv=150) is None
    with pytest.raises(AgentError) as told:
        attempts.find(TASK_ID, 5)
    assert told.value.code == "LeaseLost" and "took the worker Lease over" in told.value.message


class FakeOperator:
    """The operator's claim API: answers in order (the last one repeats); records what
    was asked and with which bearer token."""

    def __init__(self, *answers: tuple[int, Body]) -> None:
        self.answers = list(answers)
        self.seen: list[tuple[str, str]] = []
        self.server = TestServer(self._app())

    def _app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/v1/claims/{namespace}/{name}", self._claim)
        return app

    async def _claim(self, request: web.Request) -> web.Response:
        self.seen.append((request.path, request.headers.get("Authorization", "")))
        status, body = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        return web.json_response(body, status=status)

    async def __aenter__(self) -> FakeOperator:
        await self.server.start_server()
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.server.close()

    @property
    def url(self) -> str:
        return str(self.server.make_url("")).rstrip("/")


def the_task(payload: Any = None) -> Body:
    return {
        "metadata": {"name": "job", "namespace": "team-a", "uid": "uid-x"},
        "spec": {"payload": payload or {"q": "x"}, "leaseDurationSeconds": 45},
        "status": {"attempt": 1},
    }


def token_file(tmp: Path, value: str = "token-1") -> Path:
    path = tmp / "operator-token"
    path.write_text(value + "\n")
    return path


def reads(code: str) -> float:
    value = metrics.REGISTRY.get_sample_value("agentq_sidecar_claim_reads_total", {"code": code})
    return value or 0.0


async def granted(operator: FakeOperator, tokens: Path) -> Sidecar:
    """A sidecar holding its worker Lease, with the claim's Lease granted to it."""
    sidecar = Sidecar(claims=OperatorClaims(operator.url, str(tokens)))
    sidecar.hold_worker_lease()
    sidecar.api.put(lease_path(NS, LEASE), cross_task_lease())
    sidecar.watcher.resume()
    return sidecar


def offered(sidecar: Sidecar) -> list[str]:
    return [a.task for a in sidecar.attempts.listing()]


@run
async def test_the_payload_comes_from_the_operator_with_the_projected_token(
    tmp_path: Path,
) -> None:
    tokens = token_file(tmp_path)
    async with FakeOperator((200, the_task({"q": "x"}))) as operator:
        sidecar = await granted(operator, tokens)
        async with sidecar.watching():
            await wait_for(lambda: offered(sidecar) == [TASK_ID])
        assert operator.seen == [(f"/v1/claims/{NS}/{LEASE}", "Bearer token-1")]
        # Not a single read of an AgentTask from the API server.
        assert not [key for key in sidecar.api.requests if key[1] == "agenttasks"]
        client = await agent(sidecar)
        try:
            listing = await (await client.get("/v1/assignments")).json()
            (assignment,) = listing["assignments"]
            assert assignment["task"] == TASK_ID and assignment["namespace"] == "team-a"
            assert assignment["payload"] == {"q": "x"} and assignment["uid"] == "uid-x"
            assert assignment["leaseDurationSeconds"] == 45
            # The agent's calls name the id; the writes go to the claim's own Lease.
            beat = await client.post(f"/v1/assignments/{TASK_ID}/heartbeat", json={"token": 7})
            assert beat.status == 200, await beat.text()
            done = await client.post(
                f"/v1/assignments/{TASK_ID}/complete", json={"token": 7, "result": 1}
            )
            assert done.status == 200, await done.text()
            lease = sidecar.api.objects[lease_path(NS, LEASE)]
            report = protocol.Report.decode(lease["metadata"]["annotations"]["agentq.dev/report"])
            assert (report.token, report.outcome) == (7, "Succeeded")
            assert lease_path(NS, protocol.task_lease_name(TASK_ID)) not in sidecar.api.objects
        finally:
            await client.close()
            await sidecar.close()


@run
async def test_a_refusal_and_an_unknown_claim_are_tried_again_and_counted(
    tmp_path: Path,
) -> None:
    """403 (refused: the token is not yet good, the operator not yet synced...) and 404
    (that replica has not seen the Lease yet) are tried again with backoff, with the
    token read again each time (it rotates)."""
    tokens = token_file(tmp_path, "old")
    before = {code: reads(code) for code in ("403", "404", "200")}
    async with FakeOperator(
        (403, {"error": "Forbidden", "message": "not yours"}),
        (404, {"error": "NotFound", "message": "no such claim"}),
        (200, the_task()),
    ) as operator:
        sidecar = await granted(operator, tokens)
        async with sidecar.watching():
            await wait_for(lambda: len(operator.seen) >= 1)
            tokens.write_text("new")
            await wait_for(lambda: offered(sidecar) == [TASK_ID], seconds=5)
        assert [auth for _, auth in operator.seen] == ["Bearer old", "Bearer new", "Bearer new"]
        await sidecar.close()
    for code in ("403", "404", "200"):
        assert reads(code) == before[code] + 1, code


@run
async def test_a_claim_the_operator_says_ended_is_dropped(tmp_path: Path) -> None:
    async with FakeOperator((410, {"error": "Gone", "message": "the task is gone"})) as operator:
        sidecar = await granted(operator, token_file(tmp_path))
        async with sidecar.watching():
            await wait_for(lambda: TASK_ID not in sidecar.attempts.current and operator.seen)
        assert offered(sidecar) == [] and len(operator.seen) == 1
        with pytest.raises(AgentError) as told:
            sidecar.attempts.find(TASK_ID, 7)
        assert told.value.code == "LeaseLost" and "claim ended" in told.value.message
        await sidecar.close()


@run
async def test_retries_stop_when_the_lease_goes(tmp_path: Path) -> None:
    async with FakeOperator((404, {"error": "NotFound", "message": "not yet"})) as operator:
        sidecar = await granted(operator, token_file(tmp_path))
        async with sidecar.watching():
            await wait_for(lambda: len(operator.seen) >= 1)
            sidecar.attempts.deleted(sidecar.api.objects[lease_path(NS, LEASE)])
            asked = len(operator.seen)
            await wait_for(lambda: not sidecar.watcher._fetches, seconds=5)
        assert len(operator.seen) <= asked + 1
        await sidecar.close()


@run
async def test_without_an_operator_url_an_xtask_claim_is_dropped_and_said(
    caplog: pytest.LogCaptureFixture,
) -> None:
    sidecar = Sidecar()
    sidecar.hold_worker_lease()
    sidecar.api.put(lease_path(NS, LEASE), cross_task_lease())
    sidecar.watcher.resume()
    with caplog.at_level(logging.ERROR, logger="agentq.sidecar.watcher"):
        async with sidecar.watching():
            await wait_for(lambda: (TASK_ID, 7) in sidecar.attempts.ended)
    assert offered(sidecar) == []
    assert "no --operator-url" in caplog.text and LEASE in caplog.text
    assert not [key for key in sidecar.api.requests if key[1] == "agenttasks"]
