"""The controller loop on an in-memory API server (``agentq.operator.fake``), with a fake clock.

    h = Harness()
    h.worker("w1", "llm")          # an AgentWorker and its fresh worker Lease
    h.task(task("t1").requires("llm"))
    await h.settle()               # steps until nothing is left to do
    h.renew("t1")                  # the holder renews its claim (as a sidecar would)
    h.clock.advance(31)            # time passes

Watch events reach the controller synchronously unless ``h.kube.hold_events()``.
"""

from __future__ import annotations

import asyncio
import json
import random
from typing import Any

from agentq import protocol
from agentq.claims import Readiness
from agentq.clock import FakeClock, micro_rfc3339
from agentq.operator.config import OperatorConfig
from agentq.operator.controller import Controller
from agentq.operator.fake import FakeKube
from agentq.operator.health import WatchHealth
from agentq.operator.port import Kube
from agentq.operator.records import TaskRecord
from agentq.operator.silence import ApiSilence, HeardKube
from agentq.scheduler import Scheduler
from builders import BudgetBuilder, QueueBuilder, TaskBuilder

NS = "ns"


class TickingClock(FakeClock):
    """A fake clock that also moves a microsecond each time it is read, as a real one does
    between two reads: a deadline computed as "now" is already past when it is checked
    (a loop that re-arms such a deadline forever spins, and ``settle`` says so)."""

    def monotonic(self) -> float:
        self.advance(1e-6)
        return super().monotonic()


class Harness:
    def __init__(
        self, *, heard: bool = False, health: WatchHealth | None = None, **config: Any
    ) -> None:
        """``heard``: the controller's calls go through ``silence.HeardKube`` and every
        watch event is heard, as in the operator (``self.silence``). ``health``: the
        watches' health, as the informers report it (default: always healthy)."""
        self.kube = FakeKube()
        self.clock = TickingClock()
        settings = {"leader_election": False, "leader_namespace": NS, **config}
        self.config = OperatorConfig(**settings)
        self.silence = ApiSilence(self.clock, self.config.api_silence_seconds)
        port: Kube = HeardKube(self.kube, self.silence) if heard else self.kube
        # strict: every step ends with check_invariants(), a violation fails the test.
        self.controller = Controller(
            kube=port,
            clock=self.clock,
            config=self.config,
            rng=random.Random(1),
            health=health,
            strict=True,
        )
        if heard:
            self.silence.listen(self.controller.note_api_silence)

        def observe(plural: str, kind: str, body: dict[str, Any]) -> None:
            if heard:
                self.silence.heard()
            self.controller.observe(plural, kind, body)

        self.kube.subscribe(observe)
        self.controller.set_synced()

    # -- objects -------------------------------------------------------------------------

    def worker(
        self,
        name: str,
        *capabilities: str,
        max_in_flight: int = 10,
        weight: float = 1.0,
        lease: bool = True,
        lease_seconds: int = 10,
    ) -> None:
        self.kube.put(
            "agentworkers",
            {
                "metadata": {"name": name, "namespace": NS},
                "spec": {
                    "capabilities": list(capabilities),
                    "maxInFlight": max_in_flight,
                    "weight": weight,
                },
            },
        )
        if lease:
            self.worker_lease(name, seconds=lease_seconds)

    def worker_lease(self, name: str, *, seconds: int = 10, labelled: bool = True) -> None:
        labels = (
            {protocol.LABEL_LEASE_KIND: "worker", protocol.LABEL_WORKER: name} if labelled else {}
        )
        self.kube.put(
            "leases",
            {
                "metadata": {
                    "name": protocol.worker_lease_name(name),
                    "namespace": NS,
                    "labels": labels,
                },
                "spec": {
                    "holderIdentity": f"{name}-pod",
                    "leaseDurationSeconds": seconds,
                    "renewTime": micro_rfc3339(self.clock.now()),
                },
            },
        )

    def renew_worker(self, name: str) -> None:
        self.kube.edit(
            "leases",
            NS,
            protocol.worker_lease_name(name),
            lambda b: b["spec"].__setitem__("renewTime", micro_rfc3339(self.clock.now())),
        )

    def queue(self, builder: QueueBuilder) -> dict[str, Any]:
        """An AgentQueue (cluster-scoped)."""
        return self.kube.put("agentqueues", builder.namespace("").obj())

    def budget(self, builder: BudgetBuilder) -> dict[str, Any]:
        """An AgentBudget (cluster-scoped)."""
        return self.kube.put("agentbudgets", builder.namespace("").obj())

    def namespace(self, name: str = NS, **labels: str) -> dict[str, Any]:
        """A Namespace with these labels (an AgentQueue's namespaceSelector reads them)."""
        return self.kube.put(
            "namespaces", {"metadata": {"name": name, "namespace": "", "labels": labels}}
        )

    def task(self, builder: TaskBuilder) -> dict[str, Any]:
        return self.kube.put("agenttasks", builder.namespace(NS).obj())

    def delete_task(self, name: str) -> None:
        self.kube.remove("agenttasks", NS, name)
        lease = protocol.task_lease_name(name)
        if self.kube.get("leases", NS, lease) is not None:
            self.kube.remove("leases", NS, lease)  # the garbage collector, at once

    # -- what a holder does ---------------------------------------------------------------

    def lease(self, task: str) -> dict[str, Any] | None:
        return self.kube.get("leases", NS, protocol.task_lease_name(task))

    def renew(self, task: str, *, progress: str | None = None) -> None:
        # A renewal is a write at a later moment than the one before it.
        self.clock.advance(0.001)

        def change(body: dict[str, Any]) -> None:
            body["spec"]["renewTime"] = micro_rfc3339(self.clock.now())
            if progress is not None:
                body["metadata"].setdefault("annotations", {})[protocol.ANNOTATION_PROGRESS] = (
                    progress
                )

        self.kube.edit("leases", NS, protocol.task_lease_name(task), change)

    def annotate_lease(self, task: str, key: str, value: str) -> None:
        self.kube.edit(
            "leases",
            NS,
            protocol.task_lease_name(task),
            lambda b: b["metadata"].setdefault("annotations", {}).__setitem__(key, value),
        )

    def report(self, task: str, **fields: Any) -> None:
        status = self.status(task)
        body = {"token": status.get("fencingToken"), "worker": status.get("worker"), **fields}
        self.annotate_lease(task, protocol.ANNOTATION_REPORT, json.dumps(body))

    # -- reading --------------------------------------------------------------------------

    def status(self, task: str) -> dict[str, Any]:
        body = self.kube.get("agenttasks", NS, task)
        assert body is not None, task
        status: dict[str, Any] = body.get("status") or {}
        return status

    def phase(self, task: str) -> str | None:
        return self.status(task).get("phase")

    def worker_status(self, name: str) -> dict[str, Any]:
        body = self.kube.get("agentworkers", NS, name)
        assert body is not None
        status: dict[str, Any] = body.get("status") or {}
        return status

    def condition(self, task: str, kind: str) -> dict[str, Any] | None:
        return next(
            (c for c in self.status(task).get("conditions") or [] if c["type"] == kind), None
        )

    # -- the controller's store (what it knows, for assertions) ---------------------------

    def readiness(self, worker: str) -> Readiness | None:
        record = self.controller.store.workers.get((NS, worker))
        return None if record is None or record.readiness is None else record.readiness[0]

    def core(self) -> Scheduler:
        """The scheduling core of the namespace."""
        return self.controller.cores.of(NS)

    def record(self, task: str) -> TaskRecord:
        return self.controller.store.tasks[(NS, task)]

    def writing_status(self) -> set[tuple[str, str]]:
        """The workers whose status write is in flight."""
        return {k for k, w in self.controller.store.workers.items() if w.publish.writing}

    async def settle(self) -> None:
        await self.controller.settle()

    async def running(
        self, builder: TaskBuilder, *, worker: str = "w1", lease_seconds: int = 1000
    ) -> str:
        """A worker (capability ``llm``, its Lease of ``lease_seconds``) and the task,
        granted to it and renewed by its holder: returns the task's name."""
        self.worker(worker, "llm", lease_seconds=lease_seconds)
        name: str = self.task(builder)["metadata"]["name"]
        await self.settle()
        self.renew(name)
        await self.settle()
        return name

    async def steps(self, n: int, *, yields: int = 1) -> None:
        """``n`` steps without waiting for the writes in flight (``settle`` would wait
        for held ones); after each, the event loop runs ``yields`` times, giving the
        writes spawned their turns."""
        for _ in range(n):
            self.controller.step()
            for _ in range(yields):
                await asyncio.sleep(0)

    async def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)
        await self.settle()

    async def run_for(
        self, seconds: float, *, step: float = 0.5, renew: tuple[str, ...] = ()
    ) -> None:
        """Let time pass in steps, the named holders renewing (and their workers) as they go."""
        elapsed = 0.0
        while elapsed < seconds:
            self.clock.advance(step)
            elapsed += step
            for name in renew:
                if self.lease(name) is not None:
                    self.renew(name)
            for key in list(self.controller.store.workers):
                if self.kube.get("leases", NS, protocol.worker_lease_name(key[1])) is not None:
                    self.renew_worker(key[1])
            await self.settle()


def run(test: Any) -> Any:
    """Make an ``async def`` test a plain one (no plugin needed): ``@run``."""
    import asyncio
    import functools

    @functools.wraps(test)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return asyncio.run(test(*args, **kwargs))

    return wrapper
