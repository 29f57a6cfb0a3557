"""An agent pool autoscaled by KEDA on real pods (``make e2e``, after test_helm.py).

The pinned KEDA (``make keda``) runs as processes with the cluster's kubeconfig: its
CRDs, operator and metrics adapter, the adapter registered as the APIService
external.metrics.k8s.io (a Service without selector, Endpoints to this host). A
Prometheus process scrapes the operator pods. The chart installs agentq with
``autoscaledPool`` on: a Deployment at 0 replicas whose pods are each a worker, and a
ScaledObject on the namespace's pending plus in-flight tasks. Tasks arrive: KEDA and
the HPA take the pool from 0 to >= 2 pods, every task Succeeds on its first attempt,
the pool goes back to 0 once they are done, the pods that go drain first: no task is
reclaimed (statuses and events read back from the API server), and no AgentWorker is
left (each went with its pod), nor its worker Lease (owned by the AgentWorker).
Everything is taken away after. docs/autoscaling.md.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentq.controlplane import binaries
from agentq.controlplane.cluster import free_port
from fleet import ControlPlane
from helmchart import CHART, helm
from kedatools import Keda, Prometheus
from nodetools import Platform, wait_for

RELEASE = "agentq"
POOL = "agentq-keda-e2e"
DEPLOYMENT = "agent-pool-llm"
TASKS = 8
WORK_SECONDS = 6
CRDS = tuple(sorted(p.stem for p in (Path(__file__).resolve().parents[1] / "crds").glob("*.yaml")))
RECLAIM_REASONS = {"LeaseExpired", "Reclaimed"}

_started = time.monotonic()


def say(line: str) -> None:
    print(f"[e2e keda {time.monotonic() - _started:6.1f}s] {line}", flush=True)


class Kube:
    def __init__(self, platform: Platform) -> None:
        self.cp = ControlPlane(
            kubeconfig=platform.kubeconfig,
            bin_dir=str(Path(platform.kubectl).parent),
            server="",
            kubectl_path=platform.kubectl,
        )

    def __call__(self, *args: str, input: str | None = None, check: bool = True) -> str:
        return self.cp.kubectl(*args, input=input, check=check, timeout=300).stdout

    def json(self, *args: str) -> Any:
        out = self(*args, "-o", "json", "--ignore-not-found")
        return json.loads(out) if out.strip() else None

    def replicas(self) -> int:
        deploy = self.json("-n", POOL, "get", "deploy", DEPLOYMENT) or {}
        return int((deploy.get("spec") or {}).get("replicas") or 0)

    def tasks(self) -> list[dict[str, Any]]:
        return list((self.json("-n", POOL, "get", "agenttasks") or {}).get("items", []))


@pytest.fixture
def keda(platform: Platform, tmp_path: Path) -> Iterator[Keda]:
    try:
        binaries.resolve(build=False, binary_set=binaries.KEDA)
    except binaries.BinaryError as err:
        pytest.fail(f"KEDA not built ({err}); make keda")
    kube = Kube(platform)
    running = Keda(kube.cp, tmp_path)
    try:
        running.start()
        yield running
    finally:
        running.stop()


@pytest.mark.timeout(1200)
def test_keda_scales_an_agent_pool_on_real_pods(
    platform: Platform, keda: Keda, tmp_path: Path
) -> None:
    global _started
    _started = time.monotonic()
    k = Kube(platform)
    home = tmp_path / "helm-home"
    image = platform.image
    repository, _, tag = image.rpartition(":")
    prometheus: Prometheus | None = None
    try:
        # agentq with the autoscaled pool, pointed at the Prometheus started below
        # (KEDA's processes run on this host, so 127.0.0.1 is where they find it).
        prometheus_port = free_port()
        values = [
            "--set", f"image.repository={repository}", "--set", f"image.tag={tag}",
            "--set", f"image.pullPolicy={platform.pull_policy}",
            "--set", "autoscaledPool.enabled=true",
            "--set", "autoscaledPool.terminationGracePeriodSeconds=90",
            "--set", "autoscaledPool.keda.maxReplicaCount=3",
            "--set", "autoscaledPool.keda.pollingInterval=2",
            "--set", "autoscaledPool.keda.cooldownPeriod=20",
            "--set", "autoscaledPool.keda.scaleDownStabilizationSeconds=10",
            "--set", f"autoscaledPool.keda.prometheusAddress=http://127.0.0.1:{prometheus_port}",
            "--set-json", 'autoscaledPool.args=["agent-sim","--behaviour","complete",'
            f'"--work-seconds","{WORK_SECONDS}"]',
        ]  # fmt: skip
        say(f"helm install with the autoscaled pool, image {image}")
        # Not --wait: helm would wait for the ScaledObject to be Ready, which it is only
        # once KEDA reaches the Prometheus that needs the operator pods' addresses first.
        helm(home, "install", RELEASE, str(CHART), "-n", POOL, "--create-namespace",
             *values, kubeconfig=platform.kubeconfig, timeout=400)  # fmt: skip

        def operator_ips() -> list[str] | None:
            pods = k.json(
                "-n", "agentq-system", "get", "pods", "-l", "app.kubernetes.io/name=agentq-operator"
            )
            ips = [
                p["status"]["podIP"]
                for p in (pods or {}).get("items", [])
                if p["status"].get("podIP") and p["status"].get("phase") == "Running"
            ]
            return ips if len(ips) == 2 else None

        operators = wait_for("2 operator pods Running with an IP", operator_ips, 120)
        prometheus = Prometheus(tmp_path, [f"{ip}:8080" for ip in operators], prometheus_port)
        wait_for(
            "Prometheus to see the leader",
            lambda: prometheus.query("agentq_leader == 1") if prometheus else None,
            120,
        )
        assert k.replicas() == 0
        say(f"installed; Prometheus scrapes {operators}; the pool at 0 replicas")

        for i in range(TASKS):
            task = {
                "apiVersion": "agentq.dev/v1alpha1",
                "kind": "AgentTask",
                "metadata": {"name": f"scaled-{i}", "namespace": POOL},
                "spec": {"requiredCapabilities": ["llm"], "payload": {"i": i},
                         "leaseDurationSeconds": 15},
            }  # fmt: skip
            k("apply", "-f", "-", input=json.dumps(task))
        seen: list[int] = [0]

        def replicas_at_least(n: int) -> bool:
            now = k.replicas()
            if now != seen[-1]:
                seen.append(now)
                say(f"{DEPLOYMENT}: {now} replicas")
            return now >= n

        wait_for(f"{DEPLOYMENT} scaled to >= 2", lambda: replicas_at_least(2), 240)

        def all_succeeded() -> bool:
            replicas_at_least(99)
            tasks = k.tasks()
            for t in tasks:
                phase = (t.get("status") or {}).get("phase")
                assert phase not in ("Failed", "DeadLettered"), t
            return len(tasks) == TASKS and all(
                (t.get("status") or {}).get("phase") == "Succeeded" for t in tasks
            )

        wait_for(f"{TASKS} tasks Succeeded", all_succeeded, 360)
        say(f"all {TASKS} tasks Succeeded; replicas seen {seen}")
        wait_for(
            f"{DEPLOYMENT} back to 0 and its pods gone",
            lambda: (
                replicas_at_least(99) is False
                and k.replicas() == 0
                and not (k.json("-n", POOL, "get", "pods") or {}).get("items")
            ),
            300,
        )
        assert max(seen) >= 2 and seen[-1] == 0, seen
        wait_for(
            "no AgentWorker left (each went with its pod)",
            lambda: not (k.json("-n", POOL, "get", "agentworkers") or {}).get("items"),
            120,
        )
        wait_for(
            "no worker Lease left (each went with its AgentWorker)",
            lambda: (
                not [
                    lease
                    for lease in (k.json("-n", POOL, "get", "leases") or {}).get("items", [])
                    if lease["metadata"]["name"].startswith("agentq-worker-")
                ]
            ),
            60,
        )
        reclaims = {}
        for t in k.tasks():
            name, status = t["metadata"]["name"], t["status"]
            events = k.json("-n", POOL, "get", "events", "--field-selector",
                            f"involvedObject.name={name}") or {}  # fmt: skip
            reasons = {str(e.get("reason")) for e in events.get("items", [])}
            reclaims[name] = status.get("reclaims", 0)
            assert status.get("reclaims", 0) == 0, (name, status)
            assert status.get("attempt") == 1, (name, status)
            assert not reasons & RECLAIM_REASONS, (name, sorted(reasons))
        say(
            f"back to 0 replicas (seen {seen}); reclaims {sum(reclaims.values())}; "
            "no AgentWorker or worker Lease left"
        )
    finally:
        if prometheus is not None:
            prometheus.stop()
        helm(home, "uninstall", RELEASE, "-n", POOL, "--wait", "--ignore-not-found",
             kubeconfig=platform.kubeconfig, check=False, timeout=300)  # fmt: skip
        k("delete", "crd", *CRDS, "--ignore-not-found", "--wait", check=False)
        k("delete", "namespace", POOL, "agentq-system", "--ignore-not-found", "--wait",
          check=False)  # fmt: skip
