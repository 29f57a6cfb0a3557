"""charts/agentq on real pods (``make e2e``, before the scenario): the pinned helm
(``make helm``) installs the chart with the locally built image and an agent pool of
one worker, a task is done through it, ``helm upgrade`` rolls the operator with a
changed value and a second task is done, and ``helm uninstall`` takes everything away
but the CRDs (kept: the chart's default), which are then deleted by hand as
docs/install.md says. It leaves the cluster as it found it, for the scenario after it.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from helmchart import CHART, helm
from nodetools import Platform, wait_for

RELEASE = "agentq"
POOL = "agentq-helm-e2e"  # the release's namespace, and its agent pool's
WORKER = "helm-e2e"
# Every CRD of the repository (crds/<name>.yaml), as the chart carries them.
CRDS = tuple(sorted(p.stem for p in (Path(__file__).resolve().parents[1] / "crds").glob("*.yaml")))

_started = time.monotonic()


def say(line: str) -> None:
    print(f"[e2e helm {time.monotonic() - _started:6.1f}s] {line}", flush=True)


def _image_values(image: str) -> list[str]:
    """--set arguments naming ``image`` (repository[:tag] or repository@digest)."""
    if "@" in image:
        repository, digest = image.split("@", 1)
        return ["--set", f"image.repository={repository}", "--set", f"image.digest={digest}"]
    slash = image.rfind("/")
    colon = image.rfind(":")
    repository, tag = (image[:colon], image[colon + 1 :]) if colon > slash else (image, "latest")
    return ["--set", f"image.repository={repository}", "--set", f"image.tag={tag}"]


class Kube:
    def __init__(self, platform: Platform) -> None:
        self.platform = platform

    def __call__(self, *args: str, input: str | None = None, check: bool = True) -> str:
        done = subprocess.run(
            [self.platform.kubectl, "--kubeconfig", self.platform.kubeconfig, *args],
            input=input,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        if check and done.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)}: {done.stdout}{done.stderr}")
        return done.stdout

    def json(self, *args: str) -> Any:
        out = self(*args, "-o", "json", "--ignore-not-found")
        return json.loads(out) if out.strip() else None

    def leader(self) -> str:
        lease = self.json("-n", "agentq-system", "get", "lease", "agentq-operator")
        return str(((lease or {}).get("spec") or {}).get("holderIdentity") or "")

    def task_done(self, name: str) -> str:
        task = self.json("-n", POOL, "get", "agenttask", name)
        phase = str(((task or {}).get("status") or {}).get("phase", ""))
        assert phase not in ("Failed", "DeadLettered"), f"task {name} {phase}: {task}"
        return phase if phase == "Succeeded" else ""

    def submit(self, name: str) -> None:
        task = {
            "apiVersion": "agentq.dev/v1alpha1",
            "kind": "AgentTask",
            "metadata": {"name": name, "namespace": POOL},
            "spec": {
                "requiredCapabilities": ["llm"],
                "payload": {"prompt": f"{name} through the chart"},
                "leaseDurationSeconds": 30,
            },
        }
        self("apply", "-f", "-", input=json.dumps(task))

    def agentq_objects(self) -> list[str]:
        kinds = (
            "namespaces,clusterroles,clusterrolebindings,priorityclasses,"
            "validatingadmissionpolicies,validatingadmissionpolicybindings,"
            "customresourcedefinitions,deployments,serviceaccounts,networkpolicies,"
            "poddisruptionbudgets,rolebindings"
        )
        out = self("get", kinds, "-A", "-l", "app.kubernetes.io/part-of=agentq", "-o", "name")
        return sorted(out.split())


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "helm-home"


@pytest.fixture
def kube(platform: Platform, home: Path) -> Iterator[Kube]:
    """The cluster; whatever happens, the release, its CRDs and namespaces go after."""
    k = Kube(platform)
    try:
        yield k
    finally:
        helm(
            home,
            "uninstall",
            RELEASE,
            "-n",
            POOL,
            "--wait",
            "--ignore-not-found",
            kubeconfig=platform.kubeconfig,
            check=False,
            timeout=300,
        )
        k("delete", "crd", *CRDS, "--ignore-not-found", "--wait", check=False)
        k("delete", "namespace", POOL, "agentq-system", "--ignore-not-found", "--wait", check=False)


def test_helm_chart_on_real_pods(platform: Platform, kube: Kube, home: Path) -> None:
    global _started
    _started = time.monotonic()
    k = kube
    values = [
        *_image_values(platform.image),
        "--set",
        f"image.pullPolicy={platform.pull_policy}",
        "--set",
        "agentPool.enabled=true",
        "--set",
        f"agentPool.workers[0].name={WORKER}",
        "--set",
        "agentPool.workers[0].capabilities={llm}",
        # --set would take the 1 for a number, which the values schema refuses.
        "--set-json",
        'agentPool.workerDefaults.args=["agent-sim","--behaviour","complete","--work-seconds","1"]',
    ]

    # install: the operator's two replicas and the pool's worker, Ready on the node.
    say(f"helm install with image {platform.image}")
    helm(
        home,
        "install",
        RELEASE,
        str(CHART),
        "-n",
        POOL,
        "--create-namespace",
        "--wait",
        "--timeout",
        "5m",
        *values,
        kubeconfig=platform.kubeconfig,
        timeout=400,
    )
    operators = k.json(
        "-n", "agentq-system", "get", "pods", "-l", "app.kubernetes.io/name=agentq-operator"
    )["items"]
    assert len(operators) == 2
    for pod in operators:
        assert pod["spec"]["serviceAccountName"] == "agentq-operator"
        assert pod["status"]["phase"] == "Running"
    first_leader = wait_for("an operator to lead", k.leader, 60)
    worker = wait_for(
        f"AgentWorker {WORKER} Ready",
        lambda: (
            (k.json("-n", POOL, "get", "agentworker", WORKER) or {}).get("status", {}).get("phase")
            == "Ready"
        ),
        120,
    )
    assert worker
    say(f"installed: 2 operator pods, leader {first_leader}; worker {WORKER} Ready")
    k.submit("before-upgrade")
    wait_for("the first task Succeeded", lambda: k.task_done("before-upgrade"), 120)
    say("a task Succeeded through the chart's operator and agent pool")

    # upgrade: a changed value rolls the operator; a task is done again after it.
    helm(
        home,
        "upgrade",
        RELEASE,
        str(CHART),
        "-n",
        POOL,
        "--reuse-values",
        "--set",
        "operator.leaderElection.leaseSeconds=20",
        "--wait",
        "--timeout",
        "5m",
        kubeconfig=platform.kubeconfig,
        timeout=400,
    )
    k("-n", "agentq-system", "rollout", "status", "deploy/agentq-operator", "--timeout=300s")
    deployment = k.json("-n", "agentq-system", "get", "deploy", "agentq-operator")
    env = {
        e["name"]: e.get("value")
        for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    assert env["AGENTQ_LEADER_LEASE_SECONDS"] == "20"
    new_leader = wait_for(
        "a replica of the new rollout to lead",
        lambda: (leader := k.leader()) and leader != first_leader and leader,
        120,
    )
    k.submit("after-upgrade")
    wait_for("the second task Succeeded", lambda: k.task_done("after-upgrade"), 120)
    say(f"upgraded: leaseSeconds 20 in force, leader {new_leader}; a task Succeeded")

    # uninstall: nothing of agentq's left but the CRDs (kept), then those by hand.
    helm(
        home,
        "uninstall",
        RELEASE,
        "-n",
        POOL,
        "--wait",
        "--timeout",
        "5m",
        kubeconfig=platform.kubeconfig,
        timeout=400,
    )
    wait_for(
        "only the kept CRDs left",
        lambda: (
            k.agentq_objects()
            == sorted(f"customresourcedefinition.apiextensions.k8s.io/{n}" for n in CRDS)
        ),
        180,
    )
    assert not (k.json("-n", "agentq-system", "get", "pods") or {}).get("items")
    k("delete", "crd", *CRDS, "--wait")
    assert k.agentq_objects() == []
    say("uninstalled: nothing of agentq's left once the kept CRDs were deleted")
