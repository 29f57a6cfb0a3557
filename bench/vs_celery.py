"""agentq on the faults the Celery figures of docs/comparison.md were measured with.

Runs each scenario on a real API server with the real operator and agent processes
(the demo's machinery, ``agentq.demo.Demo``), leases of 10 s to match Celery's 10 s
visibility timeout, and prints one line per figure (``--json`` for the raw numbers)::

    agentq cluster up && .venv/bin/python bench/vs_celery.py --kubeconfig "$KUBECONFIG"

1. killed worker: SIGKILL the agent holding a task; seconds until another worker holds it
2. frozen worker: SIGSTOP the holder past its lease, let another worker finish, SIGCONT;
   how many completions the task records (the zombie's must not count)
3. long task: 30 s of work under a 10 s lease; attempts
4. poison task: an agent that fails every attempt; attempts, and where it ends
5. tenants: 900 tasks of tenant A, then 100 of tenant B, one shared pool; B's share of
   the first 100 completions (``tenants_queues``: the same, each tenant's tasks naming
   its own AgentQueue of weight 1; ``tenants_xns``: the same with each tenant's tasks in
   its own namespace and the pool in a third, the claims read through the operator's
   claim API)
6. throughput: no-op tasks completed per second

The machine is shared and small: figures are for this run, with the command.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from kubernetes import client

from agentq import GROUP, VERSION
from agentq.controlplane.cluster import free_port
from agentq.demo import Demo
from agentq.ops.render import console

LEASE = 10


def _phase(task: dict[str, Any]) -> str:
    return str((task.get("status") or {}).get("phase") or "Pending")


def _wait(what: str, done: Callable[[], bool], timeout: float) -> float:
    started = time.monotonic()
    while not done():
        if time.monotonic() - started > timeout:
            raise TimeoutError(what)
        time.sleep(0.05)
    return time.monotonic() - started


class Scenario:
    def __init__(self, kubeconfig: str, workdir: Path, name: str) -> None:
        self.demo = Demo(
            kubeconfig=kubeconfig,
            namespace=f"vs-{name}-{uuid.uuid4().hex[:6]}",
            workdir=workdir / name,
            live=False,
            keep=False,
            out=console(),
        )
        self.demo.workdir.mkdir(parents=True, exist_ok=True)
        self.demo.fresh_namespace()

    def task(self, name: str) -> dict[str, Any]:
        return self.demo.cluster.task(name)

    def close(self) -> None:
        self.demo.stop()
        self.demo.core.delete_namespace(self.demo.namespace)


def _killed_once(kubeconfig: str, workdir: Path, run: int) -> float:
    s = Scenario(kubeconfig, workdir, f"kill{run}")
    try:
        d = s.demo
        d.worker("a", ["llm"], 1, 1)
        d.worker("b", ["llm"], 1, 1)
        d.start_agent("a", "hold")
        d.start_operator("--reconcile-interval", "2")
        d.task("job", 1, ["llm"], leaseDurationSeconds=LEASE, retryBackoff={"initialSeconds": 0})
        _wait("running on a", lambda: _phase(s.task("job")) == "Running", 60)
        d.start_agent("b", "complete", work_seconds=0.5)
        _wait(
            "b ready",
            lambda: (d.cluster.worker("b").get("status") or {}).get("phase") == "Ready",
            30,
        )
        d.kill_agent("a")
        return _wait(
            "re-dispatched to b",
            lambda: (s.task("job").get("status") or {}).get("worker") == "b",
            LEASE * 4,
        )
    finally:
        s.close()


def killed_worker(kubeconfig: str, workdir: Path, runs: int) -> dict[str, Any]:
    delays = [_killed_once(kubeconfig, workdir, run) for run in range(runs)]
    return {
        "runs": runs,
        "p50_seconds": round(statistics.median(delays), 1),
        "max_seconds": round(max(delays), 1),
    }


def _frozen_once(kubeconfig: str, workdir: Path, run: int) -> int:
    """How many completions the task records after a zombie woke up (1 is right)."""
    s = Scenario(kubeconfig, workdir, f"freeze{run}")
    try:
        d = s.demo
        d.worker("a", ["llm"], 1, 1)
        d.worker("b", ["llm"], 1, 1)
        d.start_agent("a", "complete", work_seconds=LEASE + 8)
        d.start_operator("--reconcile-interval", "2")
        d.task("job", 1, ["llm"], leaseDurationSeconds=LEASE, retryBackoff={"initialSeconds": 0})
        _wait("running on a", lambda: _phase(s.task("job")) == "Running", 60)
        frozen = d.agents["a"]  # the whole pod: the agent and its sidecar
        for proc in frozen:
            os.kill(proc.pid, signal.SIGSTOP)
        d.start_agent("b", "complete", work_seconds=0.5)
        _wait("done by b", lambda: _phase(s.task("job")) == "Succeeded", LEASE * 4)
        for proc in frozen:
            os.kill(proc.pid, signal.SIGCONT)
        time.sleep(LEASE)  # the zombie wakes, finishes its work and tries to report
        history = s.task("job")["status"].get("history") or []
        return sum(1 for h in history if h.get("outcome") == "Succeeded")
    finally:
        s.close()


def frozen_worker(kubeconfig: str, workdir: Path, runs: int) -> dict[str, Any]:
    counts = [_frozen_once(kubeconfig, workdir, run) for run in range(runs)]
    return {"runs": runs, "completed_twice": sum(1 for c in counts if c != 1)}


def long_task(kubeconfig: str, workdir: Path) -> dict[str, Any]:
    s = Scenario(kubeconfig, workdir, "long")
    try:
        d = s.demo
        d.worker("a", ["llm"], 1, 1)
        d.start_agent("a", "complete", work_seconds=3 * LEASE)
        d.start_operator()
        d.task("job", 1, ["llm"], leaseDurationSeconds=LEASE)
        took = _wait("done", lambda: _phase(s.task("job")) == "Succeeded", 10 * LEASE)
        return {"work_seconds": 3 * LEASE, "attempts": s.task("job")["status"]["attempt"],
                "seconds": round(took, 1)}  # fmt: skip
    finally:
        s.close()


def poison(kubeconfig: str, workdir: Path) -> dict[str, Any]:
    s = Scenario(kubeconfig, workdir, "poison")
    try:
        d = s.demo
        d.worker("a", ["llm"], 1, 1)
        d.start_agent("a", "fail", work_seconds=0.2)
        d.start_operator()  # MAX_RECLAIMS 3 and the default retry backoff (1 s, doubling)
        d.task("job", 1, ["llm"], leaseDurationSeconds=LEASE)
        took = _wait("dead-lettered", lambda: _phase(s.task("job")) == "DeadLettered", 120)
        time.sleep(5)
        status = s.task("job")["status"]
        return {"attempts": status["attempt"], "phase": status["phase"], "seconds": round(took, 1)}
    finally:
        s.close()


def _claim_token(d: Demo, worker: str) -> Path:
    """Worker ``worker``'s ServiceAccount (agentq-agent-<worker>, the pool's namespace)
    and a token of it for the operator's claim API (audience agentq.dev/operator), as
    the projected volume of manifests/agent/ holds it."""
    account = f"agentq-agent-{worker}"
    d.core.create_namespaced_service_account(
        d.namespace, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name=account))
    )
    issued = d.core.create_namespaced_service_account_token(
        account,
        d.namespace,
        client.AuthenticationV1TokenRequest(
            spec=client.V1TokenRequestSpec(
                audiences=["agentq.dev/operator"], expiration_seconds=3600
            )
        ),
    )
    path = d.workdir / f"claims-token-{worker}"
    path.write_text(str(issued.status.token))
    return path


def tenants(
    kubeconfig: str,
    workdir: Path,
    first: int = 900,
    second: int = 100,
    queues: bool = False,
    cross_namespace: bool = False,
) -> dict[str, Any]:
    """Tenant A's ``first`` tasks, then B's ``second`` after A's first 20 completions, on
    one pool of 4 workers x 5 slots (0.3 s of work each): B's share of the completions
    while both have a backlog. ``queues``: each tenant's tasks name its own AgentQueue
    (weights 1:1, the pool in the tasks' namespace, docs/tenancy.md); without, one
    namespace's oldest first. ``cross_namespace`` (with ``queues``): each tenant's tasks
    in a namespace of its own, the pool in a third; the sidecars read the claims'
    tasks from the operator's claim API on their workers' own tokens."""
    label = "tenants-x" if cross_namespace else "tenants-q" if queues else "tenants"
    s = Scenario(kubeconfig, workdir, label)
    made: list[str] = []
    homes: dict[str, str] = {}
    try:
        d = s.demo
        spec: dict[str, dict[str, Any]] = {"a": {}, "b": {}}
        for tenant in spec:
            homes[tenant] = f"{d.namespace}-{tenant}" if cross_namespace else d.namespace
            if cross_namespace:
                d.core.create_namespace(
                    client.V1Namespace(metadata=client.V1ObjectMeta(name=homes[tenant]))
                )
        if queues:
            for tenant in spec:
                name = f"{d.namespace}-{tenant}"
                d.custom.create_cluster_custom_object(
                    GROUP,
                    VERSION,
                    "agentqueues",
                    {
                        "apiVersion": f"{GROUP}/{VERSION}",
                        "kind": "AgentQueue",
                        "metadata": {"name": name},
                        "spec": {
                            "weight": 1,
                            "namespaceSelector": {
                                "matchLabels": {"kubernetes.io/metadata.name": homes[tenant]}
                            },
                            "workerNamespace": d.namespace,
                        },
                    },
                )
                made.append(name)
                spec[tenant] = {"queue": name}
        port = free_port()
        for i in range(4):
            d.worker(f"w{i}", ["llm"], 1, 5)
            flags: dict[str, Any] = {}
            if cross_namespace:
                flags = {
                    "operator_url": f"http://127.0.0.1:{port}",
                    "operator_token_file": str(_claim_token(d, f"w{i}")),
                }
            d.start_agent(f"w{i}", "complete", work_seconds=0.3, sidecar_flags=flags)
        if cross_namespace:
            d.start_operator(
                *[f for ns in homes.values() for f in ("--namespace", ns)],
                "--claim-port",
                str(port),
            )
        else:
            d.start_operator()

        def make(tenant: str, i: int) -> None:
            if not cross_namespace:
                d.task(f"{tenant}-{i:04d}", 1, ["llm"], leaseDurationSeconds=LEASE, **spec[tenant])
                return
            d.custom.create_namespaced_custom_object(
                GROUP,
                VERSION,
                homes[tenant],
                "agenttasks",
                {
                    "apiVersion": f"{GROUP}/{VERSION}",
                    "kind": "AgentTask",
                    "metadata": {"name": f"{tenant}-{i:04d}"},
                    "spec": {
                        "requiredCapabilities": ["llm"],
                        "cost": 1,
                        "leaseDurationSeconds": LEASE,
                        "payload": {"prompt": f"do {tenant}-{i:04d}"},
                        **spec[tenant],
                    },
                },
            )

        def submit(tenant: str, count: int) -> None:
            with ThreadPoolExecutor(8) as pool:
                list(pool.map(lambda i: make(tenant, i), range(count)))

        def all_tasks() -> list[dict[str, Any]]:
            return [t for ns in sorted(set(homes.values())) for t in d.cluster.tasks(ns)]

        def done_count() -> int:
            return sum(1 for t in all_tasks() if _phase(t) == "Succeeded")

        started = time.monotonic()
        submit("a", first)
        _wait("A's first 20 completions", lambda: done_count() >= 20, 600)
        submit("b", second)
        _wait("all done", lambda: done_count() >= first + second, 1800)
        took = time.monotonic() - started
        tasks = all_tasks()
        # finishedAt has whole seconds: within one, the order of the grants (tokens).
        done = sorted(
            tasks,
            key=lambda t: (t["status"]["finishedAt"], int(t["status"].get("fencingToken") or 0)),
        )
        names = [t["metadata"]["name"] for t in done]
        first_b = next(i for i, n in enumerate(names) if n.startswith("b-"))
        last_b = max(i for i, n in enumerate(names) if n.startswith("b-"))
        last_a = max(i for i, n in enumerate(names) if n.startswith("a-"))
        # From B's first completion until one tenant has none left: both backlogged.
        window = names[first_b : min(last_a, last_b) + 1]
        return {
            "queues": queues,
            "cross_namespace": cross_namespace,
            "seconds": round(took, 1),
            "reclaims": sum(int(t["status"].get("reclaims") or 0) for t in tasks),
            "worker_namespaces": sorted(
                {str(t["status"].get("workerNamespace") or d.namespace) for t in tasks}
            ),
            "completions_while_both_backlogged": len(window),
            "tenant_b_share_while_both_backlogged": round(
                sum(1 for n in window if n.startswith("b-")) / max(1, len(window)), 3
            ),
        }
    finally:
        s.close()
        for name in made:
            s.demo.custom.delete_cluster_custom_object(GROUP, VERSION, "agentqueues", name)
        for ns in set(homes.values()) - {s.demo.namespace}:
            s.demo.core.delete_namespace(ns)


def throughput(kubeconfig: str, workdir: Path, count: int = 400) -> dict[str, Any]:
    s = Scenario(kubeconfig, workdir, "throughput")
    try:
        d = s.demo
        for i in range(4):
            d.worker(f"w{i}", ["llm"], 1, 8)
            d.start_agent(f"w{i}", "complete", work_seconds=0)
        d.start_operator()
        _wait(
            "workers ready",
            lambda: all(
                (w.get("status") or {}).get("phase") == "Ready"
                for w in d.cluster.workers(d.namespace)
            ),
            60,
        )
        started = time.monotonic()
        # Eight clients create the tasks at once, so the figure is the queue's, not one
        # client's round trips.
        with ThreadPoolExecutor(8) as pool:
            list(
                pool.map(
                    lambda i: d.task(f"t-{i:04d}", 1, ["llm"], leaseDurationSeconds=LEASE),
                    range(count),
                )
            )
        submitted = time.monotonic() - started
        took = _wait(
            "all ended",
            lambda: all(
                _phase(t) in ("Succeeded", "Failed", "DeadLettered")
                for t in d.cluster.tasks(d.namespace)
            ),
            1800,
        )
        total = time.monotonic() - started
        tasks = d.cluster.tasks(d.namespace)
        return {
            "tasks": count,
            "succeeded": sum(1 for t in tasks if _phase(t) == "Succeeded"),
            "reclaims": sum(int(t["status"].get("reclaims") or 0) for t in tasks),
            "seconds": round(total, 1),
            "tasks_per_second": round(count / total, 1),
            "submit_seconds": round(submitted, 1),
            "after_submit_seconds": round(took, 1),
        }
    finally:
        s.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG"), required=False)
    parser.add_argument("--runs", type=int, default=5, help="runs of the kill and freeze cases")
    parser.add_argument("--only", nargs="*", help="scenario names to run")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if not args.kubeconfig:
        sys.exit('no kubeconfig: agentq cluster up && eval "$(agentq cluster env)"')
    workdir = Path(tempfile.mkdtemp(prefix="agentq-vs-celery-"))
    demo = Demo(kubeconfig=args.kubeconfig, namespace="default", workdir=workdir,
                live=False, keep=False, out=console())  # fmt: skip
    demo.install_crds()
    scenarios: dict[str, Callable[[], dict[str, Any]]] = {
        "killed_worker": lambda: killed_worker(args.kubeconfig, workdir, args.runs),
        "frozen_worker": lambda: frozen_worker(args.kubeconfig, workdir, max(args.runs, 7)),
        "long_task": lambda: long_task(args.kubeconfig, workdir),
        "poison": lambda: poison(args.kubeconfig, workdir),
        "tenants": lambda: tenants(args.kubeconfig, workdir),
        "tenants_queues": lambda: tenants(args.kubeconfig, workdir, queues=True),
        "tenants_xns": lambda: tenants(args.kubeconfig, workdir, queues=True, cross_namespace=True),
        "throughput": lambda: throughput(args.kubeconfig, workdir),
    }
    results = {}
    for name, run in scenarios.items():
        if args.only and name not in args.only:
            continue
        results[name] = run()
        if not args.json:
            print(f"{name}: {json.dumps(results[name])}", flush=True)
    if args.json:
        print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
