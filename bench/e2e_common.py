"""What ``make bench-e2e`` and ``make soak`` share: the embedded control plane with the
operator and real agent pods (an ``agentq sidecar`` + ``agentq agent-sim`` pair of
processes each, as in the demo), a recorder that watches tasks and Leases and stamps
every step of each task's life on one clock, and process accounting.

All times are this process's ``time.monotonic()``: the watches and the readers of
agent-sim's output run here, so every stamp of a task is taken on the same clock and
at the same distance from the API server.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import ctypes
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

import aiohttp  # noqa: E402
from load_common import LEASES, TASKS, WORKERS, Api, bounded, connect  # noqa: E402

from agentq import agentsim  # noqa: E402
from agentq.controlplane import Cluster  # noqa: E402
from agentq.controlplane.cluster import ClusterState, free_port  # noqa: E402

CLK_TCK = os.sysconf("SC_CLK_TCK")
EVENTS = "/api/v1/namespaces/{ns}/events"
REPORT = "agentq.dev/report"
TOKEN = "agentq.dev/fencing-token"
TERMINAL = ("Succeeded", "Failed", "DeadLettered", "Cancelled")
_PR_SET_PDEATHSIG = 1


# -- process accounting ------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """User + system CPU of ``pid`` so far (its threads included); NaN once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return math.nan
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def rss_mb(pid: int) -> float:
    """Resident memory of ``pid`` in MB (NaN once it is gone)."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return math.nan
    for line in text.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return math.nan


def _die_with_parent() -> None:
    # Between fork and exec: if this benchmark dies (SIGKILL), the kernel kills the child.
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


class Proc:
    """A child process, its output in ``log`` (or read line by line by ``on_line``)."""

    def __init__(
        self,
        name: str,
        argv: list[str],
        log: Path,
        env: dict[str, str],
        on_line: Callable[[float, str], None] | None = None,
    ) -> None:
        self.name = name
        self.log = log
        self._out: IO[bytes] = open(log, "ab")  # noqa: SIM115 - closed in stop()
        self.popen = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE if on_line else self._out,
            stderr=self._out,
            env=env,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
        self.pid = self.popen.pid
        self._reader: threading.Thread | None = None
        if on_line is not None:
            self._reader = threading.Thread(
                target=self._read, args=(on_line,), name=f"read-{name}", daemon=True
            )
            self._reader.start()

    def _read(self, on_line: Callable[[float, str], None]) -> None:
        assert self.popen.stdout is not None
        for raw in self.popen.stdout:
            # Stamped as it arrives: agent-sim flushes each line as it happens.
            now = time.monotonic()
            self._out.write(raw)
            with contextlib.suppress(Exception):
                on_line(now, raw.decode(errors="replace"))

    def cpu(self) -> float:
        return cpu_seconds(self.pid)

    def rss(self) -> float:
        return rss_mb(self.pid)

    def alive(self) -> bool:
        return self.popen.poll() is None

    def stop(self) -> None:
        """SIGTERM by pid, SIGKILL after 15 s."""
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGTERM)
            try:
                self.popen.wait(timeout=15)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.pid, signal.SIGKILL)
                self.popen.wait(timeout=10)
        if self._reader is not None:
            self._reader.join(timeout=5)
        if self.popen.stdout is not None:
            self.popen.stdout.close()
        self._out.close()


@dataclass
class Pair:
    """One agent pod: its sidecar and its agent-sim."""

    worker: str
    sidecar: Proc
    agent: Proc
    port: int = 0  # the sidecar's /metrics (its own port; the agent API's for older trees)

    async def api_requests(self, session: aiohttp.ClientSession) -> collections.Counter[str]:
        """The sidecar's own count of its API requests, by "resource verb"."""
        async with session.get(f"http://127.0.0.1:{self.port}/metrics") as rsp:
            text = await rsp.text()
        out: collections.Counter[str] = collections.Counter()
        for labels, value in parse_metrics(text, ("agentq_sidecar_api_requests_total",))[
            "agentq_sidecar_api_requests_total"
        ]:
            out[f"{labels.get('resource')} {labels.get('verb')}"] += int(value)
        return out


def _without_flags(argv: list[str], *flags: str) -> list[str]:
    """``argv`` without each of ``flags`` and the value after it."""
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg in flags:
            skip = True
        else:
            out.append(arg)
    return out


# -- what a task went through --------------------------------------------------------


@dataclass
class TaskTimes:
    """When each step of one task's life was seen (monotonic seconds; None: not seen)."""

    created: float | None = None  # our create answered
    granted: float | None = None  # first sign of the grant: status.worker, or its Lease
    worker: str = ""
    token: int | None = None
    running: float | None = None  # phase Running seen
    seen: float | None = None  # agent-sim printed "assigned"
    reported: float | None = None  # agent-sim printed "reported" (its sidecar's write answered)
    report: float | None = None  # the Lease's report annotation seen on the watch
    committed: float | None = None  # phase Succeeded first seen
    finished: float | None = None  # any terminal phase first seen
    phase: str = ""
    lease_deleted: float | None = None
    deleted: float | None = None  # the task itself deleted (a TTL)
    successes: int = 0  # entries into Succeeded seen (1 is right)
    history_successes: int = 0  # the most Succeeded entries its status.history showed
    attempts: int = 0


@dataclass
class Recorder:
    """Watches tasks and Leases of one namespace; fills one ``TaskTimes`` per task."""

    api: Api
    namespace: str
    tasks: dict[str, TaskTimes] = field(default_factory=lambda: collections.defaultdict(TaskTimes))
    # (time, worker, task) of every grant seen (re-grants too), for the slots' reuse.
    grants: list[tuple[float, str, str]] = field(default_factory=list)
    events_seen: int = 0
    errors: int = 0
    _watches: list[asyncio.Task[None]] = field(default_factory=list)

    async def start(self) -> None:
        """Open both watches from the namespace's current version; returns once open."""
        for path, seen in ((TASKS, self._task), (LEASES, self._lease)):
            base = path.format(ns=self.namespace)
            _, listed = await self.api.request("GET", base + "?limit=1", ok=(200,))
            rv = str(listed["metadata"]["resourceVersion"])
            for item in listed.get("items") or []:
                seen("ADDED", item, time.monotonic())
            opened = asyncio.Event()
            self._watches.append(asyncio.create_task(self._watch(base, rv, seen, opened)))
            await asyncio.wait_for(opened.wait(), timeout=60)

    async def stop(self) -> None:
        for watch in self._watches:
            watch.cancel()
        await asyncio.gather(*self._watches, return_exceptions=True)

    async def _watch(
        self,
        base: str,
        rv: str,
        seen: Callable[[str, dict[str, Any], float], None],
        opened: asyncio.Event,
    ) -> None:
        """Every change after ``rv``; a dropped connection resumes from the last version."""
        while True:
            path = f"{base}?watch=1&resourceVersion={rv}&allowWatchBookmarks=true"
            try:
                async with self.api.session.get(
                    self.api.connection.server + path,
                    headers=self.api.connection.headers(),
                    timeout=aiohttp.ClientTimeout(total=None, sock_read=None),
                ) as rsp:
                    opened.set()
                    if rsp.status == 410:
                        print(f"watch {base}: 410 Gone; events lost", flush=True)
                        self.errors += 1
                        _, listed = await self.api.request("GET", base + "?limit=1", ok=(200,))
                        rv = str(listed["metadata"]["resourceVersion"])
                        continue
                    if rsp.status != 200:
                        # E.g. 504 "Too large resource version": the API server's watch
                        # cache is behind the version our LIST read from etcd (a busy
                        # API server). Its body is a Status, not events: try again.
                        raise ValueError(f"HTTP {rsp.status}: {(await rsp.text())[:200]}")
                    buffer = b""
                    async for chunk in rsp.content.iter_any():
                        now = time.monotonic()
                        buffer += chunk
                        *lines, buffer = buffer.split(b"\n")
                        for line in lines:
                            if not line.strip():
                                continue
                            event = json.loads(line)
                            obj = event.get("object") or {}
                            rv = (obj.get("metadata") or {}).get("resourceVersion") or rv
                            if event.get("type") == "ERROR":
                                raise ValueError(f"watch error: {obj}")
                            if event.get("type") != "BOOKMARK":
                                self.events_seen += 1
                                seen(event["type"], obj, now)
            except (aiohttp.ClientError, TimeoutError, ValueError) as err:
                print(f"watch {base}: {type(err).__name__}: {err}; resuming", flush=True)
                self.errors += 1
                await asyncio.sleep(0.2)

    def _task(self, kind: str, obj: dict[str, Any], now: float) -> None:
        name = (obj.get("metadata") or {}).get("name")
        if not name:
            return
        t = self.tasks[name]
        if kind == "DELETED":
            t.deleted = t.deleted or now
            return
        status = obj.get("status") or {}
        phase = str(status.get("phase") or "Pending")
        worker = status.get("worker")
        attempt = int(status.get("attempt") or 0)
        if worker and attempt > t.attempts:
            t.attempts = attempt
            t.worker = str(worker)
            self.grants.append((now, str(worker), name))
            if t.granted is None:
                t.granted = now
        if phase == "Running" and t.running is None:
            t.running = now
        if phase == "Succeeded" and t.phase != "Succeeded":
            t.successes += 1
            t.committed = t.committed or now
        if phase in TERMINAL and t.finished is None:
            t.finished = now
        t.phase = phase
        history = status.get("history") or []
        done = sum(1 for h in history if isinstance(h, dict) and h.get("outcome") == "Succeeded")
        t.history_successes = max(t.history_successes, done)

    def _lease(self, kind: str, obj: dict[str, Any], now: float) -> None:
        meta = obj.get("metadata") or {}
        task = (meta.get("labels") or {}).get("agentq.dev/task")
        if not task:
            return
        t = self.tasks[task]
        if kind == "DELETED":
            t.lease_deleted = now
            return
        annotations = meta.get("annotations") or {}
        if (obj.get("spec") or {}).get("holderIdentity") and t.granted is None:
            t.granted = now  # the Lease may be seen before the status that names the worker
        if REPORT in annotations and t.report is None:
            t.report = now

    def on_agent_line(self, now: float, line: str) -> None:
        """One line of an agent-sim's output (``assigned`` / ``reported`` events)."""
        if not line.startswith("{"):
            return
        event = json.loads(line)
        task = event.get("task")
        if not task:
            return
        t = self.tasks[task]
        if event.get("event") == "assigned" and t.seen is None:
            t.seen = now
        elif event.get("event") == "reported" and t.reported is None:
            t.reported = now


# -- statistics ----------------------------------------------------------------------


def percentile(values: Iterable[float], q: float) -> float:
    """The ``q``-th percentile (0-100) by linear interpolation; NaN for no values."""
    data = sorted(v for v in values if v is not None and not math.isnan(v))
    if not data:
        return math.nan
    at = (len(data) - 1) * q / 100
    low = math.floor(at)
    high = min(low + 1, len(data) - 1)
    return data[low] + (data[high] - data[low]) * (at - low)


def steady_rate(times: Iterable[float], skip: float = 0.1) -> tuple[float, int]:
    """Events per second between the ``skip`` fraction of the first and of the last
    events (warm-up and the tail, when slots run dry, left out), and how many events
    that window counts (those after its first)."""
    data = sorted(times)
    if len(data) < 3:
        return math.nan, 0
    lo = int(len(data) * skip)
    hi = max(lo + 1, len(data) - 1 - int(len(data) * skip))
    span = data[hi] - data[lo]
    return ((hi - lo) / span if span > 0 else math.nan), hi - lo


def next_grants(
    commits: Iterable[tuple[float, str]],
    grants: Iterable[tuple[float, str]],
    pending_at: Callable[[float], int],
) -> list[float | None]:
    """For each commit (time, worker), in the order given: when the next grant to the
    same worker came -- the freed slot taken again -- or None if none came or no task
    was waiting then (``pending_at(t) == 0``). Each grant answers one commit, in order
    of time."""
    by_worker: dict[str, list[float]] = collections.defaultdict(list)
    for t, worker in grants:
        by_worker[worker].append(t)
    for times in by_worker.values():
        times.sort()
    commits = list(commits)
    used = collections.Counter[str]()
    out: list[float | None] = [None] * len(commits)
    for at in sorted(range(len(commits)), key=lambda i: commits[i]):
        t, worker = commits[at]
        times = by_worker.get(worker, [])
        i = used[worker]
        while i < len(times) and times[i] < t:
            i += 1  # a grant before this commit filled a slot that was already free
        if i >= len(times):
            used[worker] = i
            continue
        used[worker] = i + 1
        if pending_at(t) > 0:
            out[at] = times[i]
    return out


def slope_per_hour(samples: list[tuple[float, float]]) -> tuple[float, float]:
    """Least-squares slope of (seconds, value) samples, per hour, and its standard error
    (NaN with fewer than three samples)."""
    points = [(t, v) for t, v in samples if not math.isnan(v)]
    n = len(points)
    if n < 3:
        return math.nan, math.nan
    mt = sum(t for t, _ in points) / n
    mv = sum(v for _, v in points) / n
    sxx = sum((t - mt) ** 2 for t, _ in points)
    if sxx == 0:
        return math.nan, math.nan
    b = sum((t - mt) * (v - mv) for t, v in points) / sxx
    a = mv - b * mt
    residual = sum((v - (a + b * t)) ** 2 for t, v in points)
    se = math.sqrt(residual / (n - 2) / sxx)
    return b * 3600, se * 3600


# -- the API server's own counters ------------------------------------------------------

_SAMPLE = re.compile(r"^([a-zA-Z_:][\w:]*)(?:\{(.*)\})? (\S+)")
_LABEL = re.compile(r'(\w+)="([^"]*)"')


def parse_metrics(text: str, names: Iterable[str]) -> dict[str, list[tuple[dict[str, str], float]]]:
    """The samples of the named metrics in a Prometheus text page."""
    wanted = set(names)
    out: dict[str, list[tuple[dict[str, str], float]]] = {n: [] for n in wanted}
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        m = _SAMPLE.match(line)
        if not m or m.group(1) not in wanted:
            continue
        with contextlib.suppress(ValueError):
            out[m.group(1)].append((dict(_LABEL.findall(m.group(2) or "")), float(m.group(3))))
    return out


def resource_of(labels: dict[str, str]) -> str:
    resource = labels.get("resource", "")
    if labels.get("subresource"):
        resource += "/" + labels["subresource"]
    return resource


@dataclass
class ApiCounters:
    """A reading of the API server's request counters and related totals."""

    requests: collections.Counter[tuple[str, str]]  # (resource, verb) -> requests
    codes: collections.Counter[tuple[str, str, str]]  # (resource, verb, code)
    latency: collections.Counter[tuple[str, str]]  # seconds spent answering, summed
    watch_events: collections.Counter[str]  # events sent to watchers, by kind
    watch_bytes: collections.Counter[str]
    # Requests by API Priority and Fairness flow schema: who asked (exempt = the admin
    # credentials of agentq and this benchmark; kube-controller-manager, ...).
    flows: collections.Counter[str] = field(default_factory=collections.Counter)

    def minus(self, before: ApiCounters) -> ApiCounters:
        def sub(a: collections.Counter[Any], b: collections.Counter[Any]) -> Any:
            return collections.Counter(
                {k: v - b.get(k, 0) for k, v in a.items() if v - b.get(k, 0)}
            )

        return ApiCounters(
            sub(self.requests, before.requests),
            sub(self.codes, before.codes),
            sub(self.latency, before.latency),
            sub(self.watch_events, before.watch_events),
            sub(self.watch_bytes, before.watch_bytes),
            sub(self.flows, before.flows),
        )


async def api_counters(api: Api) -> ApiCounters:
    text = await api.text("/metrics")
    m = parse_metrics(
        text,
        (
            "apiserver_request_total",
            "apiserver_request_duration_seconds_sum",
            "apiserver_watch_events_total",
            "apiserver_watch_events_sizes_sum",
            "apiserver_flowcontrol_dispatched_requests_total",
        ),
    )
    requests: collections.Counter[tuple[str, str]] = collections.Counter()
    codes: collections.Counter[tuple[str, str, str]] = collections.Counter()
    for labels, value in m["apiserver_request_total"]:
        key = (resource_of(labels), labels.get("verb", ""))
        requests[key] += int(value)
        codes[(*key, labels.get("code", ""))] += int(value)
    latency: collections.Counter[tuple[str, str]] = collections.Counter()
    for labels, value in m["apiserver_request_duration_seconds_sum"]:
        latency[(resource_of(labels), labels.get("verb", ""))] += value
    watch_events: collections.Counter[str] = collections.Counter()
    for labels, value in m["apiserver_watch_events_total"]:
        watch_events[labels.get("resource") or labels.get("kind", "")] += int(value)
    watch_bytes: collections.Counter[str] = collections.Counter()
    for labels, value in m["apiserver_watch_events_sizes_sum"]:
        watch_bytes[labels.get("resource") or labels.get("kind", "")] += value
    flows: collections.Counter[str] = collections.Counter()
    for labels, value in m["apiserver_flowcontrol_dispatched_requests_total"]:
        flows[labels.get("flow_schema", "")] += int(value)
    return ApiCounters(requests, codes, latency, watch_events, watch_bytes, flows)


WRITE_VERBS = frozenset(("POST", "PUT", "PATCH", "DELETE"))


async def quiet(api: Api, namespace_writes: Callable[[ApiCounters], int], limit: float) -> None:
    """Until the writes ``namespace_writes`` counts stop for two seconds (at most ``limit``)."""
    deadline = time.monotonic() + limit
    last = namespace_writes(await api_counters(api))
    still = 0
    while time.monotonic() < deadline and still < 2:
        await asyncio.sleep(1.0)
        now = namespace_writes(await api_counters(api))
        still = still + 1 if now == last else 0
        last = now


def activity(c: ApiCounters) -> int:
    """Requests a task's life (or its clean-up) makes, the fleet's steady ones left out
    (Lease PUTs and GETs: worker Lease renewals, leader election)."""
    return sum(
        v
        for (r, verb), v in c.requests.items()
        if r.startswith("agenttasks") or (r in ("leases", "events") and verb not in ("PUT", "GET"))
    )


def agentq_writes(c: ApiCounters) -> int:
    """The lifecycle's writes (Lease PUTs left out: the fleet renews worker Leases)."""
    kinds = ("agenttasks", "agenttasks/status", "events", "leases")
    return sum(
        v for (r, verb), v in c.requests.items() if r in kinds and verb in WRITE_VERBS - {"PUT"}
    )


async def etcd_metrics(url: str) -> dict[str, float]:
    """etcd's database size (on disk, and in use) from its own metrics endpoint."""
    loop = asyncio.get_running_loop()

    def get() -> str:
        import urllib.request

        with urllib.request.urlopen(url + "/metrics", timeout=10) as rsp:
            return str(rsp.read().decode())

    text = await loop.run_in_executor(None, get)
    m = parse_metrics(
        text, ("etcd_mvcc_db_total_size_in_bytes", "etcd_mvcc_db_total_size_in_use_in_bytes")
    )
    return {k: (v[0][1] if v else math.nan) for k, v in m.items()}


async def count(api: Api, path: str) -> int:
    """How many objects a collection holds: one LIST with limit=1 (remainingItemCount)."""
    status, listed = await api.request("GET", path + "?limit=1", ok=(200,))
    if status != 200 or not isinstance(listed, dict):
        return -1
    items = len(listed.get("items") or [])
    return items + int((listed.get("metadata") or {}).get("remainingItemCount") or 0)


# -- the rig -------------------------------------------------------------------------


def task_body(
    name: str, *, lease: int = 30, work_seconds: float | None = None, **spec: Any
) -> dict[str, Any]:
    """A no-op AgentTask, or (``work_seconds``) one agent-sim works on that long."""
    payload: dict[str, Any] = {"prompt": f"no-op {name}"}
    if work_seconds is not None:
        payload["workSeconds"] = work_seconds
    return {
        "apiVersion": "agentq.dev/v1alpha1",
        "kind": "AgentTask",
        "metadata": {"name": name},
        "spec": {
            "requiredCapabilities": ["llm"],
            "leaseDurationSeconds": lease,
            "payload": payload,
            **spec,
        },
    }


@dataclass
class Rig:
    """The control plane (started here) and the agentq processes of one namespace."""

    workdir: Path
    state: ClusterState | None = None
    cluster: Cluster | None = None
    api: Api = field(init=False)
    procs: list[Proc] = field(default_factory=list)
    pairs: list[Pair] = field(default_factory=list)
    operator: Proc | None = None
    operator_metrics_port: int = 0
    # None: the processes' own default (INFO), as a user runs them.
    log_level: str | None = None
    # Another source tree (e.g. ``git archive REV``): its operator, sidecar, agent-sim and
    # agent SDK (its source roots on PYTHONPATH) and its CRDs run instead of this tree's.
    src: Path | None = None
    # Flags for kube-apiserver beyond the defaults (the soak's ``--event-ttl``).
    apiserver_flags: tuple[str, ...] = ()
    # Run the operator and the sidecars as installed (``kubectl apply -k manifests/``):
    # each with its ServiceAccount's token, bound by the manifests' RBAC, under their
    # admission policies (``install_policies``), the operator electing its leader on
    # agentq-system/agentq-operator. False: the admin client certificate, which the API
    # server verifies on every request (a tenth of its CPU in a backlog).
    accounts: bool = False
    # The operator's autogroup nice value (0: the same share as each agent process).
    operator_nice: int = 0

    def up(self) -> None:
        self.cluster = Cluster(self.workdir / "cluster")
        self.state = self.cluster.up(
            build=True, tie_to_parent=True, apiserver_flags=self.apiserver_flags
        )
        self.api = Api(connect(self.state.kubeconfig))
        self.kubectl("apply", "-f", str((self.src or ROOT) / "crds"))
        self.kubectl(
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "crd/agenttasks.agentq.dev",
            "crd/agentworkers.agentq.dev",
            "crd/agentqueues.agentq.dev",
            "crd/agentbudgets.agentq.dev",
        )

    def install_policies(self) -> None:
        """The RBAC and admission policies of the install base, without the operator's
        Deployment: what ``accounts`` runs under."""
        manifests = (self.src or ROOT) / "manifests"
        for name in (
            "namespace.yaml",
            "operator-rbac.yaml",
            "agent-rbac.yaml",
            "admission-policy.yaml",
            "operator-policy.yaml",
            "leader-epoch-policy.yaml",
        ):
            if (manifests / name).exists():
                self.kubectl("apply", "-f", str(manifests / name))

    def account_kubeconfig(self, namespace: str, account: str, *, role: str = "") -> str:
        """A kubeconfig with a TokenRequest token of ``namespace/account`` (created if
        missing, and bound to ClusterRole ``role`` in its namespace if given)."""
        path = self.workdir / f"kubeconfig-{namespace}-{account}"
        if path.exists():
            return str(path)
        self._kubectl_idempotent("create", "serviceaccount", "-n", namespace, account)
        if role:
            subject = f"--serviceaccount={namespace}:{account}"
            self._kubectl_idempotent(
                "create", "rolebinding", "-n", namespace, account, f"--clusterrole={role}", subject
            )
        token = self._kubectl_out("create", "token", "-n", namespace, account, "--duration=12h")
        config = json.loads(self._kubectl_out("config", "view", "--raw", "-o", "json"))
        for user in config["users"]:
            user["user"] = {"token": token.strip()}
        path.write_text(json.dumps(config))
        path.chmod(0o600)
        return str(path)

    def _kubectl_out(self, *args: str) -> str:
        assert self.state is not None
        done = subprocess.run(
            [self.state.binaries["kubectl"], *args],
            env={**os.environ, "KUBECONFIG": self.state.kubeconfig},
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)}: {done.stderr}")
        return done.stdout

    def _kubectl_idempotent(self, *args: str) -> None:
        try:
            self._kubectl_out(*args)
        except RuntimeError as err:
            if "already exists" not in str(err):
                raise

    async def down(self) -> None:
        for proc in reversed(self.procs):
            proc.stop()
        with contextlib.suppress(Exception):
            await self.api.close()
        if self.cluster is not None:
            self.cluster.down()

    @property
    def pids(self) -> dict[str, int]:
        """The control plane's processes (etcd, kube-apiserver, kube-controller-manager)."""
        assert self.state is not None
        return dict(self.state.pids)

    def kubectl(self, *args: str) -> None:
        assert self.state is not None
        subprocess.run(
            [self.state.binaries["kubectl"], *args],
            env={**os.environ, "KUBECONFIG": self.state.kubeconfig},
            check=True,
            capture_output=True,
        )

    def _env(self) -> dict[str, str]:
        assert self.state is not None
        env = {**os.environ, "KUBECONFIG": self.state.kubeconfig, "PYTHONUNBUFFERED": "1"}
        if self.src is not None:
            roots = [self.src / "operator", self.src / "sdk" / "src", self.src / "tools" / "src"]
            env["PYTHONPATH"] = os.pathsep.join(str(r) for r in roots if r.is_dir())
        return env

    async def namespace(self, prefix: str) -> str:
        ns = f"{prefix}-{uuid.uuid4().hex[:6]}"
        await self.api.request("POST", "/api/v1/namespaces", {"metadata": {"name": ns}})
        return ns

    async def drop_namespace(self, ns: str, *, wait: float = 300) -> None:
        await self.api.request("DELETE", f"/api/v1/namespaces/{ns}", ok=(200, 202))
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            status, _ = await self.api.request("GET", f"/api/v1/namespaces/{ns}")
            if status == 404:
                return
            await asyncio.sleep(0.5)

    def start_operator(self, ns: str, *flags: str) -> Proc:
        self.operator_metrics_port = free_port()
        env = self._env()
        leader_ns = ns
        if self.accounts:
            env["KUBECONFIG"] = self.account_kubeconfig("agentq-system", "agentq-operator")
            leader_ns = "agentq-system"
        argv = [
            sys.executable,
            "-m",
            "agentq.cli",
            "operator",
            "--namespace",
            ns,
            "--leader-namespace",
            leader_ns,
            "--metrics-port",
            str(self.operator_metrics_port),
            *(["--log-level", self.log_level] if self.log_level else []),
            *flags,
        ]
        self.operator = Proc("operator", argv, self.workdir / "operator.log", env)
        self.procs.append(self.operator)
        if self.operator_nice:
            # A session of its own, so an autogroup of its own: its CPU share against the
            # agent processes it shares the machine with here (on a cluster, its pod's).
            Path(f"/proc/{self.operator.pid}/autogroup").write_text(str(self.operator_nice))
        return self.operator

    async def create_workers(self, ns: str, count: int, slots: int) -> list[str]:
        names = [f"w{i}" for i in range(count)]
        await bounded(
            [
                lambda n=n: self.api.request(  # type: ignore[misc]
                    "POST",
                    WORKERS.format(ns=ns),
                    {
                        "apiVersion": "agentq.dev/v1alpha1",
                        "kind": "AgentWorker",
                        "metadata": {"name": n},
                        "spec": {"capabilities": ["llm"], "maxInFlight": slots},
                    },
                )
                for n in names
            ],
            8,
        )
        return names

    def start_agents(
        self,
        ns: str,
        workers: list[str],
        on_line: Callable[[float, str], None],
        *,
        work_seconds: float = 0.0,
    ) -> list[Pair]:
        """One sidecar + agent-sim pair per worker; agent-sim completes each task after
        ``work_seconds``."""
        assert self.state is not None
        for worker in workers:
            port, metrics_port = free_port(), free_port()
            sidecar_argv, agent_argv = agentsim.pair_commands(
                worker=worker,
                namespace=ns,
                port=port,
                token_file=str(self.workdir / f"sidecar-token-{worker}"),
                metrics_port=metrics_port,
                behaviour="complete",
                kubeconfig=(
                    self.account_kubeconfig(ns, f"agentq-agent-{worker}", role="agentq-agent")
                    if self.accounts
                    else self.state.kubeconfig
                ),
                identity=f"{worker}-pod",
                sidecar_flags={"log_level": self.log_level} if self.log_level else {},
                agent_flags={"work_seconds": work_seconds},
            )
            if not self._authenticated_sidecar():
                # An older tree (--src) has neither flag: its API is open, /metrics on it.
                sidecar_argv = _without_flags(sidecar_argv, "--token-file", "--metrics-listen")
                agent_argv = _without_flags(agent_argv, "--token-file")
                metrics_port = port
            sidecar = Proc(
                f"sidecar-{worker}",
                sidecar_argv,
                self.workdir / f"sidecar-{worker}.log",
                self._env(),
            )
            agent = Proc(
                f"agent-{worker}",
                agent_argv,
                self.workdir / f"agent-{worker}.log",
                self._env(),
                on_line=on_line,
            )
            self.procs += [sidecar, agent]
            self.pairs.append(Pair(worker, sidecar, agent, metrics_port))
        return self.pairs

    def _authenticated_sidecar(self) -> bool:
        """Whether the sidecar that runs has --token-file (this tree's does)."""
        if self.src is None:
            return True
        command = self.src / "operator" / "agentq" / "sidecar" / "command.py"
        return command.exists() and "--token-file" in command.read_text()

    async def wait_workers_ready(self, ns: str, count: int, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while True:
            items, _ = await self.api.list_all(WORKERS.format(ns=ns))
            ready = sum(1 for w in items if (w.get("status") or {}).get("phase") == "Ready")
            if ready >= count:
                return
            for proc in self.procs:
                if not proc.alive():
                    raise RuntimeError(f"{proc.name} exited: see {proc.log}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{ready} of {count} workers Ready after {timeout} s")
            await asyncio.sleep(0.5)

    def control_plane_cpu(self) -> dict[str, float]:
        return {name: cpu_seconds(pid) for name, pid in self.pids.items()}

    def agentq_cpu(self) -> dict[str, float]:
        """CPU seconds of the operator, the sidecars (summed), the agent-sims (summed) and
        this benchmark's own process (its watches and clients)."""
        out = {"operator": self.operator.cpu() if self.operator else math.nan}
        out["sidecars"] = sum(p.sidecar.cpu() for p in self.pairs)
        out["agent-sims"] = sum(p.agent.cpu() for p in self.pairs)
        out["benchmark"] = cpu_seconds(os.getpid())
        return out


async def create_tasks(
    api: Api,
    ns: str,
    names: list[str],
    recorder: Recorder | None,
    *,
    concurrency: int = 8,
    rate: float | None = None,
    work: dict[str, float] | None = None,
    **spec: Any,
) -> int:
    """Create the tasks (``concurrency`` clients at once, or paced at ``rate`` per
    second); stamps each create's answer. ``work``: task -> the seconds agent-sim works
    on it (its payload's ``workSeconds``). Returns how many were refused."""
    refused = 0
    start = time.monotonic()

    async def one(i: int, name: str) -> None:
        nonlocal refused
        if rate:
            await asyncio.sleep(max(0.0, start + i / rate - time.monotonic()))
        body = task_body(name, work_seconds=(work or {}).get(name), **spec)
        status, body = await api.request("POST", TASKS.format(ns=ns), body)
        if status not in (200, 201):
            refused += 1
            print(f"create {name}: HTTP {status}: {str(body)[:200]}", flush=True)
        elif recorder is not None:
            recorder.tasks[name].created = time.monotonic()

    if rate:
        await asyncio.gather(*(one(i, n) for i, n in enumerate(names)))
    else:
        await bounded([lambda i=i, n=n: one(i, n) for i, n in enumerate(names)], concurrency)  # type: ignore[misc]
    return refused


def fresh_workdir(prefix: str) -> Path:
    import tempfile

    return Path(tempfile.mkdtemp(prefix=prefix))


def remove(workdir: Path) -> None:
    shutil.rmtree(workdir, ignore_errors=True)


def quote(value: str) -> str:
    return urllib.parse.quote(value, safe="")


__all__ = [
    "EVENTS",
    "LEASES",
    "TASKS",
    "TOKEN",
    "WORKERS",
    "Api",
    "Rig",
    "bounded",
]
