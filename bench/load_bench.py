"""``make bench-load``: the operator under load on the embedded control plane.

Measures, in one run (so the figures can be compared with each other even on a
busy machine):

1. the raw write rate of the API server: Lease creates with a plain aiohttp
   client at concurrency 32 -- the ceiling for everything else;
2. dispatch throughput of a backlog: N pending AgentTasks over W AgentWorkers
   (1,000 / 50 and 10,000 / 1,000), the fleet registered first (an operator runs
   until every worker shows Ready, then stops; its status writes are reported per
   worker), then the operator started on the full backlog,
   timed from its first to its last grant (the operator's own
   ``agentq_dispatches_total``, sampled every 0.25 s); the longest stretch
   without a grant; API writes per dispatch split by resource and verb (the API
   server's ``apiserver_request_total``; the fleet's worker-Lease renewals are
   PUTs and are listed apart); operator, API server and etcd CPU per dispatch;
   operator RSS;
3. per-event controller cost: operator CPU per task-Lease renewal with every
   task held (the fleet renews each task Lease once), and the operator's writes
   during those renewals (must be 0);
4. reclaim latency: 500 held tasks whose holder (the fleet process) is
   SIGKILLed, from each Lease's last renewal to the status write that reclaims
   it, p50 / p99 / max;
5. with ``--queues 1,4``: the 1,000-task backlog again, spread over that many
   AgentQueues (weights ``--queue-weights``, default 1:1:1:2) drawing on the
   workers of the tasks' own namespace, against the plain backlog of the same
   round: throughput and CPU per dispatch as ratios, and how evenly the queue
   level shared the grants against its bound (docs/tenancy.md);
6. with ``--costs``: what one request of each kind the operator makes costs the
   API server, measured alone -- the AgentTask status CAS beside a Lease create
   and beside the same patch on a schema-less custom resource -- so the ceiling
   the raw Lease rate sets (1.) can be read against what a grant's writes cost.

Variants of the operator can be run side by side (``--variants``): ``new`` is
this tree with its defaults; ``kopf`` and ``threads`` swap in kopf's watches or
the kubernetes sync client in threads (``--watcher kopf`` /
``bench/threaded_operator.py``) so the choice of machinery is measured, not guessed;
``baseline=DIR`` runs the operator from another source tree (for example
``git archive main``) for before/after figures.

With ``--profile`` the 1,000-task drains of each variant's first round (the plain
one and those over queues) are recorded by py-spy (``bench/out/``) and the
hottest functions are listed.

usage: python bench/load_bench.py [--quick] [--variants new,kopf,baseline=/tmp/main]
       [--queues 1,4] [--profile] [--write-docs]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import itertools
import json
import math
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
THREADED = (str(HERE / "threaded_operator.py"),)  # the comparison writer (threads)
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

import aiohttp  # noqa: E402
import docsection  # noqa: E402
from load_common import LEASES, QUEUES, TASKS, WORKERS, Api, bounded, connect  # noqa: E402

from agentq.controlplane import Cluster  # noqa: E402
from agentq.controlplane.cluster import free_port  # noqa: E402

OUT = HERE / "out"
DOCS = ROOT / "docs" / "benchmarks.md"
SECTION_START = "<!-- bench-load:start -->"
SECTION_END = "<!-- bench-load:end -->"
CLK_TCK = os.sysconf("SC_CLK_TCK")
WRITE_VERBS = frozenset(("POST", "PUT", "PATCH", "DELETE"))
# What the operator writes; the rest (the controller manager's own bookkeeping) is not
# counted.
OPERATOR_RESOURCES = (
    "agenttasks/status",
    "agentworkers/status",
    "agentqueues/status",
    "agenttasks",
    "agentworkers",
    "leases",
    "events",
)


# -- process accounting ------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """User + system CPU of ``pid`` so far (its threads included)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def rss_mb(pid: int) -> tuple[float, float]:
    """(current, peak) resident memory of ``pid`` in MB."""
    values: dict[str, float] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            values[key] = int(rest.split()[0]) / 1024
    return values.get("VmRSS", 0.0), values.get("VmHWM", 0.0)


def scrape(port: int) -> dict[str, float]:
    """The operator's metrics, flattened to ``name{labels}`` -> value."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as rsp:
        text = rsp.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            with contextlib.suppress(ValueError):
                out[key] = float(value)
    return out


_REQ = re.compile(r"^apiserver_request_total\{(.*)\} (\S+)$")
_LABEL = re.compile(r'(\w+)="([^"]*)"')


async def apiserver_writes(
    api: Api, verbs: frozenset[str] | None = WRITE_VERBS
) -> collections.Counter[tuple[str, str]]:
    """Cumulative requests served, by (resource[/subresource], verb): writes by default,
    every verb with ``verbs=None``."""
    text = await api.text("/metrics")
    counts: collections.Counter[tuple[str, str]] = collections.Counter()
    for line in text.splitlines():
        m = _REQ.match(line)
        if not m:
            continue
        labels = dict(_LABEL.findall(m.group(1)))
        if verbs is not None and labels.get("verb") not in verbs:
            continue
        resource = labels.get("resource", "")
        if labels.get("subresource"):
            resource += "/" + labels["subresource"]
        counts[(resource, labels["verb"])] += int(float(m.group(2)))
    return counts


def safe(filename: str) -> str:
    """A file name from a variant's name (which may hold a path and settings)."""
    return re.sub(r"[^\w@=.+-]", "_", filename)


# -- the pieces of a scenario ------------------------------------------------------------


@dataclass
class Variant:
    name: str
    flags: tuple[str, ...] = ()
    src: str | None = None  # another source tree's operator/ directory (PYTHONPATH)
    # how the operator is started: the CLI, or bench/threaded_operator.py (``threads``)
    entry: tuple[str, ...] = ("-m", "agentq.cli")
    env: dict[str, str] = field(default_factory=dict)  # operator settings (environment)

    @classmethod
    def parse(cls, text: str) -> Variant:
        """``new``, ``kopf``, ``threads``, ``baseline=DIR``; any of them followed by
        ``@VAR=value`` settings of the operator, e.g. ``new@AGENTQ_WRITE_CONCURRENCY=64``."""
        if "@" in text:
            base, *settings = text.split("@")
            variant = cls.parse(base)
            for setting in settings:
                var, _, value = setting.partition("=")
                variant.env[var] = value
            variant.name = "@".join([variant.name, *settings])
            return variant
        if text == "new":
            return cls("new")
        if text == "kopf":
            return cls("kopf", ("--watcher", "kopf"))
        if text == "threads":
            return cls("threads", entry=(str(HERE / "threaded_operator.py"),))
        if text == "kopf+threads":
            return cls(
                "kopf+threads", ("--watcher", "kopf"), entry=(str(HERE / "threaded_operator.py"),)
            )
        if text.startswith("baseline="):
            src = Path(text.split("=", 1)[1]) / "operator"
            if not (src / "agentq").is_dir():
                raise SystemExit(f"{src} has no agentq package")
            return cls("baseline", (), str(src))
        raise SystemExit(f"unknown variant {text!r}")


@dataclass
class Env:
    kubeconfig: str
    api: Api
    pids: dict[str, int]
    workdir: Path
    kubectl: str = "kubectl"


def install_crds(env: Env, variant: Variant | None = None) -> None:
    """The CRDs of the variant's own tree (a baseline runs with the CRDs it shipped with)."""
    root = Path(variant.src).parent if variant is not None and variant.src else ROOT
    crds = ["crd/agenttasks.agentq.dev", "crd/agentworkers.agentq.dev"]
    if (root / "crds" / "agentqueues.agentq.dev.yaml").exists():
        crds.append("crd/agentqueues.agentq.dev")
    for args in (
        ["apply", "-f", str(root / "crds")],
        ["wait", "--for=condition=Established", "--timeout=60s", *crds],
    ):
        kubectl(env, *args)


def kubectl(env: Env, *args: str, check: bool = True) -> None:
    """Run kubectl against the benchmark's control plane."""
    subprocess.run(
        [env.kubectl, *args],
        env={**os.environ, "KUBECONFIG": env.kubeconfig},
        check=check,
        capture_output=True,
    )


@dataclass
class Operator:
    proc: subprocess.Popen[bytes]
    metrics_port: int
    log: Path

    @property
    def pid(self) -> int:
        return self.proc.pid


def start_operator(env: Env, ns: str, variant: Variant, tag: str) -> Operator:
    port = free_port()
    log = env.workdir / safe(f"operator-{variant.name}-{tag}.log")
    extra_env = dict(variant.env)
    if variant.src:
        extra_env["PYTHONPATH"] = variant.src
    args = [
        sys.executable,
        *variant.entry,
        "operator",
        "--namespace",
        ns,
        "--metrics-port",
        str(port),
        "--leader-namespace",
        ns,
        "--log-level",
        os.environ.get("BENCH_OPERATOR_LOG_LEVEL", "WARNING"),
        *variant.flags,
    ]
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            args,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, "KUBECONFIG": env.kubeconfig, **extra_env},
        )
    deadline = time.monotonic() + 60
    while True:
        with contextlib.suppress(OSError):
            scrape(port)
            return Operator(proc, port, log)
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"operator did not start: {log.read_text()[-2000:]}")
        time.sleep(0.1)


def stop(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM) -> None:
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def start_fleet(
    env: Env, ns: str, workers: int, *extra: str, tag: str
) -> tuple[subprocess.Popen[bytes], Path]:
    log = env.workdir / safe(f"fleet-{tag}.log")
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                str(HERE / "load_fleet.py"),
                "--kubeconfig",
                env.kubeconfig,
                "--namespace",
                ns,
                "--workers",
                str(workers),
                *extra,
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    deadline = time.monotonic() + 120
    while '"ready"' not in log.read_text():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"fleet did not start: {log.read_text()[-2000:]}")
        time.sleep(0.2)
    return proc, log


async def make_namespace(env: Env) -> str:
    ns = f"load-{uuid.uuid4().hex[:6]}"
    await env.api.request("POST", "/api/v1/namespaces", {"metadata": {"name": ns}})
    return ns


async def drop_namespace(env: Env, ns: str) -> None:
    """Delete ``ns`` and wait until it is gone, so its clean-up does not count as the
    next scenario's writes."""
    await env.api.request("DELETE", f"/api/v1/namespaces/{ns}", ok=(200, 202))
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        status, _ = await env.api.request("GET", f"/api/v1/namespaces/{ns}")
        if status == 404:
            return
        await asyncio.sleep(0.5)


async def create_workers(env: Env, ns: str, count: int, max_in_flight: int) -> None:
    def body(i: int) -> dict[str, Any]:
        return {
            "apiVersion": "agentq.dev/v1alpha1",
            "kind": "AgentWorker",
            "metadata": {"name": f"w{i:04d}"},
            "spec": {"capabilities": ["llm"], "maxInFlight": max_in_flight},
        }

    await bounded(
        [lambda i=i: env.api.request("POST", WORKERS.format(ns=ns), body(i)) for i in range(count)],  # type: ignore[misc]
        32,
    )


async def create_tasks(
    env: Env, ns: str, count: int, lease: int, queues: list[str] | None = None
) -> None:
    """``count`` pending tasks; with ``queues``, task ``i`` names ``queues[i % n]`` (so
    they arrive interleaved, each queue's backlog as old as the others')."""

    def body(i: int) -> dict[str, Any]:
        spec: dict[str, Any] = {
            "requiredCapabilities": ["llm"],
            "leaseDurationSeconds": lease,
            "maxReclaims": 5,
            "retryBackoff": {"initialSeconds": 0},
            "payload": {"prompt": f"task {i}"},
        }
        if queues:
            spec["queue"] = queues[i % len(queues)]
        return {
            "apiVersion": "agentq.dev/v1alpha1",
            "kind": "AgentTask",
            "metadata": {"name": f"t{i:05d}"},
            "spec": spec,
        }

    await bounded(
        [lambda i=i: env.api.request("POST", TASKS.format(ns=ns), body(i)) for i in range(count)],  # type: ignore[misc]
        32,
    )


async def create_queues(env: Env, ns: str, weights: tuple[float, ...]) -> list[str]:
    """One leaf AgentQueue per weight (cluster-scoped, named after ``ns``), each selecting
    ``ns`` by its name label and drawing on the workers of ``ns``."""
    names = [f"{ns}-q{i}" for i in range(len(weights))]
    for name, weight in zip(names, weights, strict=True):
        status, reply = await env.api.request(
            "POST",
            QUEUES,
            {
                "apiVersion": "agentq.dev/v1alpha1",
                "kind": "AgentQueue",
                "metadata": {"name": name},
                "spec": {
                    "weight": weight,
                    "namespaceSelector": {
                        "matchLabels": {"kubernetes.io/metadata.name": ns},
                    },
                    "workerNamespace": ns,
                },
            },
        )
        if status != 201:
            raise RuntimeError(f"AgentQueue {name}: HTTP {status}: {str(reply)[:300]}")
    return names


async def drop_queues(env: Env, names: list[str]) -> None:
    for name in names:
        await env.api.request("DELETE", f"{QUEUES}/{name}", ok=(200, 202, 404))


def queue_weights(count: int, weights: tuple[float, ...]) -> tuple[float, ...]:
    """The weights of ``count`` queues: ``weights`` in order, 1 past its end."""
    return tuple(weights[i] if i < len(weights) else 1.0 for i in range(count))


def share_gap(tasks: list[dict[str, Any]], weights: dict[str, float]) -> dict[str, Any]:
    """How evenly the queue level shared the grants, read back from the tasks: fencing
    tokens rise with every grant, in the order the operator decided them. Over every
    prefix of that order while every queue still had a backlog (up to the grant that
    emptied the first queue), the largest ``|a_i / w_i - a_j / w_j|`` of two queues (``a``
    the cost granted from each, every task of cost 1), divided by its bound ``C / w_i +
    C / w_j`` (docs/tenancy.md, "The bound, at every level"): at most 1 when the bound
    holds."""
    order = sorted(
        (int((t.get("status") or {}).get("fencingToken") or 0), t["spec"].get("queue"))
        for t in tasks
        if (t.get("status") or {}).get("fencingToken")
    )
    total = collections.Counter(q for _, q in order)
    if len(total) < 2:
        return {"share_gap": math.nan, "share_window": 0}
    served: collections.Counter[str] = collections.Counter()
    worst = 0.0
    window = 0
    for _, q in order:
        served[q] += 1
        window += 1
        for i, j in itertools.combinations(weights, 2):
            gap = abs(served[i] / weights[i] - served[j] / weights[j])
            worst = max(worst, gap / (1 / weights[i] + 1 / weights[j]))
        if served[q] == total[q]:
            break  # the first queue to run out: the shared backlog ends here
    return {"share_gap": worst, "share_window": window}


# -- scenarios ---------------------------------------------------------------------------


@dataclass
class Result:
    name: str
    figures: dict[str, Any] = field(default_factory=dict)
    writes: dict[str, float] = field(default_factory=dict)


async def raw_write_rate(env: Env, count: int = 2000) -> Result:
    ns = await make_namespace(env)
    try:

        def body(i: int) -> dict[str, Any]:
            return {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": f"raw-{i}"},
                "spec": {"holderIdentity": "bench", "leaseDurationSeconds": 30},
            }

        cpu0 = {k: cpu_seconds(p) for k, p in env.pids.items()}
        started = time.monotonic()
        await bounded(
            [
                lambda i=i: env.api.request("POST", LEASES.format(ns=ns), body(i))  # type: ignore[misc]
                for i in range(count)
            ],
            32,
        )
        took = time.monotonic() - started
        cpu = {k: cpu_seconds(p) - cpu0[k] for k, p in env.pids.items()}
        return Result(
            "raw",
            {
                "writes_per_s": count / took,
                "apiserver_cpu_ms_per_write": 1000 * cpu["kube-apiserver"] / count,
                "etcd_cpu_ms_per_write": 1000 * cpu["etcd"] / count,
            },
        )
    finally:
        await drop_namespace(env, ns)


def assigned_event(ns: str, task: dict[str, Any]) -> dict[str, Any]:
    """The Event a grant records on its task (as the operator writes it)."""
    stamp = "2026-01-01T00:00:00Z"
    meta = task["metadata"]
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{meta['name']}."},
        "involvedObject": {
            "apiVersion": "agentq.dev/v1alpha1",
            "kind": "AgentTask",
            "name": meta["name"],
            "namespace": ns,
            "uid": meta["uid"],
        },
        "reason": "Assigned",
        "message": "attempt 1 assigned to worker w0000",
        "type": "Normal",
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }


async def raw_grant_rate(env: Env, count: int = 1000, concurrency: int = 32) -> Result:
    """The ceiling for the grant's own write mix: a plain client makes, per pending task,
    the writes of one grant -- the status CAS (merge patch with the resourceVersion),
    the Lease create (owned by the task), the Event -- one after the other, ``concurrency``
    tasks at a time, with no operator running. A status patch of a custom resource costs
    the API server several times a Lease create, so the raw Lease rate alone overstates
    what a grant can reach."""
    ns = await make_namespace(env)
    try:
        await create_tasks(env, ns, count, lease=900)
        items, _ = await env.api.list_all(TASKS.format(ns=ns))
        stamp = "2026-01-01T00:00:00Z"

        async def grant(i: int, task: dict[str, Any]) -> None:
            meta = task["metadata"]
            name = meta["name"]
            token = 1_000_000 + i
            await env.api.request(
                "PATCH",
                TASKS.format(ns=ns) + f"/{name}/status",
                {
                    "metadata": {"resourceVersion": meta["resourceVersion"]},
                    "status": {
                        "phase": "Assigned",
                        "worker": "w0000",
                        "attempt": 1,
                        "reclaims": 0,
                        "fencingToken": token,
                        "leaseName": f"agentq-task-{name}",
                        "assignedAt": stamp,
                        "lastTransitionTime": stamp,
                        "conditions": [
                            {
                                "type": "Assigned",
                                "status": "True",
                                "reason": "Assigned",
                                "message": "assigned to w0000",
                                "lastTransitionTime": stamp,
                            }
                        ],
                    },
                },
                content_type="application/merge-patch+json",
            )
            await env.api.request(
                "POST",
                LEASES.format(ns=ns),
                {
                    "apiVersion": "coordination.k8s.io/v1",
                    "kind": "Lease",
                    "metadata": {
                        "name": f"agentq-task-{name}",
                        "labels": {"agentq.dev/lease": "task", "agentq.dev/task": name},
                        "annotations": {"agentq.dev/fencing-token": str(token)},
                        "ownerReferences": [
                            {
                                "apiVersion": "agentq.dev/v1alpha1",
                                "kind": "AgentTask",
                                "name": name,
                                "uid": meta["uid"],
                            }
                        ],
                    },
                    "spec": {"holderIdentity": "w0000", "leaseDurationSeconds": 900},
                },
            )
            await env.api.request(
                "POST", f"/api/v1/namespaces/{ns}/events", assigned_event(ns, task)
            )

        async def status_only(i: int, task: dict[str, Any]) -> None:
            # A reclaim's one write: the status CAS alone (what 500 reclaims at once queue).
            meta = task["metadata"]
            await env.api.request(
                "PATCH",
                TASKS.format(ns=ns) + f"/{meta['name']}/status",
                {
                    "metadata": {"resourceVersion": meta["resourceVersion"]},
                    "status": {"phase": "Pending", "attempt": 1, "fencingToken": 2_000_000 + i},
                },
                content_type="application/merge-patch+json",
            )

        cpu0 = {k: cpu_seconds(p) for k, p in env.pids.items()}
        started = time.monotonic()
        await bounded(
            [lambda i=i, t=t: status_only(i, t) for i, t in enumerate(items)],  # type: ignore[misc]
            concurrency,
        )
        status_took = time.monotonic() - started
        items, _ = await env.api.list_all(TASKS.format(ns=ns))
        cpu1 = {k: cpu_seconds(p) for k, p in env.pids.items()}
        started = time.monotonic()
        await bounded(
            [lambda i=i, t=t: grant(i, t) for i, t in enumerate(items)],  # type: ignore[misc]
            concurrency,
        )
        took = time.monotonic() - started
        cpu = {k: cpu_seconds(p) - cpu1[k] for k, p in env.pids.items()}
        return Result(
            "raw-grants",
            {
                "grants_per_s": len(items) / took,
                "apiserver_cpu_ms_per_grant": 1000 * cpu["kube-apiserver"] / len(items),
                "etcd_cpu_ms_per_grant": 1000 * cpu["etcd"] / len(items),
                "status_patches_per_s": len(items) / status_took,
                "apiserver_cpu_ms_per_status_patch": 1000
                * (cpu1["kube-apiserver"] - cpu0["kube-apiserver"])
                / len(items),
            },
        )
    finally:
        await drop_namespace(env, ns)


PROBE_GROUP = "probe.bench.agentq.dev"


def probe_crd() -> dict[str, Any]:
    """A custom resource with no schema at all (``x-kubernetes-preserve-unknown-fields``)
    and a status subresource: what a custom resource's write costs before any schema."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"probes.{PROBE_GROUP}"},
        "spec": {
            "group": PROBE_GROUP,
            "scope": "Namespaced",
            "names": {"plural": "probes", "singular": "probe", "kind": "Probe"},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "x-kubernetes-preserve-unknown-fields": True,
                        }
                    },
                }
            ],
        },
    }


async def request_costs(env: Env, count: int = 500, concurrency: int = 32) -> Result:
    """What one request of each kind the operator makes costs the API server, measured
    alone with a plain client: Lease create / GET / LIST of one worker's 50 claims (of
    500) / DELETE, Event create, and the status CAS of an AgentTask beside that of a
    schema-less custom resource of the same content -- so the ceiling the raw Lease rate
    sets can be read against what a grant's writes really cost."""
    ns = await make_namespace(env)
    crd_path = env.workdir / "probe-crd.json"
    crd_path.write_text(json.dumps(probe_crd()))
    kubectl(env, "apply", "-f", str(crd_path))
    kubectl(
        env, "wait", "--for=condition=Established", "--timeout=60s", f"crd/probes.{PROBE_GROUP}"
    )
    rows: dict[str, dict[str, float]] = {}
    stamp = "2026-01-01T00:00:00Z"

    async def measure(label: str, jobs: list[Any]) -> None:
        cpu0 = {k: cpu_seconds(p) for k, p in env.pids.items()}
        started = time.monotonic()
        replies = await bounded(jobs, concurrency)
        took = time.monotonic() - started
        cpu = {k: cpu_seconds(p) - cpu0[k] for k, p in env.pids.items()}
        bad = [r for r in replies if r[0] not in (200, 201)]
        if bad:
            raise RuntimeError(f"{label}: {len(bad)} failed, e.g. {str(bad[0])[:300]}")
        rows[label] = {
            "per_s": len(jobs) / took,
            "apiserver_ms": 1000 * cpu["kube-apiserver"] / len(jobs),
            "etcd_ms": 1000 * cpu["etcd"] / len(jobs),
        }
        print(f"   {label}: {rows[label]}", flush=True)

    def running(i: int, obj: dict[str, Any]) -> dict[str, Any]:
        return {
            "metadata": {"resourceVersion": obj["metadata"]["resourceVersion"]},
            "status": {
                "phase": "Assigned",
                "worker": f"w{i % 10:04d}",
                "attempt": 1,
                "reclaims": 0,
                "fencingToken": 1000 + i,
                "leaseName": f"agentq-task-{obj['metadata']['name']}",
                "assignedAt": stamp,
                "lastTransitionTime": stamp,
            },
        }

    try:
        await create_tasks(env, ns, count, lease=900)
        tasks, _ = await env.api.list_all(TASKS.format(ns=ns))
        probes_path = f"/apis/{PROBE_GROUP}/v1/namespaces/{ns}/probes"
        await bounded(
            [
                lambda t=t: env.api.request(  # type: ignore[misc]
                    "POST",
                    probes_path,
                    {
                        "apiVersion": f"{PROBE_GROUP}/v1",
                        "kind": "Probe",
                        "metadata": {"name": t["metadata"]["name"]},
                        "spec": t["spec"],
                    },
                )
                for t in tasks
            ],
            concurrency,
        )
        probes, _ = await env.api.list_all(probes_path)

        def lease(i: int, t: dict[str, Any]) -> dict[str, Any]:
            name = t["metadata"]["name"]
            return {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {
                    "name": f"agentq-task-{name}",
                    "labels": {
                        "agentq.dev/lease": "task",
                        "agentq.dev/task": name,
                        "agentq.dev/worker": f"w{i % 10:04d}",
                    },
                },
                "spec": {"holderIdentity": f"w{i % 10:04d}", "leaseDurationSeconds": 5},
            }

        leases_path = LEASES.format(ns=ns)
        await measure(
            "Lease create",
            [
                lambda i=i, t=t: env.api.request("POST", leases_path, lease(i, t))
                for i, t in enumerate(tasks)
            ],
        )
        await measure(
            "Lease GET",
            [
                lambda t=t: env.api.request(
                    "GET", f"{leases_path}/agentq-task-{t['metadata']['name']}"
                )
                for t in tasks
            ],
        )
        await measure(
            "Lease LIST by worker label (50 of 500)",
            [
                lambda i=i: env.api.request(
                    "GET",
                    f"{leases_path}?labelSelector=agentq.dev/lease%3Dtask,"
                    f"agentq.dev/worker%3Dw{i % 10:04d}",
                )
                for i in range(count // 5)
            ],
        )
        await measure(
            "Event create",
            [
                lambda t=t: env.api.request(
                    "POST", f"/api/v1/namespaces/{ns}/events", assigned_event(ns, t)
                )
                for t in tasks
            ],
        )
        for label, path, objects in (
            ("AgentTask status CAS (merge patch)", TASKS.format(ns=ns), tasks),
            ("schema-less custom resource status CAS (same patch)", probes_path, probes),
        ):
            await measure(
                label,
                [
                    lambda i=i, o=o, path=path: env.api.request(
                        "PATCH",
                        f"{path}/{o['metadata']['name']}/status",
                        running(i, o),
                        content_type="application/merge-patch+json",
                    )
                    for i, o in enumerate(objects)
                ],
            )
        listed, _ = await env.api.list_all(leases_path)
        await measure(
            "Lease DELETE (resourceVersion precondition)",
            [
                lambda x=x: env.api.request(
                    "DELETE",
                    f"{leases_path}/{x['metadata']['name']}",
                    {"preconditions": {"resourceVersion": x["metadata"]["resourceVersion"]}},
                )
                for x in listed
                if x["metadata"]["name"].startswith("agentq-task-")
            ],
        )
        return Result("request-costs", {"rows": rows})
    finally:
        await drop_namespace(env, ns)
        kubectl(env, "delete", "--ignore-not-found", "-f", str(crd_path), check=False)


def py_spy(pid: int, out: Path, seconds: float) -> subprocess.Popen[bytes] | None:
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
            str(int(seconds)),
            "--output",
            str(out),
            "--nonblocking",
            "--gil",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


# Where a sample's time goes, by the first rule that matches a frame of its stack.
_CATEGORIES = (
    ("sync client in threads", ("concurrent/futures/thread.py",)),
    ("kopf (watch + per-event handling)", ("kopf/",)),
    ("informer (watch streams, decoding)", ("agentq/operator/informer",)),
    (
        "queue level (AgentQueues: tree, turns, status)",
        ("agentq/operator/tenants", "agentq/scheduler/tenancy", "agentq/operator/queue_status"),
    ),
    ("scheduler core", ("agentq/scheduler/",)),
    ("decisions (claims, lifecycle)", ("agentq/claims", "agentq/lifecycle", "agentq/expiry")),
    (
        "views and caches",
        ("agentq/operator/cache", "agentq/operator/views", "agentq/operator/store"),
    ),
    ("async REST client (aiohttp)", ("agentq/operator/rest", "aiohttp/")),
    (
        "controller (loop, commit, dispatch, publish, slots, events)",
        (
            "agentq/operator/controller",
            "agentq/operator/commit",
            "agentq/operator/dispatch",
            "agentq/operator/publish",
            "agentq/operator/readiness",
            "agentq/operator/slots",
            "agentq/operator/events",
        ),
    ),
    ("metrics", ("prometheus_client/",)),
)


def storm_cpu(figures: dict[str, Any]) -> str:
    cpu = figures.get("cpu_s") or {}
    parts = [cpu.get("operator"), cpu.get("kube-apiserver"), cpu.get("etcd")]
    return " / ".join("-" if v is None else f"{v:.2f}" for v in parts)


def top_of_profile(raw: Path, limit: int = 8) -> list[tuple[str, float]]:
    """Shares of a py-spy raw (collapsed) profile: by category, then the hottest leaves."""
    by_category: collections.Counter[str] = collections.Counter()
    leaves: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        n = int(count)
        total += n
        frames = stack.split(";")
        category = next(
            (name for name, marks in _CATEGORIES if any(m in f for f in frames for m in marks)),
            "other (event loop, ssl, json, ...)",
        )
        by_category[category] += n
        leaf = frames[-1]
        func = leaf.split(" (")[0]
        where = leaf.split(" (")[1].rstrip(")") if " (" in leaf else ""
        module = where.split("site-packages/")[-1].split("/operator/agentq/")[-1].split(":")[0]
        leaves[f"{func} ({module})"] += n
    shares = [(f"[{k}]", 100 * v / max(1, total)) for k, v in by_category.most_common()]
    shares += [(k, 100 * v / max(1, total)) for k, v in leaves.most_common(limit)]
    return shares


async def register_fleet(env: Env, ns: str, variant: Variant, workers: int, *, tag: str) -> int:
    """Run an operator until every worker of ``ns`` shows Ready, then stop it (SIGTERM:
    it releases its leader Lease). Returns the AgentWorker status writes it made."""
    before = await apiserver_writes(env.api)
    operator = start_operator(env, ns, variant, f"{tag}-register")
    try:
        deadline = time.monotonic() + 120 + workers / 5
        while True:
            items, _ = await env.api.list_all(WORKERS.format(ns=ns))
            ready = sum(1 for w in items if (w.get("status") or {}).get("phase") == "Ready")
            if ready >= workers:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"{ready} of {workers} workers Ready: {operator.log}")
            await asyncio.sleep(0.5)
    finally:
        stop(operator.proc)
    after = await quiet_writes(env.api, limit=30.0)
    key = ("agentworkers/status", "PATCH")
    return int(after.get(key, 0) - before.get(key, 0))


async def dispatch(
    env: Env,
    variant: Variant,
    tasks: int,
    workers: int,
    *,
    profile: bool,
    renewals: bool,
    queues: tuple[float, ...] = (),
) -> Result:
    """A backlog of ``tasks`` over ``workers`` drained by the operator. ``queues``: the
    weights of as many AgentQueues the tasks are spread over (task ``i`` in queue ``i %
    n``), every queue drawing on the workers of the tasks' own namespace; none: the tasks
    name no queue (the namespace is its own, single queue)."""
    shape = f", {len(queues)} queue{'s' if len(queues) > 1 else ''}" if queues else ""
    name = f"dispatch {tasks:,}/{workers:,}{shape} [{variant.name}]"
    tag = f"{tasks}-q{len(queues)}"
    print(f"== {name}", flush=True)
    install_crds(env, variant)
    ns = await make_namespace(env)
    fleet = operator = None
    queue_names: list[str] = []
    try:
        per_worker = math.ceil(tasks / workers) + 1
        await create_workers(env, ns, workers, per_worker)
        fleet, _ = start_fleet(env, ns, workers, tag=f"{variant.name}-{tag}")
        if queues:
            queue_names = await create_queues(env, ns, queues)
        # The fleet is registered before the backlog arrives, as in a cluster that runs:
        # an operator has seen every worker Ready once (one status write per new worker,
        # counted apart), then stops; the backlog is created; the measured operator
        # starts on it.
        registration_writes = await register_fleet(env, ns, variant, workers, tag=tag)
        await create_tasks(env, ns, tasks, lease=900, queues=queue_names)
        # When each task was first seen granted: from a watch of our own, opened before the
        # operator starts, so measuring costs the operator nothing (scraping would).
        granted: dict[str, float] = {}
        connected = asyncio.Event()
        watcher = asyncio.create_task(watch_grants(env, ns, granted, connected))
        await asyncio.wait_for(connected.wait(), timeout=60)
        writes0 = await apiserver_writes(env.api)
        cpu0 = {k: cpu_seconds(p) for k, p in env.pids.items()}
        operator = start_operator(env, ns, variant, tag)
        op_cpu0 = cpu_seconds(operator.pid)
        spy = None
        if profile:
            OUT.mkdir(exist_ok=True)
            spy_out = OUT / safe(f"profile-{variant.name}-{tag}.txt")
            spy = py_spy(operator.pid, spy_out, seconds=600)
        samples: list[tuple[float, int, float]] = []  # (t, granted so far, operator cpu)
        deadline = time.monotonic() + max(300, tasks / 5)
        while True:
            t = time.monotonic()
            samples.append((t, len(granted), cpu_seconds(operator.pid)))
            if len(granted) >= tasks or t > deadline:
                break
            await asyncio.sleep(0.25)
        watcher.cancel()
        rss_now, rss_peak = rss_mb(operator.pid)
        if spy is not None:
            spy.send_signal(signal.SIGINT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                spy.wait(timeout=30)
        # Events yield to decisions: they are written when the drain is over. Count the
        # writes once the operator's queue of Events is empty and its writes have stopped.
        events_lag = await events_written(operator, since=times_last(granted))
        # API server and etcd CPU up to here (the drain and its Events), not while waiting
        # for the writes to stop: the fleet's worker-Lease renewals and the idle control
        # plane go on meanwhile, and a slower trickle of late writes (a worker's status)
        # made a variant look dearer per dispatch by the length of the wait alone.
        cpu = {k: cpu_seconds(p) - cpu0[k] for k, p in env.pids.items()}
        writes1 = await quiet_writes(env.api, limit=120.0)
        done = len(granted)
        times = sorted(granted.values())
        span = max(1e-6, times[-1] - times[0]) if times else 1e-6
        # The longest stretch without a new grant, between the first grant and the last.
        gap = max((b - a for a, b in itertools.pairwise(times)), default=0.0)
        # Operator CPU over the drain: the samples closest to its first and last grant.
        first = min(samples, key=lambda s: abs(s[0] - times[0])) if times else samples[0]
        last = min(samples, key=lambda s: abs(s[0] - times[-1])) if times else samples[-1]
        op_cpu = last[2] - first[2]
        delta = {
            k: writes1[k] - writes0.get(k, 0)
            for k in writes1
            if writes1[k] - writes0.get(k, 0) and k[0] in OPERATOR_RESOURCES
        }
        # Lease PUTs are the fleet's worker-Lease renewals (and the operator's leader-election
        # renewals, one per 2 s): listed apart, not counted per dispatch.
        fleet_puts = delta.pop(("leases", "PUT"), 0)
        per = {f"{r} {v}": c / max(1, done) for (r, v), c in sorted(delta.items())}
        total = sum(per.values())
        figures: dict[str, Any] = {
            "dispatched": int(done),
            "seconds": span,
            "tasks_per_s": (done - 1) / span if done > 1 else 0.0,
            "max_gap_s": gap,
            "writes_per_dispatch": total,
            "operator_cpu_ms_per_dispatch": 1000 * op_cpu / max(1, last[1] - first[1]),
            "operator_cpu_ms_total": 1000 * (samples[-1][2] - op_cpu0),
            "apiserver_cpu_ms_per_dispatch": 1000 * cpu["kube-apiserver"] / max(1, done),
            "etcd_cpu_ms_per_dispatch": 1000 * cpu["etcd"] / max(1, done),
            "operator_rss_mb": rss_now,
            "operator_rss_peak_mb": rss_peak,
            "fleet_lease_puts": fleet_puts,
            "events_lag_s": events_lag,
            "registration_writes_per_worker": registration_writes / max(1, workers),
        }
        if spy is not None:
            with contextlib.suppress(OSError, ValueError):
                figures["profile"] = top_of_profile(spy_out)
                figures["profile_file"] = str(spy_out.relative_to(ROOT))
        figures["tasks"] = tasks
        figures["queues"] = len(queues)
        figures["weights"] = list(queues)
        figures["variant"] = variant.name
        if queue_names:
            listed, _ = await env.api.list_all(TASKS.format(ns=ns))
            figures.update(share_gap(listed, dict(zip(queue_names, queues, strict=True))))
        if renewals and done >= tasks:
            figures.update(await renewal_cost(env, ns, workers, operator, tasks))
        return Result(name, figures, per)
    finally:
        if operator is not None:
            stop(operator.proc)
        if fleet is not None:
            stop(fleet)
        await drop_namespace(env, ns)
        await drop_queues(env, queue_names)


def times_last(granted: dict[str, float]) -> float:
    return max(granted.values(), default=time.monotonic())


async def events_written(operator: Operator, *, since: float, limit: float = 300.0) -> float:
    """Seconds from ``since`` (the last grant) until the operator's queue of Events is
    empty (NaN for an operator without ``agentq_events_queued``)."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        try:
            queued = scrape(operator.metrics_port).get("agentq_events_queued")
        except OSError:
            return math.nan
        if queued is None:
            return math.nan
        if queued == 0:
            return max(0.0, time.monotonic() - since)
        await asyncio.sleep(0.25)
    return math.nan


async def quiet_writes(api: Api, *, limit: float = 20.0) -> collections.Counter[tuple[str, str]]:
    """The API server's write counters once the operator's writes stopped for a second
    (the worker Lease renewals of the fleet go on: they are PUTs, not counted)."""
    deadline = time.monotonic() + limit

    def counted(c: collections.Counter[tuple[str, str]]) -> int:
        return sum(v for (r, verb), v in c.items() if r in OPERATOR_RESOURCES and verb != "PUT")

    last = await apiserver_writes(api)
    while time.monotonic() < deadline:
        await asyncio.sleep(1.0)
        now = await apiserver_writes(api)
        if counted(now) == counted(last):
            return now
        last = now
    return last


async def watch_grants(
    env: Env, ns: str, granted: dict[str, float], connected: asyncio.Event
) -> None:
    """Record when each task of ``ns`` is first seen with a worker."""
    _, listed = await env.api.request("GET", TASKS.format(ns=ns) + "?limit=1")

    def seen(obj: dict[str, Any]) -> None:
        name = (obj.get("metadata") or {}).get("name")
        if (obj.get("status") or {}).get("worker") and name not in granted:
            granted[name] = time.monotonic()

    connected.set()
    await watch_tasks(env, ns, listed["metadata"]["resourceVersion"], seen)


async def renewal_cost(
    env: Env, ns: str, workers: int, operator: Operator, tasks: int
) -> dict[str, Any]:
    """Operator CPU and writes per task-Lease renewal, every task held."""
    print("   renewal cost", flush=True)
    await asyncio.sleep(3)
    idle_t0, idle_c0 = time.monotonic(), cpu_seconds(operator.pid)
    await asyncio.sleep(10)
    idle_rate = (cpu_seconds(operator.pid) - idle_c0) / (time.monotonic() - idle_t0)
    log = env.workdir / f"renew-{ns}.log"
    # Back-to-back rounds: the first one also starts every attempt (Assigned -> Running,
    # one status write each); the second is renewals alone, and is what is measured.
    holder = subprocess.Popen(
        [
            sys.executable,
            str(HERE / "load_fleet.py"),
            "--kubeconfig",
            env.kubeconfig,
            "--namespace",
            ns,
            "--workers",
            "0",
            "--hold",
            "--task-renew-seconds",
            "0",
        ],
        stdout=open(log, "wb"),  # noqa: SIM115 - closed with the process
        stderr=subprocess.STDOUT,
    )

    def rounds() -> list[dict[str, Any]]:
        return [json.loads(x) for x in log.read_text().splitlines() if '"round"' in x]

    deadline = time.monotonic() + 900
    while not rounds() and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    # The first round's transitions (Running) are written before renewals are measured.
    while time.monotonic() < deadline:
        items, _ = await env.api.list_all(TASKS.format(ns=ns))
        if all((t.get("status") or {}).get("phase") == "Running" for t in items):
            break
        await asyncio.sleep(1)
    # Counted from when the previous phase's writes (the Running transitions, their
    # Events, written off the decision path) have stopped.
    writes0 = await quiet_writes(env.api, limit=60.0)
    c0, t0 = cpu_seconds(operator.pid), time.monotonic()
    measured_from = len(rounds())
    while len(rounds()) < measured_from + 1 and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    await asyncio.sleep(2)  # the last events reach the operator
    stop(holder)
    renewed = int(rounds()[measured_from]["renewed"])
    elapsed = time.monotonic() - t0
    used = cpu_seconds(operator.pid) - c0 - idle_rate * elapsed
    writes1 = await apiserver_writes(env.api)
    delta = {k: writes1[k] - writes0.get(k, 0) for k in writes1}
    operator_writes = sum(
        c for (r, v), c in delta.items() if c and not (r == "leases" and v == "PUT")
    )
    by = {f"{r} {v}": c for (r, v), c in sorted(delta.items()) if c}
    print(f"   writes during the renewal round, by resource and verb: {by}", flush=True)
    return {
        "renewals": renewed,
        "operator_cpu_ms_per_renewal": 1000 * max(0.0, used) / max(1, renewed),
        "operator_writes_during_renewals": operator_writes,
    }


async def reclaim(
    env: Env, variant: Variant, held: int = 500, lease: int = 5, *, profile: bool = False
) -> Result:
    name = f"reclaim {held} [{variant.name}]"
    print(f"== {name}", flush=True)
    install_crds(env, variant)
    ns = await make_namespace(env)
    fleet = operator = None
    workers = 10
    try:
        await create_workers(env, ns, workers, held // workers + 1)
        renew_log = env.workdir / f"renewed-{ns}.json"
        fleet, fleet_log = start_fleet(
            env,
            ns,
            workers,
            "--hold",
            "--task-renew-seconds",
            "1",
            "--concurrency",
            "64",
            "--renew-log",
            str(renew_log),
            tag=f"reclaim-{variant.name}",
        )
        operator = start_operator(env, ns, variant, "reclaim")
        await create_tasks(env, ns, held, lease=lease)
        # Wait until every task is Running (its holder renewed it at least once).
        deadline = time.monotonic() + 300
        while True:
            items, version = await env.api.list_all(TASKS.format(ns=ns))
            phases = collections.Counter((t.get("status") or {}).get("phase") for t in items)
            if phases.get("Running", 0) == held:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"not all Running: {phases}")
            await asyncio.sleep(1)
        await asyncio.sleep(2)
        reclaimed: dict[str, float] = {}
        watch = asyncio.create_task(watch_reclaims(env, ns, version, reclaimed))
        await asyncio.sleep(0.5)

        def rounds() -> int:
            return fleet_log.read_text().count('"round"')

        # Kill the holder right after a round of renewals completed, so the renew log
        # holds every Lease's true last renewal (a round cut short would be unrecorded).
        done_rounds = rounds()
        while rounds() == done_rounds:
            await asyncio.sleep(0.005)
        os.kill(fleet.pid, signal.SIGKILL)
        fleet.wait()
        killed = time.monotonic()
        requests0 = await apiserver_writes(env.api, verbs=None)
        cpu0 = {k: cpu_seconds(p) for k, p in env.pids.items()}
        cpu0["operator"] = cpu_seconds(operator.pid)
        spy = None
        if profile:
            OUT.mkdir(exist_ok=True)
            spy_out = OUT / safe(f"profile-reclaim-{variant.name}.txt")
            spy = py_spy(operator.pid, spy_out, seconds=lease + 30)
        last = json.loads(renew_log.read_text())
        while len(reclaimed) < held and time.monotonic() - killed < lease + 60:
            await asyncio.sleep(0.05)
        storm = time.monotonic() - killed
        cpu = {k: cpu_seconds(p) - cpu0[k] for k, p in env.pids.items()}
        cpu["operator"] = cpu_seconds(operator.pid) - cpu0["operator"]
        requests = await apiserver_writes(env.api, verbs=None) - requests0
        watch.cancel()
        print("   requests from the kill to the last reclaim:", flush=True)
        for (resource, verb), n in sorted(requests.items(), key=lambda kv: -kv[1]):
            print(f"   {n:6d}  {verb} {resource}", flush=True)
        if spy is not None:
            spy.send_signal(signal.SIGINT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                spy.wait(timeout=30)
            for label, share in top_of_profile(spy_out):
                print(f"   {share:5.1f}%  {label}", flush=True)
        latencies = sorted(
            reclaimed[t] - last[f"agentq-task-{t}"] for t in reclaimed if f"agentq-task-{t}" in last
        )
        # The raw times (monotonic, comparable with an operator's own) for a closer look.
        OUT.mkdir(exist_ok=True)
        (OUT / safe(f"reclaim-{variant.name}.json")).write_text(
            json.dumps({"killed": killed, "last_renewal": last, "reclaimed_seen": reclaimed})
        )

        def pct(p: float) -> float:
            return latencies[min(len(latencies) - 1, int(p * len(latencies)))]

        return Result(
            name,
            {
                "held": held,
                "lease_s": lease,
                "reclaimed": len(reclaimed),
                "p50_s": pct(0.5) if latencies else math.nan,
                "p99_s": pct(0.99) if latencies else math.nan,
                "max_s": latencies[-1] if latencies else math.nan,
                "renewal_spread_s": max(last.values()) - min(last.values()) if last else math.nan,
                # CPU seconds from the kill until the last reclaim was seen, per process
                # (the expiries come ``lease`` seconds after the kill: the rest is the storm).
                "storm_s": storm,
                "cpu_s": {k: round(v, 2) for k, v in cpu.items()},
            },
        )
    finally:
        if operator is not None:
            stop(operator.proc)
        if fleet is not None:
            stop(fleet)
        await drop_namespace(env, ns)


async def watch_reclaims(env: Env, ns: str, rv: str, reclaimed: dict[str, float]) -> None:
    """Record when each task of ``ns`` is first seen reclaimed (resuming on a drop)."""

    def seen(obj: dict[str, Any]) -> None:
        status = obj.get("status") or {}
        name = obj.get("metadata", {}).get("name")
        if (status.get("reclaims") or 0) >= 1 and name not in reclaimed:
            reclaimed[name] = time.monotonic()

    await watch_tasks(env, ns, rv, seen)


async def watch_tasks(env: Env, ns: str, rv: str, seen: Any) -> None:
    """Call ``seen(object)`` for every change of a task of ``ns`` after ``rv``; a dropped
    connection or a line cut short resumes from the last version seen."""
    while True:
        path = TASKS.format(ns=ns) + f"?watch=1&resourceVersion={rv}&allowWatchBookmarks=true"
        try:
            async with env.api.session.get(
                env.api.connection.server + path,
                headers=env.api.connection.headers(),
                timeout=aiohttp.ClientTimeout(total=None, sock_read=None),
            ) as rsp:
                buffer = b""
                async for chunk in rsp.content.iter_any():
                    buffer += chunk
                    *lines, buffer = buffer.split(b"\n")
                    for line in lines:
                        if not line.strip():
                            continue
                        event = json.loads(line)
                        obj = event.get("object") or {}
                        rv = (obj.get("metadata") or {}).get("resourceVersion") or rv
                        if event.get("type") in ("ADDED", "MODIFIED"):
                            seen(obj)
        except (aiohttp.ClientError, TimeoutError, ValueError) as err:
            print(f"tasks watch: {type(err).__name__}: {err}; resuming", flush=True)
            await asyncio.sleep(0.2)


# -- report ------------------------------------------------------------------------------


def fmt(value: Any, digits: int = 1) -> str:
    if isinstance(value, float):
        if math.isnan(value):
            return "-"
        return f"{value:,.{digits}f}"
    return f"{value:,}" if isinstance(value, int) else str(value)


def render(results: list[Result], command: str, started: float) -> str:
    raw = next((r for r in results if r.name == "raw"), None)
    lines = [
        SECTION_START,
        "## The operator under load (`make bench-load`)",
        "",
        "<!-- Generated by bench/load_bench.py; edit that script, not this section. -->",
        "",
        "Embedded control plane (etcd, kube-apiserver) on this machine, operator as a",
        "process, the agent fleet as one process (`bench/load_fleet.py`) renewing",
        "every worker Lease each 5 s. The fleet is registered first (an operator runs",
        "until every worker shows Ready, then stops), then a backlog of pending tasks",
        "is created and the operator started on it; throughput is timed from its first",
        "grant to its last. All figures of one run; the machine is shared, so compare",
        "the rows with each other rather than with another run.",
        "",
    ]
    if raw is not None:
        f = raw.figures
        lines += [
            f"Raw API server write rate (Lease creates, aiohttp, concurrency 32): "
            f"**{fmt(f['writes_per_s'], 0)} writes/s** "
            f"(API server {fmt(f['apiserver_cpu_ms_per_write'], 2)} ms and etcd "
            f"{fmt(f['etcd_cpu_ms_per_write'], 2)} ms CPU per write).",
            "",
        ]
    grants = next((r for r in results if r.name == "raw-grants"), None)
    if grants is not None:
        f = grants.figures
        lines += [
            "Raw grant rate (a plain client making each grant's writes -- status CAS, Lease "
            f"create, Event -- in sequence, 32 tasks at a time, no operator): "
            f"**{fmt(f['grants_per_s'], 0)} grants/s** (API server "
            f"{fmt(f['apiserver_cpu_ms_per_grant'], 2)} ms and etcd "
            f"{fmt(f['etcd_cpu_ms_per_grant'], 2)} ms CPU per grant). The status CAS alone "
            f"(a reclaim's one write), same client: **{fmt(f['status_patches_per_s'], 0)} "
            f"patches/s** (API server {fmt(f['apiserver_cpu_ms_per_status_patch'], 2)} ms "
            "CPU each).",
            "",
        ]
    costs = next((r for r in results if r.name == "request-costs"), None)
    if costs is not None:
        rows = costs.figures["rows"]
        base = rows.get("Lease create", {}).get("apiserver_ms") or math.nan
        lines += [
            "What one request of each kind costs, measured alone (same client, 500 of each, "
            "32 at a time; a namespace of 500 tasks and their 500 Leases):",
            "",
            "| request | per second | API server CPU ms | etcd CPU ms | API server CPU vs a "
            "Lease create |",
            "|---|--:|--:|--:|--:|",
        ]
        for label, row in rows.items():
            lines.append(
                f"| {label} | {fmt(row['per_s'], 0)} | {fmt(row['apiserver_ms'], 2)} | "
                f"{fmt(row['etcd_ms'], 2)} | {fmt(row['apiserver_ms'] / base, 1)}x |"
            )
        lines.append("")
    dispatches = [r for r in results if r.name.startswith("dispatch")]
    if dispatches:
        lines += [
            "| scenario | tasks/s | longest stall (s) | Events done after the last grant (s) "
            "| API writes / dispatch "
            "| operator CPU ms / dispatch | API server CPU ms / dispatch "
            "| etcd CPU ms / dispatch | operator RSS MB (peak) "
            "| ceiling: raw rate / writes | tasks/s vs ceiling | tasks/s vs raw grant rate |",
            "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
        ]
        for r in dispatches:
            f = r.figures
            ceiling = (
                raw.figures["writes_per_s"] / f["writes_per_dispatch"]
                if raw and f["writes_per_dispatch"]
                else math.nan
            )
            share = fmt(100 * f["tasks_per_s"] / ceiling, 0) if ceiling == ceiling else "-"
            cells = [
                r.name,
                fmt(f["tasks_per_s"]),
                fmt(f["max_gap_s"]),
                fmt(f.get("events_lag_s", math.nan)),
                fmt(f["writes_per_dispatch"], 2),
                fmt(f["operator_cpu_ms_per_dispatch"], 2),
                fmt(f["apiserver_cpu_ms_per_dispatch"], 2),
                fmt(f["etcd_cpu_ms_per_dispatch"], 2),
                f"{fmt(f['operator_rss_mb'], 0)} ({fmt(f['operator_rss_peak_mb'], 0)})",
                fmt(ceiling),
                f"{share} %",
                f"{fmt(100 * f['tasks_per_s'] / grants.figures['grants_per_s'], 0)} %"
                if grants is not None
                else "-",
            ]
            lines.append("| " + " | ".join(cells) + " |")
        lines += [
            "",
            "API writes per dispatch, by resource and verb (the drain of a registered fleet:",
            "each new worker's first status write, Ready, is made before the backlog and",
            "listed apart as writes per worker):",
            "",
        ]
        keys = sorted({k for r in dispatches for k in r.writes})
        lines.append("| scenario | " + " | ".join(keys) + " | registration / worker |")
        lines.append("|---|" + "--:|" * (len(keys) + 1))
        for r in dispatches:
            registration = r.figures.get("registration_writes_per_worker", math.nan)
            lines.append(
                f"| {r.name} | "
                + " | ".join(fmt(r.writes.get(k, 0.0), 3) for k in keys)
                + f" | {fmt(registration, 2)} |"
            )
        lines += render_queues(dispatches)
        renewal_rows = [r for r in dispatches if "renewals" in r.figures]
        if renewal_rows:
            lines += [
                "",
                "Renewals with every task held (each task Lease renewed once by the fleet):",
                "",
                "| scenario | renewals | operator CPU ms / renewal | operator writes during them |",
                "|---|--:|--:|--:|",
            ]
            for r in renewal_rows:
                f = r.figures
                cells = [
                    r.name,
                    fmt(f["renewals"]),
                    fmt(f["operator_cpu_ms_per_renewal"], 3),
                    fmt(f["operator_writes_during_renewals"]),
                ]
                lines.append("| " + " | ".join(cells) + " |")
    reclaims = [r for r in results if r.name.startswith("reclaim")]
    if reclaims:
        lines += [
            "",
            "Reclaim latency: held tasks whose holder (the fleet process) is SIGKILLed, from",
            "each Lease's last renewal to the status write that reclaims it:",
            "",
            "| scenario | lease (s) | reclaimed | p50 (s) | p99 (s) | max (s) "
            "| last renewals spread over (s) | the status CASes alone at the raw rate (s) "
            "| CPU s from the kill to the last reclaim: operator / API server / etcd |",
            "|---|--:|--:|--:|--:|--:|--:|--:|--:|",
        ]
        for r in reclaims:
            f = r.figures
            floor = (
                f["held"] / grants.figures["status_patches_per_s"]
                if grants is not None and grants.figures.get("status_patches_per_s")
                else math.nan
            )
            lines.append(
                f"| {r.name} | {f['lease_s']} | {f['reclaimed']} / {f['held']} | "
                f"{fmt(f['p50_s'], 2)} | {fmt(f['p99_s'], 2)} | {fmt(f['max_s'], 2)} | "
                f"{fmt(f.get('renewal_spread_s', math.nan), 2)} | {fmt(floor, 2)} | "
                f"{storm_cpu(f)} |"
            )
    profiles = [r for r in dispatches if r.figures.get("profile")]
    for r in profiles:
        lines += [
            "",
            f"py-spy, {r.name}: functions by share of samples (inclusive), "
            f"raw profile in `{r.figures['profile_file']}` (not committed):",
            "",
            "| function | % of samples |",
            "|---|--:|",
        ]
        for func, share in r.figures["profile"]:
            lines.append(f"| `{func}` | {share:.1f} |")
    load = os.getloadavg()
    lines += [
        "",
        "Measured with:",
        "",
        "```",
        command,
        "```",
        "",
        f"- machine: {platform.machine()}, {os.cpu_count()} CPUs, "
        f"{platform.system()} {platform.release()}",
        f"- Python {platform.python_version()}",
        f"- load average at the end: {load[0]:.2f}, {load[1]:.2f}, {load[2]:.2f}",
        f"- whole benchmark: {time.monotonic() - started:.0f} s",
        SECTION_END,
    ]
    return "\n".join(lines) + "\n"


def render_queues(dispatches: list[Result]) -> list[str]:
    """The backlogs spread over AgentQueues against the plain one of the same round and
    variant: the ratios of throughput and of CPU per dispatch, and how evenly the queue
    level shared the grants."""
    plain = {
        (r.figures.get("variant"), r.figures.get("round")): r
        for r in dispatches
        if r.figures.get("queues") == 0 and r.figures.get("tasks") == 1000
    }
    rows = [
        (r, plain[key])
        for r in dispatches
        if r.figures.get("queues")
        and (key := (r.figures.get("variant"), r.figures.get("round"))) in plain
    ]
    if not rows:
        return []

    def ratio(r: Result, base: Result, figure: str) -> float:
        b = float(base.figures[figure])
        return float(r.figures[figure]) / b if b else math.nan

    lines = [
        "",
        "The same backlog spread over AgentQueues (`--queues`): 1,000 tasks over the same",
        "50 workers, task *i* in queue *i* mod *n*, every queue a leaf selecting the tasks'",
        "namespace and drawing on its workers (the two-level dispatch of",
        "[tenancy.md](tenancy.md#how-the-operator-dispatches-built)), against the plain",
        "backlog (no queue) of the same round. *Share gap*: over the grants in the order the",
        "operator decided them (their fencing tokens) while every queue had a backlog, the",
        "largest `|a_i/w_i - a_j/w_j|` of two queues divided by its bound `C/w_i + C/w_j`",
        "([tenancy.md](tenancy.md#the-bound-at-every-level)): at most 1 when the bound holds.",
        "",
        "| scenario | weights | tasks/s | operator CPU ms / dispatch "
        "| API server CPU ms / dispatch | API writes / dispatch | tasks/s vs no queue "
        "| operator CPU vs no queue | API server CPU vs no queue | share gap / bound "
        "(grants) |",
        "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for r, base in rows:
        f = r.figures
        window = f.get("share_window", 0)
        gap = f"{fmt(f['share_gap'], 2)} ({window:,})" if window else "-"
        cells = [
            r.name,
            ":".join(f"{w:g}" for w in f.get("weights", [])),
            fmt(f["tasks_per_s"]),
            fmt(f["operator_cpu_ms_per_dispatch"], 2),
            fmt(f["apiserver_cpu_ms_per_dispatch"], 2),
            fmt(f["writes_per_dispatch"], 2),
            fmt(ratio(r, base, "tasks_per_s"), 2),
            fmt(ratio(r, base, "operator_cpu_ms_per_dispatch"), 2),
            fmt(ratio(r, base, "apiserver_cpu_ms_per_dispatch"), 2),
            gap,
        ]
        lines.append("| " + " | ".join(cells) + " |")
    # The issue's figure: the most queues against one queue (and against none), the
    # median over the rounds.
    by_count: dict[tuple[Any, int], dict[Any, Result]] = collections.defaultdict(dict)
    for r in dispatches:
        if r.figures.get("tasks") == 1000:
            key = (r.figures.get("variant"), r.figures.get("queues", 0))
            by_count[key][r.figures.get("round")] = r
    most = max(r.figures["queues"] for r, _ in rows)
    for variant in sorted({str(r.figures.get("variant")) for r, _ in rows}):
        top = by_count.get((variant, most), {})
        for base_count, label in ((1, "one queue"), (0, "no queue")):
            if base_count == most:
                continue
            under = by_count.get((variant, base_count), {})
            pairs = [(top[k], under[k]) for k in top if k in under]
            if not pairs:
                continue
            parts = [
                f"{what} {fmt(statistics.median(ratio(a, b, figure) for a, b in pairs), 2)}"
                for what, figure in (
                    ("tasks/s", "tasks_per_s"),
                    ("operator CPU / dispatch", "operator_cpu_ms_per_dispatch"),
                    ("API server CPU / dispatch", "apiserver_cpu_ms_per_dispatch"),
                )
            ]
            lines += [
                "",
                f"{most} queues against {label} [{variant}], median of {len(pairs)} "
                f"round{'s' if len(pairs) > 1 else ''}: " + ", ".join(parts) + ".",
            ]
    return lines


def write_docs(section: str) -> None:
    docsection.write_section(DOCS, SECTION_START, SECTION_END, section)


async def run(args: argparse.Namespace) -> list[Result]:
    variants = [Variant.parse(v) for v in args.variants.split(",")]
    workdir = Path(tempfile.mkdtemp(prefix="agentq-bench-load-"))
    cluster = Cluster(workdir / "cluster")
    state = cluster.up(build=True, tie_to_parent=True)
    api = Api(connect(state.kubeconfig))
    env = Env(state.kubeconfig, api, dict(state.pids), workdir, state.binaries["kubectl"])
    results: list[Result] = []
    try:
        install_crds(env)
        results.append(await raw_write_rate(env))
        print(results[-1], flush=True)
        results.append(await raw_grant_rate(env))
        print(results[-1], flush=True)
        if args.costs or args.only_costs:
            results.append(await request_costs(env))
        if args.only_costs:
            return results
        scenarios = [(1000, 50)] if args.quick else [(1000, 50), (10000, 1000)]
        queue_counts = [int(n) for n in args.queues.split(",") if n.strip()]
        weights = tuple(float(w) for w in args.queue_weights.split(",") if w.strip())
        if args.only_reclaim:
            scenarios = []
        for tasks, workers in scenarios:
            # Variants interleaved, ``--repeat`` times: on a shared machine the load moves
            # during a run, and interleaving spreads that over every variant alike.
            for round_ in range(args.repeat):
                for variant in variants:
                    if tasks > 1000 and variant.name not in args.large_variants.split(","):
                        continue
                    # At 1,000 tasks, the same backlog spread over AgentQueues too
                    # (``--queues``), beside the plain one; the order turns each round.
                    shapes: list[tuple[float, ...]] = [()]
                    if tasks == 1000 and variant.name in args.queue_variants.split(","):
                        shapes += [queue_weights(n, weights) for n in queue_counts]
                        turn = round_ % len(shapes)
                        shapes = shapes[turn:] + shapes[:turn]
                    for shape in shapes:
                        result = await dispatch(
                            env,
                            variant,
                            tasks,
                            workers,
                            profile=args.profile and tasks == 1000 and round_ == 0,
                            renewals=not args.no_renewals
                            and not shape
                            and (tasks > 1000 or args.quick),
                            queues=shape,
                        )
                        result.figures["round"] = round_
                        if args.repeat > 1:
                            result.name += f" #{round_ + 1}"
                        results.append(result)
                        print(json.dumps(results[-1].figures, default=str), flush=True)
        for variant in variants:
            if variant.name in args.reclaim_variants.split(","):
                results.append(
                    await reclaim(
                        env, variant, held=100 if args.quick else 500, profile=args.profile
                    )
                )
                print(results[-1], flush=True)
    finally:
        await api.close()
        cluster.down()
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            print(f"logs kept in {workdir}")
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="1,000/50 only, 100 reclaims")
    parser.add_argument(
        "--variants", default="new", help="comma list: new,kopf,threads,baseline=DIR"
    )
    parser.add_argument("--large-variants", default="new", help="variants run at 10,000/1,000")
    parser.add_argument("--reclaim-variants", default="new", help="variants run for reclaim")
    parser.add_argument("--profile", action="store_true", help="py-spy the 1,000/50 drains")
    parser.add_argument("--write-docs", action="store_true", help="update docs/benchmarks.md")
    parser.add_argument("--keep", action="store_true", help="keep the logs")
    parser.add_argument("--only-reclaim", action="store_true", help="the reclaim scenario only")
    parser.add_argument(
        "--costs", action="store_true", help="also what one request of each kind costs"
    )
    parser.add_argument("--only-costs", action="store_true", help="the request costs only")
    parser.add_argument("--repeat", type=int, default=1, help="run the dispatch variants N times")
    parser.add_argument("--no-renewals", action="store_true", help="skip the renewal-cost phase")
    parser.add_argument(
        "--queues",
        default="",
        help="comma list of AgentQueue counts: the 1,000-task backlog spread over that many "
        "queues too, beside the plain one (e.g. 1,4)",
    )
    parser.add_argument(
        "--queue-weights",
        default="1,1,1,2",
        help="the queues' weights in order (1 past the list's end)",
    )
    parser.add_argument(
        "--queue-variants", default="new", help="variants run with --queues (comma list)"
    )
    args = parser.parse_args()
    started = time.monotonic()
    results = asyncio.run(run(args))
    command = "python bench/load_bench.py " + " ".join(sys.argv[1:])
    section = render(results, command, started)
    print(section)
    if args.write_docs:
        write_docs(section)


if __name__ == "__main__":
    main()
