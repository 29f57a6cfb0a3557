"""The sidecar's parts over an in-memory API server, for the sidecar's unit tests
(tests/unit/sidecar): ``FakeApi`` (objects by path, resourceVersions, compare-and-swap
replaces, injected faults, a watch fed by the test), ``Sidecar`` (wired as
``agentq.sidecar.command`` wires it, on a ``FakeClock``) and an HTTP client of its
agent API (``agent``)."""

from __future__ import annotations

import asyncio
import contextlib
import copy
from collections import Counter
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

from aiohttp.test_utils import TestClient, TestServer

from agentq import GROUP, VERSION, protocol
from agentq.clock import FakeClock
from agentq.sidecar.api import AgentApi
from agentq.sidecar.attempts import Attempt, Attempts
from agentq.sidecar.auth import Guard
from agentq.sidecar.changes import Changes
from agentq.sidecar.kubeapi import ApiError, KubeApi, custom_path, lease_path
from agentq.sidecar.operator_claims import OperatorClaims
from agentq.sidecar.renewer import Renewer
from agentq.sidecar.watcher import TaskLeaseWatcher
from agentq.sidecar.worker_lease import WorkerLeaseKeeper

Body = dict[str, Any]
NS = "ns"
WORKER = "w"
SECRET = "the-pods-secret"

# A fault: (method, path prefix) it applies to, whether the request is applied first
# (an unknown outcome that did happen), and what is raised.
Fault = tuple[str, str, bool, BaseException]


class FakeApi:
    """Just enough of the API server for the sidecar: objects by path, resourceVersions,
    compare-and-swap replaces, and injected faults (``fail``)."""

    def __init__(self) -> None:
        self.objects: dict[str, Body] = {}
        self.rv = 100
        self.requests: Counter[tuple[str, str]] = Counter()
        self.faults: list[Fault] = []
        self.events: asyncio.Queue[Body] = asyncio.Queue()  # what the watch delivers
        self.before: Callable[[str, str], None] = lambda method, path: None  # runs first

    def fail(
        self,
        method: str,
        path: str,
        error: BaseException,
        *,
        applied: bool = False,
        times: int = 1,
    ) -> None:
        self.faults.extend([(method, path, applied, error)] * times)

    def put(self, path: str, body: Body) -> Body:
        self.rv += 1
        stored = copy.deepcopy(body)
        stored.setdefault("metadata", {})["resourceVersion"] = str(self.rv)
        self.objects[path] = stored
        return copy.deepcopy(stored)

    async def request(
        self,
        method: str,
        path: str,
        *,
        resource: str,
        params: Mapping[str, str] | None = None,
        body: Body | None = None,
        **_: Any,
    ) -> Body:
        self.requests[(method, resource)] += 1
        self.before(method, path)
        await asyncio.sleep(0)
        fault = next((f for f in self.faults if f[0] == method and path.startswith(f[1])), None)
        if fault is not None:
            self.faults.remove(fault)
            if not fault[2]:
                raise fault[3]
        answer = self._apply(method, path, body)
        if fault is not None:
            raise fault[3]
        return answer

    async def watch(
        self, path: str, *, resource: str, params: Mapping[str, str], timeout_seconds: int
    ) -> AsyncIterator[Body]:
        """The events put in ``events``; the watch stays connected until it is closed."""
        self.requests[("WATCH", resource)] += 1
        while True:
            yield await self.events.get()

    def _apply(self, method: str, path: str, body: Body | None) -> Body:
        if method == "GET" and path == lease_path(NS):
            items = [
                copy.deepcopy(lease)
                for name, lease in sorted(self.objects.items())
                if name.startswith(f"{path}/")
                and lease["metadata"].get("labels", {}).get(protocol.LABEL_LEASE_KIND) == "task"
            ]
            return {"metadata": {"resourceVersion": str(self.rv)}, "items": items}
        if method == "GET":
            if path not in self.objects:
                raise ApiError(404, f"{path} not found")
            return copy.deepcopy(self.objects[path])
        assert body is not None
        if method == "POST":
            path = f"{path}/{body['metadata']['name']}"
            if path in self.objects:
                raise ApiError(409, "already exists")
            return self.put(path, body)
        if method == "PUT":
            have = self.objects.get(path)
            if have is None:
                raise ApiError(404, f"{path} not found")
            if have["metadata"]["resourceVersion"] != body["metadata"].get("resourceVersion"):
                raise ApiError(409, "the object has been modified")
            return self.put(path, body)
        raise AssertionError(f"unexpected {method} {path}")


def task_lease(task: str = "job", *, token: int = 7, holder: str = WORKER) -> Body:
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": protocol.task_lease_name(task),
            "namespace": NS,
            "labels": {
                protocol.LABEL_LEASE_KIND: "task",
                protocol.LABEL_TASK: task,
                protocol.LABEL_WORKER: WORKER,
            },
            "annotations": {
                protocol.ANNOTATION_TOKEN: str(token),
                protocol.ANNOTATION_ATTEMPT: "1",
            },
            "ownerReferences": [{"kind": "AgentTask", "name": task, "uid": "uid-1"}],
        },
        "spec": {"holderIdentity": holder, "leaseDurationSeconds": 30},
    }


def cross_task_lease(
    namespace: str = "team-a", task: str = "job", *, token: int = 7, holder: str = WORKER
) -> Body:
    """The Lease, in the sidecar's namespace, of a claim of task ``task`` of ``namespace``
    (docs/tenancy.md, "Cross-namespace claims"): no owner reference."""
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": protocol.cross_task_lease_name(namespace, task),
            "namespace": NS,
            "labels": {
                protocol.LABEL_LEASE_KIND: "task",
                protocol.LABEL_TASK: protocol.label_value(task),
                protocol.LABEL_WORKER: WORKER,
                protocol.LABEL_TASK_NAMESPACE: namespace,
            },
            "annotations": {
                protocol.ANNOTATION_TOKEN: str(token),
                protocol.ANNOTATION_ATTEMPT: "1",
                protocol.ANNOTATION_TASK_UID: "uid-x",
            },
        },
        "spec": {"holderIdentity": holder, "leaseDurationSeconds": 30},
    }


def agent_task(task: str = "job") -> Body:
    return {
        "metadata": {"name": task, "namespace": NS, "uid": "uid-1"},
        "spec": {"requiredCapabilities": ["llm"], "payload": {"q": 1}, "leaseDurationSeconds": 30},
    }


class Sidecar:
    """The sidecar's parts over a FakeApi, wired as ``agentq.sidecar.command`` wires them."""

    def __init__(
        self,
        api: FakeApi | None = None,
        *,
        identity: str = "pod-1",
        claims: OperatorClaims | None = None,
    ) -> None:
        self.api = api or FakeApi()
        self.claims = claims
        self.clock = FakeClock()
        self.attempts = Attempts(namespace=NS, worker=WORKER)
        self.changes = Changes()
        kube: KubeApi = self.api  # type: ignore[assignment]
        self.keeper = WorkerLeaseKeeper(
            kube,
            self.clock,
            namespace=NS,
            worker=WORKER,
            identity=identity,
            duration_seconds=15,
            on_acquired=lambda rv: self.watcher.resume(),
            on_lost=self.lost,
            on_confirmed=self.changes.notify,
        )
        self.watcher = TaskLeaseWatcher(
            kube,
            self.clock,
            self.attempts,
            self.changes,
            namespace=NS,
            worker=WORKER,
            serve_from_rv=lambda: self.keeper.serve_from_rv,
            claims=claims,
        )
        self.renewer = Renewer(
            kube, self.clock, self.attempts, self.changes, self.keeper, worker=WORKER
        )
        self.agent_api = AgentApi(
            clock=self.clock,
            attempts=self.attempts,
            changes=self.changes,
            renewer=self.renewer,
            keeper=self.keeper,
            watcher=self.watcher,
            worker=WORKER,
            namespace=NS,
            identity=identity,
            loops=lambda: [],
            guard=Guard(secret=SECRET, listen_host="127.0.0.1", token_file="/tmp/unused"),
        )

    async def close(self) -> None:
        """Close what the test's sidecar opened (its operator client's session)."""
        if self.claims is not None:
            await self.claims.close()

    def lost(self, reason: str) -> None:
        """The worker Lease is lost (what ``Sidecar._lost`` does)."""
        self.watcher.pause()
        self.attempts.lose_all(reason)

    def hold_worker_lease(self) -> None:
        self.keeper.holding = True
        self.keeper.lease = {"metadata": {"name": "agentq-worker-w"}}
        self.keeper.confirmed_at = self.clock.monotonic()
        self.watcher.synced = True

    def grant(
        self,
        task: str = "job",
        *,
        token: int = 7,
        budgets: dict[str, tuple[int, int]] | None = None,
    ) -> Attempt:
        """The operator grants ``task``; the watch sees it and the task is read
        (``budgets``: its spec.budgets, name -> (requests, tokens) estimated)."""
        path = lease_path(NS, protocol.task_lease_name(task))
        lease = self.api.put(path, task_lease(task, token=token))
        attempt = self.attempts.observe(lease, self.clock.monotonic())
        assert attempt is not None
        assert self.attempts.activate(
            attempt,
            uid="uid-1",
            payload={"q": 1},
            lease_seconds=30,
            heartbeat_seconds=10,
            budgets=budgets,
        )
        return attempt

    @contextlib.asynccontextmanager
    async def watching(self) -> AsyncIterator[None]:
        """The task Lease watcher's loop runs for the block."""
        stop = asyncio.Event()
        loop = asyncio.create_task(self.watcher.run(stop))
        try:
            yield
        finally:
            stop.set()
            loop.cancel()
            await asyncio.gather(loop, return_exceptions=True)
            await self.watcher.close()

    def lease(self, task: str = "job") -> Body:
        return copy.deepcopy(self.api.objects[lease_path(NS, protocol.task_lease_name(task))])


async def agent(sidecar: Sidecar) -> TestClient[Any, Any]:
    client: TestClient[Any, Any] = TestClient(
        TestServer(sidecar.agent_api.app()), headers={"Authorization": f"Bearer {SECRET}"}
    )
    await client.start_server()
    return client


async def wait_for(condition: Callable[[], bool], seconds: float = 3.0) -> None:
    for _ in range(int(seconds / 0.01)):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not met in time")


TASK_PATH = custom_path(GROUP, VERSION, NS, "agenttasks", "job")
COMPLETE = "/v1/assignments/job/complete"
