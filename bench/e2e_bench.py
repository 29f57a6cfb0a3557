"""``make bench-e2e``: no-op tasks through real sidecars, against a plain client's ceiling.

On the embedded control plane, in ONE run (so the figures can be read against each
other even on a shared machine):

1. agentq: the operator (one replica) and K agent pods, each an ``agentq sidecar`` +
   ``agentq agent-sim`` pair of processes (agent-sim completes each task at once), K
   AgentWorkers of S slots; N no-op AgentTasks created at once by 8 clients (a
   backlog), then M more paced at half the measured rate (no backlog: the latency of
   an idle slot), then W tasks of 0.5-1.5 s of agent work created at once (the slots,
   not the machine, bound the rate). Measured: completed tasks/s in steady state (the
   first and last 10 % of completions left out); the latency of each step of a task's
   life, p50/p99, from a watch of tasks and Leases and agent-sim's own output, all on
   this process's clock; API requests per completed task by resource and verb (the API server's
   ``apiserver_request_total``, read before and after, less what the idle fleet makes
   in the same time); API server, etcd, controller-manager, operator, sidecar and
   agent-sim CPU per completed task (``/proc/<pid>/stat``, less the idle rate).
2. the ceiling: a plain aiohttp client, 32 tasks at a time, making exactly the writes
   of one no-op task's life in agentq (task create; status Assigned + its Event; Lease
   create; the first renewal; status Running + its Event; the report on the Lease;
   status Succeeded + its Event; Lease delete) as fast as it can, before and after the
   agentq run; and the same without the Running status and Event (the minimal life).
3. what each of those writes costs the API server alone (each kind for all tasks, one
   kind after the other), so agentq's API CPU per task can be split by request.

With ``--profile`` the operator and one sidecar are recorded by py-spy during the
backlog (``bench/out/``) and their hottest functions listed.

usage: python bench/e2e_bench.py [--tasks 400] [--agents 4] [--slots 8] [--profile]
       [--write-docs]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import dataclasses
import itertools
import json
import math
import os
import platform
import random
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import docsection  # noqa: E402
from e2e_common import (  # noqa: E402
    EVENTS,
    LEASES,
    ROOT,
    TASKS,
    Api,
    ApiCounters,
    Recorder,
    Rig,
    activity,
    agentq_writes,
    api_counters,
    bounded,
    cpu_seconds,
    create_tasks,
    fresh_workdir,
    next_grants,
    percentile,
    quiet,
    remove,
    steady_rate,
    task_body,
)

OUT = HERE / "out"
# The slot-bound backlog's tasks: agent-sim works a time drawn in this range on each (real
# agents' tasks take seconds, and vary), so the slots bound the rate, not the machine.
WORK_SECONDS = (0.5, 1.5)
DOCS = ROOT / "docs" / "benchmarks.md"
SECTION_START = "<!-- bench-e2e:start -->"
SECTION_END = "<!-- bench-e2e:end -->"
# The resources a task's life writes; the rest (the controller manager's bookkeeping,
# our own namespaces) is not counted per task.
LIFE_RESOURCES = (
    "agenttasks",
    "agenttasks/status",
    "agentworkers",
    "agentworkers/status",
    "leases",
    "events",
)


# -- the ceiling: a plain client making one task's writes -------------------------------


def stamp() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


@dataclass
class Life:
    """One task's objects as the plain client last wrote them."""

    name: str
    task: dict[str, Any] = field(default_factory=dict)
    lease: dict[str, Any] = field(default_factory=dict)
    token: int = 0


def _check(what: str, status: int, body: Any) -> Any:
    if status not in (200, 201):
        raise RuntimeError(f"{what}: HTTP {status}: {str(body)[:300]}")
    return body


def _event(ns: str, life: Life, reason: str, message: str) -> dict[str, Any]:
    now = stamp()
    meta = life.task["metadata"]
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{life.name}."},
        "involvedObject": {
            "apiVersion": "agentq.dev/v1alpha1",
            "kind": "AgentTask",
            "name": life.name,
            "namespace": ns,
            "uid": meta["uid"],
            "resourceVersion": meta["resourceVersion"],
        },
        "reason": reason,
        "message": message,
        "type": "Normal",
        "source": {"component": "agentq-operator"},
        "reportingComponent": "agentq-operator",
        "reportingInstance": "bench",
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }


def _condition(kind: str, reason: str, message: str, now: str) -> dict[str, Any]:
    return {
        "type": kind,
        "status": "True",
        "reason": reason,
        "message": message,
        "lastTransitionTime": now,
    }


class Steps:
    """The writes of one no-op task's life, as agentq makes them (bodies of the same
    shape and size as the operator's and the sidecar's)."""

    def __init__(self, api: Api, ns: str) -> None:
        self.api = api
        self.ns = ns
        self.tasks = TASKS.format(ns=ns)
        self.leases = LEASES.format(ns=ns)

    async def _status(self, life: Life, status: dict[str, Any], what: str) -> None:
        meta = life.task["metadata"]
        body = {"metadata": {"resourceVersion": meta["resourceVersion"]}, "status": status}
        life.task = _check(
            what,
            *await self.api.request(
                "PATCH",
                f"{self.tasks}/{life.name}/status",
                body,
                content_type="application/merge-patch+json",
            ),
        )

    async def create(self, life: Life) -> None:
        life.task = _check(
            "create", *await self.api.request("POST", self.tasks, task_body(life.name))
        )

    async def assign(self, life: Life) -> None:
        now = stamp()
        await self._status(
            life,
            {
                "phase": "Assigned",
                "worker": "w0",
                "attempt": 1,
                "reclaims": 0,
                "fencingToken": life.token,
                "leaseName": f"agentq-task-{life.name}",
                "assignedAt": now,
                "lastTransitionTime": now,
                "conditions": [_condition("Assigned", "Assigned", "assigned to w0", now)],
            },
            "assign",
        )

    async def lease(self, life: Life) -> None:
        meta = life.task["metadata"]
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {
                "name": f"agentq-task-{life.name}",
                "labels": {
                    "agentq.dev/lease": "task",
                    "agentq.dev/task": life.name,
                    "agentq.dev/worker": "w0",
                },
                "annotations": {
                    "agentq.dev/fencing-token": str(life.token),
                    "agentq.dev/attempt": "1",
                    "agentq.dev/task-uid": meta["uid"],
                },
                "ownerReferences": [
                    {
                        "apiVersion": "agentq.dev/v1alpha1",
                        "kind": "AgentTask",
                        "name": life.name,
                        "uid": meta["uid"],
                    }
                ],
            },
            "spec": {
                "holderIdentity": "w0",
                "leaseDurationSeconds": 30,
                "acquireTime": "2026-01-01T00:00:00.000000Z",
                "renewTime": "2026-01-01T00:00:00.000000Z",
            },
        }
        life.lease = _check("lease", *await self.api.request("POST", self.leases, body))

    async def _put_lease(self, life: Life, annotations: dict[str, str], what: str) -> None:
        body = json.loads(json.dumps(life.lease))
        body["metadata"].pop("managedFields", None)
        body["metadata"]["annotations"] = {**body["metadata"].get("annotations", {}), **annotations}
        body["spec"]["renewTime"] = time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime())
        life.lease = _check(
            what,
            *await self.api.request("PUT", f"{self.leases}/{body['metadata']['name']}", body),
        )

    async def renew(self, life: Life) -> None:
        await self._put_lease(life, {"agentq.dev/progress": "started"}, "renew")

    async def run(self, life: Life) -> None:
        now = stamp()
        await self._status(
            life, {"phase": "Running", "startedAt": now, "lastTransitionTime": now}, "run"
        )

    async def report(self, life: Life) -> None:
        report = json.dumps(
            {"outcome": "Succeeded", "result": {"by": "w0"}, "token": life.token, "worker": "w0"},
            separators=(",", ":"),
            sort_keys=True,
        )
        await self._put_lease(life, {"agentq.dev/report": report}, "report")

    async def succeed(self, life: Life) -> None:
        now = stamp()
        status = life.task.get("status") or {}
        await self._status(
            life,
            {
                "phase": "Succeeded",
                "result": {"by": "w0"},
                "resultRef": None,
                "error": None,
                "finishedAt": now,
                "lastTransitionTime": now,
                "graceUntil": None,
                "history": [
                    {
                        "outcome": "Succeeded",
                        "reason": "Completed",
                        "time": now,
                        "worker": "w0",
                        "token": life.token,
                        "attempt": 1,
                    }
                ],
                "conditions": [
                    *(status.get("conditions") or []),
                    _condition("Complete", "Succeeded", "the agent reported success", now),
                ],
            },
            "succeed",
        )

    async def delete_lease(self, life: Life) -> None:
        _check(
            "lease delete",
            *await self.api.request(
                "DELETE",
                f"{self.leases}/{life.lease['metadata']['name']}",
                {"preconditions": {"resourceVersion": life.lease["metadata"]["resourceVersion"]}},
            ),
        )

    def event(self, reason: str, message: str) -> Callable[[Life], Awaitable[None]]:
        async def write(life: Life) -> None:
            _check(
                f"event {reason}",
                *await self.api.request(
                    "POST", EVENTS.format(ns=self.ns), _event(self.ns, life, reason, message)
                ),
            )

        return write

    async def read(self, life: Life) -> None:
        """The sidecar's one read per attempt (not a write; measured for its cost)."""
        _check("read", *await self.api.request("GET", f"{self.tasks}/{life.name}"))

    def life(self, minimal: bool = False) -> list[tuple[str, Callable[[Life], Awaitable[None]]]]:
        """The writes of one task's life, in order."""
        steps: list[tuple[str, Callable[[Life], Awaitable[None]]]] = [
            ("agenttasks POST (create)", self.create),
            ("agenttasks/status PATCH (Assigned)", self.assign),
            ("leases POST (grant)", self.lease),
            ("events POST (Assigned)", self.event("Assigned", "attempt 1 assigned to worker w0")),
            ("leases PUT (first renewal)", self.renew),
            ("agenttasks/status PATCH (Running)", self.run),
            ("events POST (Running)", self.event("Running", "worker w0 started attempt 1")),
            ("leases PUT (report)", self.report),
            ("agenttasks/status PATCH (Succeeded)", self.succeed),
            ("events POST (Succeeded)", self.event("Succeeded", "worker w0 completed attempt 1")),
            ("leases DELETE", self.delete_lease),
        ]
        if minimal:
            steps = [s for s in steps if "Running" not in s[0]]
        return steps


@dataclass
class Ceiling:
    name: str
    tasks: int
    seconds: float
    writes_per_task: int
    cpu_ms: dict[str, float]  # per task, net of the control plane's idle rate

    @property
    def tasks_per_s(self) -> float:
        return self.tasks / self.seconds


async def ceiling(
    rig: Rig, count: int, concurrency: int, idle: dict[str, float], *, minimal: bool = False
) -> Ceiling:
    """``count`` task lives by a plain client, ``concurrency`` tasks at a time."""
    await quiet(rig.api, activity, limit=60.0)
    ns = await rig.namespace("ceiling")
    try:
        steps = Steps(rig.api, ns)
        life = steps.life(minimal)
        lives = [Life(f"t{i:05d}", token=1000 + i) for i in range(count)]

        async def one(x: Life) -> None:
            for _, step in life:
                await step(x)

        read = lambda: {**rig.control_plane_cpu(), "benchmark": cpu_seconds(os.getpid())}  # noqa: E731
        cpu0 = read()
        started = time.monotonic()
        await bounded([lambda x=x: one(x) for x in lives], concurrency)  # type: ignore[misc]
        took = time.monotonic() - started
        cpu = net_cpu(read(), cpu0, idle, took)
        name = "plain client, minimal life" if minimal else "plain client, agentq's writes"
        return Ceiling(name, count, took, len(life), {k: 1000 * v / count for k, v in cpu.items()})
    finally:
        # Left in place (the control plane is thrown away at the end): deleting it now
        # would load the API server and the garbage collector during what follows.
        pass


async def costs_by_kind(
    rig: Rig, count: int, concurrency: int, idle: dict[str, float]
) -> list[tuple[str, float, dict[str, float]]]:
    """Each write of a task's life for ``count`` tasks, one kind after the other: (kind,
    requests/s, CPU ms per request by process), net of the idle rate."""
    await quiet(rig.api, activity, limit=60.0)
    ns = await rig.namespace("costs")
    try:
        steps = Steps(rig.api, ns)
        lives = [Life(f"t{i:05d}", token=1000 + i) for i in range(count)]
        rows = []
        plan = steps.life()
        plan.insert(5, ("agenttasks GET (the sidecar's read)", steps.read))
        for kind, step in plan:
            cpu0 = rig.control_plane_cpu()
            started = time.monotonic()
            await bounded([lambda x=x, s=step: s(x) for x in lives], concurrency)  # type: ignore[misc]
            took = time.monotonic() - started
            cpu = net_cpu(rig.control_plane_cpu(), cpu0, idle, took)
            rows.append((kind, count / took, {k: 1000 * v / count for k, v in cpu.items()}))
            print(f"   {kind}: {count / took:.0f}/s {rows[-1][2]}", flush=True)
        # What a client polling the whole namespace costs (bench/vs_celery.py waits so).
        lists = 20
        cpu0 = rig.control_plane_cpu()
        started = time.monotonic()
        for _ in range(lists):
            _check("list", *await rig.api.request("GET", steps.tasks, ok=(200,)))
        took = time.monotonic() - started
        cpu = net_cpu(rig.control_plane_cpu(), cpu0, idle, took)
        rows.append(
            (
                f"agenttasks LIST of all {count} (a client polling the namespace)",
                lists / took,
                {k: 1000 * v / lists for k, v in cpu.items()},
            )
        )
        return rows
    finally:
        pass


def net_cpu(
    after: dict[str, float], before: dict[str, float], idle: dict[str, float], seconds: float
) -> dict[str, float]:
    """CPU seconds used between two readings, less the idle rate over ``seconds``."""
    return {k: after[k] - before[k] - idle.get(k, 0.0) * seconds for k in after}


async def idle_rates(read: Callable[[], dict[str, float]], seconds: float) -> dict[str, float]:
    """CPU seconds per second of each process while nothing is asked of it."""
    before = read()
    started = time.monotonic()
    await asyncio.sleep(seconds)
    took = time.monotonic() - started
    after = read()
    return {k: max(0.0, (after[k] - before[k]) / took) for k in after}


# -- agentq ------------------------------------------------------------------------------


def py_spy(pid: int, out: Path) -> subprocess.Popen[bytes] | None:
    exe = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(exe).exists():
        print("py-spy not installed; no profile", flush=True)
        return None
    return subprocess.Popen(
        [
            exe,
            "record",
            "--pid",
            str(pid),
            "--format",
            "raw",
            "--rate",
            "100",
            "--duration",
            "900",
            "--output",
            str(out),
            "--nonblocking",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def stop_spy(spy: subprocess.Popen[bytes] | None) -> None:
    if spy is not None and spy.poll() is None:
        spy.send_signal(signal.SIGINT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            spy.wait(timeout=60)


@dataclass
class Phase:
    """One batch of tasks through agentq and what it cost."""

    name: str
    names: list[str]
    seconds: float = 0.0
    rate: float = math.nan  # completed tasks/s in steady state
    steady_tasks: int = 0
    completed: int = 0
    requests: dict[tuple[str, str], float] = field(default_factory=dict)  # per task
    latency_ms: dict[tuple[str, str], float] = field(default_factory=dict)  # per task
    watch_events: dict[str, float] = field(default_factory=dict)  # per task
    flows: dict[str, float] = field(default_factory=dict)  # requests per task by flow schema
    sidecar_requests: dict[str, float] = field(default_factory=dict)  # per task, their count
    raw: dict[str, int] = field(default_factory=dict)  # the API server's counts, by code
    cpu_ms: dict[str, float] = field(default_factory=dict)  # per task
    steps: dict[str, tuple[float, float, int]] = field(default_factory=dict)  # p50, p99 ms, n
    errors: list[str] = field(default_factory=list)
    # Task -> the seconds agent-sim works on it (its payload's ``workSeconds``); none: no-op.
    work: dict[str, float] = field(default_factory=dict)
    paced: bool = False  # created at a set rate (no backlog): no tasks/s of its own


def latencies(phase: Phase, rec: Recorder, backlog: bool) -> None:
    tasks = [rec.tasks[n] for n in phase.names]

    def spans(a: str, b: str) -> list[float]:
        out = []
        for t in tasks:
            x, y = getattr(t, a), getattr(t, b)
            if x is not None and y is not None:
                out.append(y - x)
        return out

    rows = {
        "create -> granted": spans("created", "granted"),
        "granted -> the agent sees it": spans("granted", "seen"),
        "the agent sees it -> its report on the Lease": spans("seen", "report"),
        "report on the Lease -> committed (Succeeded)": spans("report", "committed"),
        "create -> the agent sees it": spans("created", "seen"),
        "create -> committed": spans("created", "committed"),
    }
    if backlog:
        created = sorted(t.created for t in tasks if t.created is not None)
        granted = sorted(t.granted for t in tasks if t.granted is not None)

        def pending_at(when: float) -> int:
            import bisect

            return bisect.bisect_right(created, when) - bisect.bisect_right(granted, when)

        done = [t for t in tasks if t.committed is not None]
        names = set(phase.names)
        grants = [(g, w) for g, w, n in rec.grants if n in names]
        nexts = next_grants([(t.committed, t.worker) for t in done], grants, pending_at)  # type: ignore[misc]
        rows["committed -> the slot's next grant"] = [
            g - t.committed
            for t, g in zip(done, nexts, strict=True)
            if g is not None  # type: ignore[operator]
        ]
        rows["report on the Lease -> the slot's next grant"] = [
            g - t.report
            for t, g in zip(done, nexts, strict=True)
            if g is not None and t.report is not None
        ]
    for label, values in rows.items():
        phase.steps[label] = (
            1000 * percentile(values, 50),
            1000 * percentile(values, 99),
            len(values),
        )


async def wait_done(rec: Recorder, names: list[str], rig: Rig, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        done = sum(1 for n in names if rec.tasks[n].finished is not None)
        if done >= len(names):
            return
        for proc in rig.procs:
            if not proc.alive():
                raise RuntimeError(f"{proc.name} exited: see {proc.log}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {done} of {len(names)} tasks finished in {timeout} s")
        await asyncio.sleep(0.2)


def per_task(
    delta: ApiCounters, background: ApiCounters, idle_seconds: float, seconds: float, n: int
) -> tuple[
    dict[tuple[str, str], float], dict[tuple[str, str], float], dict[str, float], dict[str, float]
]:
    """Requests, request latency, watch events and requests by flow schema per task, less
    the idle fleet's share."""
    scale = seconds / idle_seconds

    def net(a: collections.Counter[Any], b: collections.Counter[Any]) -> dict[Any, float]:
        out = {}
        for k, v in a.items():
            value = (v - b.get(k, 0) * scale) / n
            if abs(value) >= 0.0005:
                out[k] = value
        return out

    requests = net(
        collections.Counter({k: v for k, v in delta.requests.items() if k[0] in LIFE_RESOURCES}),
        background.requests,
    )
    latency = net(
        collections.Counter({k: v for k, v in delta.latency.items() if k[0] in LIFE_RESOURCES}),
        background.latency,
    )
    return (
        requests,
        latency,
        net(delta.watch_events, background.watch_events),
        net(delta.flows, background.flows),
    )


async def measure_phase(
    rig: Rig,
    rec: Recorder,
    ns: str,
    phase: Phase,
    *,
    background: tuple[ApiCounters, float, dict[str, float]],
    rate: float | None,
    profile: bool,
) -> None:
    fleet_idle_requests, idle_seconds, idle_cpu = background
    spies: list[tuple[str, subprocess.Popen[bytes] | None, Path]] = []
    if profile:
        OUT.mkdir(exist_ok=True)
        assert rig.operator is not None
        for label, pid in (("operator", rig.operator.pid), ("sidecar", rig.pairs[0].sidecar.pid)):
            path = OUT / f"e2e-{label}.txt"
            path.unlink(missing_ok=True)
            spies.append((label, py_spy(pid, path), path))
        await asyncio.sleep(1.0)  # py-spy attaches
    s0 = await sidecar_requests(rig)
    c0 = await api_counters(rig.api)
    cpu0 = {**rig.control_plane_cpu(), **rig.agentq_cpu()}
    started = time.monotonic()
    refused = await create_tasks(
        rig.api, ns, phase.names, rec, concurrency=8, rate=rate, work=phase.work
    )
    if refused:
        phase.errors.append(f"{refused} creates refused")
    await wait_done(rec, phase.names, rig, timeout=max(300.0, 2.0 * len(phase.names)))
    for _, spy, _ in spies:
        stop_spy(spy)
    # The Lease deletes and Events of the last tasks are written after they commit.
    await quiet(rig.api, agentq_writes, limit=60.0)
    took = time.monotonic() - started
    c1 = await api_counters(rig.api)
    cpu1 = {**rig.control_plane_cpu(), **rig.agentq_cpu()}
    s1 = await sidecar_requests(rig)
    n = len(phase.names)
    phase.sidecar_requests = {k: (v - s0.get(k, 0)) / n for k, v in s1.items() if v - s0.get(k, 0)}
    phase.seconds = took
    phase.raw = {" ".join(k): v for k, v in c1.minus(c0).codes.items() if k[0] in LIFE_RESOURCES}
    phase.completed = sum(1 for x in phase.names if rec.tasks[x].phase == "Succeeded")
    phase.rate, phase.steady_tasks = steady_rate(
        [rec.tasks[x].committed for x in phase.names if rec.tasks[x].committed is not None]  # type: ignore[misc]
    )
    phase.requests, phase.latency_ms, phase.watch_events, phase.flows = per_task(
        c1.minus(c0), fleet_idle_requests, idle_seconds, took, n
    )
    phase.latency_ms = {k: 1000 * v for k, v in phase.latency_ms.items()}
    cpu = net_cpu(cpu1, cpu0, idle_cpu, took)
    phase.cpu_ms = {k: 1000 * v / n for k, v in cpu.items()}
    latencies(phase, rec, backlog=rate is None)
    twice = [x for x in phase.names if rec.tasks[x].successes > 1]
    if twice:
        phase.errors.append(f"{len(twice)} tasks committed twice, e.g. {twice[0]}")
    for label, _, path in spies:
        if path.exists():
            profiles[label] = summarize_profile(path)
        else:
            phase.errors.append(f"no profile of the {label}")


profiles: dict[str, dict[str, list[tuple[str, float]]]] = {}


async def sidecar_requests(rig: Rig) -> collections.Counter[str]:
    """The sidecars' own count of their API requests, summed."""
    total: collections.Counter[str] = collections.Counter()
    for pair in rig.pairs:
        total.update(await pair.api_requests(rig.api.session))
    return total


async def agentq_run(
    rig: Rig, args: argparse.Namespace
) -> tuple[list[Phase], dict[str, Any], dict[str, Any]]:
    ns = await rig.namespace("e2e")
    workers = await rig.create_workers(ns, args.agents, args.slots)
    rec = Recorder(rig.api, ns)
    await rec.start()
    rig.start_operator(ns)
    rig.start_agents(
        ns, workers, rec.on_agent_line, work_seconds=getattr(args, "work_seconds", 0.0)
    )
    await rig.wait_workers_ready(ns, len(workers))
    await asyncio.sleep(3.0)  # the sidecars' first watches and polls settle
    await quiet(rig.api, activity, limit=60.0)
    # What the idle fleet costs (worker Lease renewals, leader election, polls): taken
    # out of the per-task figures.
    read = lambda: {**rig.control_plane_cpu(), **rig.agentq_cpu()}  # noqa: E731
    # What starting and registering cost, before any task (not counted per task).
    startup = {k: v for k, v in rig.agentq_cpu().items() if k != "benchmark"}
    a0 = await api_counters(rig.api)
    idle_cpu = await idle_rates(read, args.idle_seconds)
    a1 = await api_counters(rig.api)
    background = (a1.minus(a0), args.idle_seconds, idle_cpu)
    backlog = Phase(
        f"backlog: {args.tasks} tasks created at once", [f"b{i:05d}" for i in range(args.tasks)]
    )
    print(f"== agentq {backlog.name}", flush=True)
    await measure_phase(
        rig, rec, ns, backlog, background=background, rate=None, profile=args.profile
    )
    print(f"   {backlog.rate:.1f} tasks/s; {backlog.steps}", flush=True)
    phases = [backlog]
    if args.paced:
        rate = args.paced_rate or max(1.0, round(backlog.rate / 2, 1))
        paced = Phase(
            f"paced: {args.paced} tasks at {rate:g}/s",
            [f"p{i:05d}" for i in range(args.paced)],
            paced=True,
        )
        print(f"== agentq {paced.name}", flush=True)
        await measure_phase(rig, rec, ns, paced, background=background, rate=rate, profile=False)
        print(f"   {paced.steps}", flush=True)
        phases.append(paced)
    if getattr(args, "work_tasks", 0):
        low, high = WORK_SECONDS
        rng = random.Random(18)
        work = Phase(
            f"slot-bound: {args.work_tasks} tasks of {low:g}-{high:g} s of work created at once",
            [f"w{i:05d}" for i in range(args.work_tasks)],
        )
        work.work = {n: round(rng.uniform(low, high), 3) for n in work.names}
        print(f"== agentq {work.name}", flush=True)
        await measure_phase(rig, rec, ns, work, background=background, rate=None, profile=False)
        print(f"   {work.rate:.1f} tasks/s; {work.steps}", flush=True)
        phases.append(work)
    sample = await sample_objects(rig.api, ns, backlog.names[len(backlog.names) // 2])
    await rec.stop()
    zero = min(t.created for t in rec.tasks.values() if t.created is not None)
    sample["times"] = {
        name: {
            k: (round(v - zero, 4) if isinstance(v, float) else v)
            for k, v in dataclasses.asdict(t).items()
        }
        for name, t in rec.tasks.items()
    }
    sample["grants"] = [(round(t - zero, 4), w, n) for t, w, n in rec.grants]
    sample["zero"] = zero  # time.monotonic() of the first create (the stamps above are after it)
    idle = {
        "fleet_requests_per_s": {
            f"{r} {v}": c / args.idle_seconds for (r, v), c in background[0].requests.items()
        },
        "fleet_cpu_per_s": idle_cpu,
        "startup_cpu_s": startup,
        "watch_errors": rec.errors,
    }
    for proc in reversed(rig.procs):
        proc.stop()
    rig.procs.clear()
    rig.pairs.clear()
    rig.operator = None
    await quiet(rig.api, activity, limit=60.0)
    return phases, idle, sample


async def sample_objects(api: Api, ns: str, name: str) -> dict[str, Any]:
    """One finished task and its Events, to check the ceiling's bodies against."""
    _, task = await api.request("GET", TASKS.format(ns=ns) + f"/{name}")
    _, events = await api.request(
        "GET", EVENTS.format(ns=ns) + f"?fieldSelector=involvedObject.name%3D{name}"
    )
    return {
        "task_bytes": len(json.dumps(task)),
        "status": (task or {}).get("status"),
        "events": [e.get("reason") for e in (events or {}).get("items") or []],
    }


# -- profiles ----------------------------------------------------------------------------


# The frames a coroutine step runs under: skipped to name what the step is doing.
_WRAPPERS = (
    "Task.__step",
    "Task.__wakeup",
    "_run_coroutine",
    "RequestHandler.start",
    "RequestHandler._handle_request",
    "Application._handle",
    "_fix_request_current_app",
    "middleware",
    "AgentApi._errors",
    "HeardKube._timed",
)
_LEAF_KINDS = (
    ("json encoding and decoding", ("json/",)),
    ("TLS", ("ssl.py", "asyncio/sslproto")),
    ("aiohttp (HTTP client and server)", ("aiohttp/", "yarl/", "multidict/")),
    ("asyncio and sockets", ("asyncio/", "selectors", "socket.py")),
    ("pydantic", ("pydantic",)),
    ("logging", ("logging/", "agentq/jsonlog")),
    ("prometheus_client", ("prometheus_client/",)),
    ("agentq's own code", ("agentq/",)),
)


def summarize_profile(raw: Path, limit: int = 10) -> dict[str, list[tuple[str, float]]]:
    """A py-spy raw (collapsed) profile, idle samples (waiting in epoll) left out: what
    the busy samples were doing -- the coroutine step that ran (the first frame under
    the event loop's ``Handle._run`` that is not a wrapper), the kind of code at the
    top of the stack, and the hottest functions (exclusive)."""
    activity: collections.Counter[str] = collections.Counter()
    leaf_kind: collections.Counter[str] = collections.Counter()
    exclusive: collections.Counter[str] = collections.Counter()
    busy = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = [frame_name(f) for f in stack.split(";")]
        frames = [f for f in frames if f]  # a thread's label comes first in raw output
        if not frames or frames[-1].split(" (")[0] in ("select", "EpollSelector.select"):
            continue
        n = int(count)
        busy += n
        runs = [i for i, f in enumerate(frames) if f.startswith("Handle._run (")]
        at = runs[-1] + 1 if runs else 0
        while at < len(frames) - 1 and frames[at].split(" (")[0].startswith(_WRAPPERS):
            at += 1
        activity[frames[min(at, len(frames) - 1)]] += n
        where = frames[-1].partition(" (")[2]
        kind = next((k for k, marks in _LEAF_KINDS if any(m in where for m in marks)), "other")
        leaf_kind[kind] += n
        exclusive[frames[-1]] += n

    def share(c: collections.Counter[str]) -> list[tuple[str, float]]:
        return [(k, 100 * v / max(1, busy)) for k, v in c.most_common(limit)]

    return {
        "activity": share(activity),
        "leaf": share(leaf_kind),
        "functions": share(exclusive),
        "samples": [("busy", float(busy))],
    }


def frame_name(frame: str) -> str:
    """``func (path/to/module.py:line)`` -> ``func (module path)``; '' for a thread label."""
    if " (" not in frame:
        return ""
    func, _, where = frame.partition(" (")
    path = where.rstrip(")").rsplit(":", 1)[0]
    for cut in ("site-packages/", "/operator/agentq/", "/lib/python3.11/"):
        if cut in path:
            path = path.split(cut, 1)[1]
            if cut == "/operator/agentq/":
                path = "agentq/" + path
            break
    return f"{func} ({path})"


# -- report ------------------------------------------------------------------------------


def fmt(value: Any, digits: int = 1) -> str:
    if isinstance(value, float):
        if math.isnan(value):
            return "-"
        return f"{value:,.{digits}f}"
    return f"{value:,}" if isinstance(value, int) else str(value)


def render(result: dict[str, Any], command: str, started: float) -> str:
    phases: list[Phase] = result["phases"]
    backlog = phases[0]
    full: Ceiling = result["ceiling"]
    minimal: Ceiling | None = result.get("minimal")
    api_cpu = backlog.cpu_ms.get("kube-apiserver", math.nan)
    slot_bound = [ph for ph in phases if ph.work]
    lines = [
        SECTION_START,
        "## No-op tasks through real sidecars (`make bench-e2e`)",
        "",
        "<!-- Generated by bench/e2e_bench.py; edit that script, not this section. -->",
        "",
        f"Embedded control plane on this machine; the operator (one replica) and "
        f"{result['agents']} agent pods, each an `agentq sidecar` + `agentq agent-sim` pair of "
        f"processes (agent-sim completes each task at once), {result['agents']} AgentWorkers "
        f"of {result['slots']} slots. The backlog: {len(backlog.names)} no-op tasks created at "
        "once by 8 clients; throughput is counted between the first and the last 10 % of "
        "completions."
        + (
            f" The slot-bound backlog: {len(slot_bound[0].names)} tasks on each of which "
            f"agent-sim works {WORK_SECONDS[0]:g}-{WORK_SECONDS[1]:g} s (its payload's "
            "`workSeconds`, drawn uniformly, seeded), created at once: the slots, not the "
            "machine's cores, bound the rate, as with real agents' tasks."
            if slot_bound
            else ""
        )
        + " The ceiling: a plain aiohttp client, 32 tasks at a time, making exactly "
        "the writes of one task's life in agentq, in the same run (before and after agentq; "
        "the minimal life, without the Running status and Event, right after the first). "
        "CPU and requests per task are net of what the idle fleet (or the idle control "
        "plane, for the ceiling) uses in the same time. All figures of one run.",
        "",
        "| | tasks/s | API server CPU ms / task | etcd CPU ms / task | controller manager "
        "CPU ms / task | operator CPU ms / task | sidecar CPU ms / task | agent-sim CPU ms / "
        "task | this benchmark's process, CPU ms / task |",
        "|---|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for ph in phases:
        c = ph.cpu_ms
        lines.append(
            f"| agentq, {ph.name} | {fmt(math.nan if ph.paced else ph.rate)} | "
            f"{fmt(c.get('kube-apiserver', math.nan))} | {fmt(c.get('etcd', math.nan))} | "
            f"{fmt(c.get('kube-controller-manager', math.nan))} | "
            f"{fmt(c.get('operator', math.nan))} | {fmt(c.get('sidecars', math.nan))} | "
            f"{fmt(c.get('agent-sims', math.nan))} | {fmt(c.get('benchmark', math.nan))} |"
        )
    for ceil in [full, minimal, *result.get("ceilings_more", [])]:
        if ceil is None:
            continue
        lines.append(
            f"| {ceil.name} ({ceil.writes_per_task} writes) | {fmt(ceil.tasks_per_s)} | "
            f"{fmt(ceil.cpu_ms['kube-apiserver'])} | {fmt(ceil.cpu_ms['etcd'])} | "
            f"{fmt(ceil.cpu_ms['kube-controller-manager'])} | - | - | - | "
            f"{fmt(ceil.cpu_ms.get('benchmark', math.nan))} |"
        )
    rounds = result.get("rounds") or []
    if len(rounds) > 1:
        ratios = [a / ((b + c) / 2) for a, b, c in rounds]
        lines += [
            "",
            f"{len(rounds)} rounds (each a backlog between two ceiling runs; the rows above are "
            "the first): agentq tasks/s against the mean of its two neighbours: "
            + "; ".join(
                f"{fmt(a)} vs {fmt(b)} / {fmt(c)} ({fmt(100 * x, 0)} %)"
                for (a, b, c), x in zip(rounds, ratios, strict=True)
            )
            + f"; median **{fmt(100 * statistics.median(ratios), 0)} %**.",
        ]
    for ph in phases:
        lines += [f"\n**{ph.name}: {e}**" for e in ph.errors]
        if ph.completed != len(ph.names):
            lines.append(f"\n**{ph.name}: {ph.completed} of {len(ph.names)} Succeeded**")
    startup = result["fleet_idle"]["startup_cpu_s"]
    lines += [
        "",
        f"Starting up and registering (before the first task, not counted above) took "
        f"{fmt(startup['operator'], 1)} CPU-s in the operator, {fmt(startup['sidecars'], 1)} "
        f"in the {result['agents']} sidecars and {fmt(startup['agent-sims'], 1)} in the "
        "agent-sims.",
    ]
    lines += [
        "",
        f"**agentq / ceiling**: throughput {fmt(100 * backlog.rate / full.tasks_per_s, 0)} % "
        f"of the plain client making the same writes"
        + (
            f" ({fmt(100 * backlog.rate / minimal.tasks_per_s, 0)} % of the minimal life)"
            if minimal
            else ""
        )
        + f"; API server CPU per task {fmt(api_cpu / full.cpu_ms['kube-apiserver'], 2)}x"
        + (
            f" ({fmt(api_cpu / minimal.cpu_ms['kube-apiserver'], 2)}x the minimal life)"
            if minimal
            else ""
        )
        + ". The ceiling ran twice (before and after agentq): "
        + ", ".join(f"{fmt(c.tasks_per_s)} tasks/s" for c in result["ceiling_runs"])
        + "; the two runs are taken together.",
        "",
        "Latency of each step of a task's life (ms; from a watch of tasks and Leases and "
        "agent-sim's output, on one clock; granted = the first of the status naming the "
        "worker and the Lease):",
        "",
        "| step | " + " | ".join(f"{ph.name}: p50 | p99" for ph in phases) + " |",
        "|---|" + "--:|--:|" * len(phases),
    ]
    labels = list(dict.fromkeys(k for ph in phases for k in ph.steps))
    for label in labels:
        cells = []
        for ph in phases:
            p50, p99, _ = ph.steps.get(label, (math.nan, math.nan, 0))
            cells += [fmt(p50, 0), fmt(p99, 0)]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    keys = sorted(
        backlog.requests, key=lambda k: (k[1] not in ("POST", "PUT", "PATCH", "DELETE"), k)
    )
    lines += [
        "",
        "API requests per completed task (backlog), by resource and verb, from the API "
        "server's `apiserver_request_total`, and the API server's time answering them "
        "(`apiserver_request_duration_seconds_sum`, ms per task; wall time, not CPU):",
        "",
        "| resource | verb | requests / task | answer time ms / task |",
        "|---|---|--:|--:|",
    ]
    writes = 0.0
    for key in keys:
        count = backlog.requests[key]
        if key[1] in ("POST", "PUT", "PATCH", "DELETE"):
            writes += count
        answer = backlog.latency_ms.get(key, 0.0)
        lines.append(f"| {key[0]} | {key[1]} | {fmt(count, 3)} | {fmt(answer, 2)} |")
    lines += [
        f"| **writes** | | **{fmt(writes, 2)}** | |",
        "",
        "The sidecars' own count of their API requests per task: "
        + ", ".join(f"{k} {fmt(v, 3)}" for k, v in sorted(backlog.sidecar_requests.items()))
        + "; the API server's requests per task by flow schema (who asked; `exempt` is the "
        "admin credentials agentq and this benchmark use): "
        + ", ".join(f"{k} {fmt(v, 2)}" for k, v in sorted(backlog.flows.items()))
        + ".",
        "",
        "Watch events sent per task, by resource (every watcher counts): "
        + ", ".join(
            f"{k} {fmt(v, 1)}" for k, v in sorted(backlog.watch_events.items()) if abs(v) >= 0.05
        )
        + ".",
    ]
    kinds = result.get("costs") or []
    if kinds:
        lines += [
            "",
            "What each request of a task's life costs the API server, measured alone (the "
            f"plain client, {result['cost_tasks']} of each, 32 at a time, one kind after the "
            "other), and that cost times agentq's count per task:",
            "",
            "| request | per second | API server CPU ms | etcd CPU ms |",
            "|---|--:|--:|--:|",
        ]
        total = 0.0
        for kind, per_s, cpu in kinds:
            total += cpu["kube-apiserver"] if "GET" not in kind and "LIST" not in kind else 0.0
            lines.append(
                f"| {kind} | {fmt(per_s, 0)} | {fmt(cpu['kube-apiserver'], 2)} | "
                f"{fmt(cpu['etcd'], 2)} |"
            )
        lines += [
            f"| **the writes of one life, summed** | | **{fmt(total, 1)}** | |",
        ]
    if result.get("findings"):
        lines += ["", "### Where the time goes", "", *result["findings"]]
    for label, prof in profiles.items():
        busy = int(prof["samples"][0][1])
        lines += [
            "",
            f"py-spy, the {label} during the backlog ({fmt(busy)} busy samples at 100 Hz; "
            f"raw profile in `bench/out/e2e-{label}.txt`, not committed). By what the event "
            "loop was running (the coroutine step), by the kind of code on top of the "
            "stack, and the hottest functions:",
            "",
            "| step running | % | code on top | % | function | % |",
            "|---|--:|---|--:|---|--:|",
        ]
        rows = itertools.zip_longest(prof["activity"], prof["leaf"], prof["functions"])
        for a, k, f in rows:
            cells = [(f"`{x[0]}`", f"{x[1]:.1f}") if x else ("", "") for x in (a, k, f)]
            lines.append("| " + " | ".join(c for pair in cells for c in pair) + " |")
    load = result["load"]
    lines += [
        "",
        "Measured with:",
        "",
        "```",
        command,
        "```",
        "",
        f"- machine: {platform.machine()}, {os.cpu_count()} CPUs, "
        f"{platform.system()} {platform.release()}; Python {platform.python_version()}",
        f"- load average (1, 5, 15 min) at the start: {loadavg(load[0])}; at the end: "
        f"{loadavg(load[1])}"
        + (" (other work was running on the machine)" if max(load[0][0], load[1][0]) > 1.5 else ""),
        f"- whole benchmark: {time.monotonic() - started:.0f} s",
        SECTION_END,
    ]
    return "\n".join(lines) + "\n"


def loadavg(load: tuple[float, ...]) -> str:
    return ", ".join(f"{x:.2f}" for x in load)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    workdir = fresh_workdir("agentq-bench-e2e-")
    rig = Rig(workdir, log_level=args.log_level, src=args.src)
    result: dict[str, Any] = {"agents": args.agents, "slots": args.slots}
    load0 = os.getloadavg()
    try:
        rig.up()
        await quiet(rig.api, activity, limit=60.0)
        idle = await idle_rates(rig.control_plane_cpu, args.idle_seconds)
        result["control_plane_idle"] = idle
        runs = []
        print("== warm-up (the API server's first requests of each kind are slow)", flush=True)
        await ceiling(rig, min(100, args.ceiling_tasks), args.concurrency, idle)
        print("== ceiling (before)", flush=True)
        runs.append(await ceiling(rig, args.ceiling_tasks, args.concurrency, idle))
        print(f"   {runs[-1]}", flush=True)
        # Next to a run of the full life, so the two compare under the same load.
        print("== ceiling, minimal life", flush=True)
        result["minimal"] = await ceiling(
            rig, args.ceiling_tasks, args.concurrency, idle, minimal=True
        )
        print(f"   {result['minimal']}", flush=True)
        phases, fleet_idle, sample = await agentq_run(rig, args)
        result["phases"] = phases
        result["fleet_idle"] = fleet_idle
        result["sample"] = sample
        print("== ceiling (after)", flush=True)
        runs.append(await ceiling(rig, args.ceiling_tasks, args.concurrency, idle))
        print(f"   {runs[-1]}", flush=True)
        rounds = [(phases[0].rate, runs[0].tasks_per_s, runs[1].tasks_per_s)]
        for r in range(2, args.rounds + 1):
            # More rounds, each a backlog between two ceiling runs: on a shared machine the
            # load moves, and the ratio of neighbours is steadier than one figure.
            print(f"== round {r}", flush=True)
            again = argparse.Namespace(
                **{**vars(args), "paced": 0, "work_tasks": 0, "profile": False}
            )
            more, _, _ = await agentq_run(rig, again)
            runs.append(await ceiling(rig, args.ceiling_tasks, args.concurrency, idle))
            rounds.append((more[0].rate, runs[-2].tasks_per_s, runs[-1].tasks_per_s))
            print(f"   {rounds[-1]}", flush=True)
        result["rounds"] = rounds
        runs = runs[:2]
        result["ceiling_runs"] = runs
        result["ceiling"] = Ceiling(
            runs[0].name,
            sum(r.tasks for r in runs),
            sum(r.seconds for r in runs),
            runs[0].writes_per_task,
            {k: sum(r.cpu_ms[k] for r in runs) / len(runs) for k in runs[0].cpu_ms},
        )
        if not args.no_costs:
            print("== each request alone", flush=True)
            result["cost_tasks"] = args.ceiling_tasks
            result["costs"] = await costs_by_kind(rig, args.ceiling_tasks, args.concurrency, idle)
    finally:
        await rig.down()
        if args.keep:
            print(f"logs kept in {workdir}", flush=True)
        else:
            remove(workdir)
    result["load"] = (load0, os.getloadavg())
    return result


def plain(value: Any) -> Any:
    """``value`` as JSON can hold it (tuple keys joined with a space)."""
    if hasattr(value, "__dataclass_fields__"):
        value = value.__dict__
    if isinstance(value, dict):
        return {(" ".join(k) if isinstance(k, tuple) else k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=400, help="the backlog's tasks (N)")
    parser.add_argument("--agents", type=int, default=4, help="agent pods (K)")
    parser.add_argument("--slots", type=int, default=8, help="slots (maxInFlight) per agent")
    parser.add_argument("--paced", type=int, default=100, help="tasks paced after the backlog")
    parser.add_argument(
        "--paced-rate", type=float, default=0.0, help="their rate (default: half the backlog's)"
    )
    parser.add_argument(
        "--work-tasks",
        type=int,
        default=400,
        help="tasks of {:g}-{:g} s of agent work after the paced ones (the slots, not "
        "the machine, bound the rate; 0: none)".format(*WORK_SECONDS),
    )
    parser.add_argument(
        "--rounds", type=int, default=1, help="backlogs, each between two ceiling runs"
    )
    parser.add_argument("--ceiling-tasks", type=int, default=400, help="task lives per ceiling run")
    parser.add_argument(
        "--concurrency", type=int, default=32, help="the plain client's tasks at once"
    )
    parser.add_argument("--idle-seconds", type=float, default=5.0, help="idle window for baselines")
    parser.add_argument(
        "--log-level", help="of the operator and the sidecars (default: theirs, INFO)"
    )
    parser.add_argument(
        "--src",
        type=Path,
        help="run agentq from another source tree (e.g. git archive REV | tar -x -C DIR)",
    )
    parser.add_argument("--profile", action="store_true", help="py-spy the operator and a sidecar")
    parser.add_argument("--no-costs", action="store_true", help="skip each request's cost alone")
    parser.add_argument("--write-docs", action="store_true", help="update docs/benchmarks.md")
    parser.add_argument("--json", type=Path, help="also write the raw figures here")
    parser.add_argument("--keep", action="store_true", help="keep the logs")
    args = parser.parse_args()
    started = time.monotonic()
    result = asyncio.run(run(args))
    command = "python bench/e2e_bench.py " + " ".join(sys.argv[1:])
    if args.json:
        args.json.write_text(json.dumps(plain({**result, "profiles": profiles}), indent=1))
    section = render(result, command, started)
    print(section)
    if args.write_docs:
        docsection.write_section(DOCS, SECTION_START, SECTION_END, section)


if __name__ == "__main__":
    main()
