"""charts/agentq on real pods (``make e2e``), four steps in order on one cluster:

1. the pinned helm (``make helm``) installs the chart with the locally built image
   and an agent pool of one worker;
2. the e2e scenario (test_scenario.py's ``run_scenario``) runs on that install, with
   its own agents from manifests/agent in a namespace it deletes at its end;
3. while the pool's tasks are running, ``helm upgrade`` rolls the operator to a second
   build of the image (another tag and image ID, the same layers: agentq.release's
   retag with a label) and a changed value, the agents left as they are; every task
   that ran across the upgrade succeeds with no reclaim (status and events read back
   from the API server), and a task is done by the new build;
4. ``helm uninstall`` takes everything away but the CRDs (kept: the chart's
   default) and what is in them: the tasks, the pool's AgentWorker and its worker
   Lease (owned by it); deleted by hand as docs/install.md says, they take every
   agentq Lease with them.

It leaves the cluster as it found it, for test_keda.py after it. The scenario runs
before any uninstall: a reinstall on the same API server finds the leader-epoch
policy judging with a stale Lease (kubernetes#130887, docs/operator.md), under which
its last check (an older epoch's grant refused) could not hold. docs/upgrading.md
cites it.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from test_scenario import NAMESPACE as SCENARIO
from test_scenario import run_scenario

from agentq import release
from agentq.controlplane import imagebuild
from helmchart import CHART, helm
from nodetools import Platform, wait_for
from podchecks import FETCH, metric

RELEASE = "agentq"
POOL = "agentq-helm-e2e"  # the release's namespace, and its agent pool's
WORKER = "helm-e2e"
# Every CRD of the repository (crds/<name>.yaml), as the chart carries them.
CRDS = tuple(sorted(p.stem for p in (Path(__file__).resolve().parents[1] / "crds").glob("*.yaml")))
# The second build the upgrade goes to, and the tasks that run across it: each works
# longer than the operator's rollout takes, on a lease shorter than it.
SECOND_IMAGE = "agentq:e2e-second-build"
WORK_SECONDS = 60
ACROSS = ("across-upgrade-0", "across-upgrade-1", "across-upgrade-2")
RECLAIM_REASONS = {"LeaseExpired", "Reclaimed"}

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
        return self.platform.run_kubectl(*args, input=input, check=check)

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

    def phase(self, name: str) -> str:
        task = self.json("-n", POOL, "get", "agenttask", name)
        return str(((task or {}).get("status") or {}).get("phase", ""))

    def event_reasons(self, name: str) -> set[str]:
        events = self.json(
            "-n", POOL, "get", "events", "--field-selector", f"involvedObject.name={name}"
        )
        return {str(e.get("reason")) for e in (events or {}).get("items", [])}

    def operator_images(self) -> set[str]:
        pods = self.json(
            "-n", "agentq-system", "get", "pods", "-l", "app.kubernetes.io/name=agentq-operator"
        )
        return {c["image"] for p in (pods or {}).get("items", []) for c in p["spec"]["containers"]}

    def pool_pods(self) -> dict[str, str]:
        pods = self.json("-n", POOL, "get", "pods")
        return {p["metadata"]["name"]: p["metadata"]["uid"] for p in (pods or {}).get("items", [])}

    def submit(self, name: str, lease_seconds: int = 30) -> None:
        task = {
            "apiVersion": "agentq.dev/v1alpha1",
            "kind": "AgentTask",
            "metadata": {"name": name, "namespace": POOL},
            "spec": {
                "requiredCapabilities": ["llm"],
                "payload": {"prompt": f"{name} through the chart"},
                "leaseDurationSeconds": lease_seconds,
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

    def agentq_leases(self) -> list[str]:
        """Every Lease of agentq's, in any namespace: the election Lease, the workers'
        and the tasks' (agentq-*, or labelled agentq.dev/lease)."""
        leases = (self.json("get", "leases", "-A") or {}).get("items", [])
        return sorted(
            f"{m['namespace']}/{m['name']}"
            for m in (lease["metadata"] for lease in leases)
            if m["name"].startswith("agentq-") or "agentq.dev/lease" in (m.get("labels") or {})
        )

    def leftovers(self) -> dict[str, list[str]]:
        """agentq's Leases and custom objects (while their CRDs are there) left."""
        left = {"leases": self.agentq_leases()}
        for crd in CRDS:
            if self("get", "crd", crd, "--ignore-not-found", "-o", "name").strip():
                items = (self.json("get", crd.split(".", 1)[0], "-A") or {}).get("items", [])
                left[crd] = sorted(
                    f"{i['metadata']['namespace']}/{i['metadata']['name']}" for i in items
                )
        return {kind: names for kind, names in left.items() if names}


def second_build(platform: Platform, tmp_path: Path) -> str | None:
    """The image again as another build (a label more: another image ID), imported into
    the node's containerd as SECOND_IMAGE; None without the archive of ``make image``."""
    archive = imagebuild.archive_path(imagebuild.DEFAULT_TAG)
    if not archive.exists():
        return None
    second = tmp_path / "second-build.tar"
    release.retag_image(archive, second, SECOND_IMAGE, labels={"dev.agentq.e2e.build": "second"})
    with open(second, "rb") as stdin:
        subprocess.run(
            [*platform.ctr, "-n", "k8s.io", "images", "import", "--no-unpack", "-"],
            stdin=stdin, capture_output=True, timeout=600, check=True,
        )  # fmt: skip
    say(f"second build {SECOND_IMAGE}: {release.image_digest(second)} "
        f"(first {release.image_digest(archive)})")  # fmt: skip
    return SECOND_IMAGE


class Chart:
    """The release across this module's tests, which run in file order on one cluster
    and each need the one before to have passed: a failed step skips the rest."""

    def __init__(self, platform: Platform, home: Path, tmp_path: Path) -> None:
        self.platform = platform
        self.home = home
        self.tmp_path = tmp_path
        self.failed = ""

    def helm(self, *args: str, check: bool = True) -> None:
        helm(self.home, *args, kubeconfig=self.platform.kubeconfig, check=check, timeout=400)

    @contextmanager
    def step(self, name: str) -> Iterator[None]:
        global _started
        if self.failed:
            pytest.skip(f"{self.failed} failed before it")
        _started = time.monotonic()
        try:
            yield
        except BaseException:
            self.failed = name
            raise


@pytest.fixture(scope="module")
def chart(platform: Platform, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Chart]:
    """Whatever happens, the release, the CRDs and the namespaces go after."""
    tmp_path = tmp_path_factory.mktemp("helm")
    c = Chart(platform, tmp_path / "helm-home", tmp_path)
    try:
        yield c
    finally:
        c.helm("uninstall", RELEASE, "-n", POOL, "--wait", "--ignore-not-found", check=False)
        k = Kube(platform)
        k("delete", "crd", *CRDS, "--ignore-not-found", "--wait", check=False)
        k("delete", "namespace", POOL, SCENARIO, "agentq-system", "--ignore-not-found",
          "--wait", check=False)  # fmt: skip


@pytest.fixture
def kube(platform: Platform) -> Kube:
    return Kube(platform)


def test_helm_install(platform: Platform, chart: Chart, kube: Kube) -> None:
    """``helm install``: the operator's two replicas and the pool's worker, Ready."""
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
        "--set",
        "agentPool.workers[0].maxInFlight=4",
        # --set would take the number for a number, which the values schema refuses.
        "--set-json",
        'agentPool.workerDefaults.args=["agent-sim","--behaviour","complete",'
        f'"--work-seconds","{WORK_SECONDS}"]',
    ]
    with chart.step("the install"):
        say(f"helm install with image {platform.image}")
        chart.helm(
            "install", RELEASE, str(CHART), "-n", POOL, "--create-namespace",
            "--wait", "--timeout", "5m", *values,
        )  # fmt: skip
        operators = k.json(
            "-n", "agentq-system", "get", "pods", "-l", "app.kubernetes.io/name=agentq-operator"
        )["items"]
        assert len(operators) == 2
        for pod in operators:
            assert pod["spec"]["serviceAccountName"] == "agentq-operator"
            assert pod["status"]["phase"] == "Running"
        leader = wait_for("an operator to lead", k.leader, 60)
        worker = wait_for(
            f"AgentWorker {WORKER} Ready",
            lambda: (
                (k.json("-n", POOL, "get", "agentworker", WORKER) or {})
                .get("status", {})
                .get("phase")
                == "Ready"
            ),
            120,
        )
        assert worker
        # The claim port serves the chart's own certificate (claimTLS.mode helm, the
        # default): the operator, a non-root user, reads the Secret's key (fsGroup).
        ready = wait_for(
            "both operator replicas serving the claim port's certificate",
            lambda: all(claim_tls_ready(platform, p["metadata"]["name"]) for p in operators),
            60,
        )
        assert ready
        say(f"installed: 2 operator pods serving TLS, leader {leader}; worker {WORKER} Ready")


def claim_tls_ready(platform: Platform, pod: str) -> bool:
    """Whether an operator pod says agentq_claim_tls_ready 1 (its metrics, read from
    inside it)."""
    out = platform.run_kubectl(
        "-n", "agentq-system", "exec", pod, "-c", "operator",
        "--", "python3", "-c", FETCH, "http://127.0.0.1:8080/metrics",
    )  # fmt: skip
    status, body = json.loads(out.strip().splitlines()[-1])
    return status == 200 and metric(body, "agentq_claim_tls_ready") == [1.0]


@pytest.mark.timeout(1800)
def test_scenario_on_the_chart(platform: Platform, chart: Chart) -> None:
    """The e2e scenario (test_scenario.py: agents 1:2:4, the poison task, the faults,
    the refusals, the credentials, the epoch fencing) on the release just installed;
    its agents from manifests/agent in a namespace of its own, deleted at its end."""
    with chart.step("the scenario"):
        run_scenario(platform)


def test_helm_upgrade_reclaims_no_healthy_claim(
    platform: Platform, chart: Chart, kube: Kube
) -> None:
    """``helm upgrade`` to a second build while the pool's tasks run: none reclaimed."""
    k = kube
    with chart.step("the upgrade"):
        # The scenario deleted the leader pod: the leader now is another.
        first_leader = wait_for("an operator to lead", k.leader, 60)
        # Tasks running (claimed, their Leases renewed by the sidecar) when the upgrade
        # starts.
        for name in ACROSS:
            k.submit(name, lease_seconds=15)
        wait_for(
            f"{len(ACROSS)} tasks Running",
            lambda: all(k.phase(name) == "Running" for name in ACROSS),
            120,
        )
        agents_before = k.pool_pods()
        say(f"{len(ACROSS)} tasks Running on {sorted(agents_before)}, leader {first_leader}")

        # The operator to a second build (and a changed value); the agents keep their
        # images, so only the operator rolls (docs/upgrading.md).
        second = second_build(platform, chart.tmp_path)
        if second is None:
            say("no image archive of make image: the upgrade keeps the image")
        upgrade_started = time.monotonic()
        chart.helm(
            "upgrade", RELEASE, str(CHART), "-n", POOL, "--reuse-values",
            "--set", "operator.leaderElection.leaseSeconds=20",
            *(_image_values(second) if second else []),
            "--set", f"agentPool.sidecar.image={platform.image}",
            "--set", f"agentPool.workerDefaults.image={platform.image}",
            "--wait", "--timeout", "5m",
        )  # fmt: skip
        k("-n", "agentq-system", "rollout", "status", "deploy/agentq-operator", "--timeout=300s")
        new_image = second or platform.image
        wait_for(
            f"only {new_image} operator pods",
            lambda: k.operator_images() == {new_image},
            120,
        )
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
        rolled = time.monotonic() - upgrade_started
        phases = {name: k.phase(name) for name in ACROSS}
        assert set(phases.values()) == {"Running"}, (
            f"the tasks did not outlast the upgrade ({rolled:.0f}s): {phases}"
        )
        say(f"upgraded in {rolled:.0f}s to {new_image}, leader {new_leader}; tasks still Running")
        k.submit("after-upgrade")

        # Every task that ran across the upgrade ends Succeeded on its first attempt: no
        # claim reclaimed, in its status or in its events; the agents were not restarted.
        for name in (*ACROSS, "after-upgrade"):
            wait_for(f"{name} Succeeded", lambda name=name: k.task_done(name), 240)
        reclaims = {}
        for name in ACROSS:
            status = k.json("-n", POOL, "get", "agenttask", name)["status"]
            reasons = k.event_reasons(name)
            reclaims[name] = status.get("reclaims", 0)
            assert status.get("reclaims", 0) == 0, (name, status)
            assert status.get("attempt") == 1, (name, status)
            assert not reasons & RECLAIM_REASONS, (name, sorted(reasons))
            assert "Succeeded" in reasons, (name, sorted(reasons))
        assert k.pool_pods() == agents_before
        say(f"upgraded with tasks running: all Succeeded, reclaims {reclaims}; a task after it too")


def test_helm_uninstall_leaves_nothing(platform: Platform, chart: Chart, kube: Kube) -> None:
    """``helm uninstall``: nothing of agentq's left but the CRDs the chart keeps, with
    the tasks and the pool's AgentWorker in them (and the worker's Lease, which it
    owns); deleted by hand as docs/install.md says, they take every Lease with them."""
    k = kube
    with chart.step("the uninstall"):
        chart.helm("uninstall", RELEASE, "-n", POOL, "--wait", "--timeout", "5m")
        kept = sorted(f"customresourcedefinition.apiextensions.k8s.io/{n}" for n in CRDS)
        wait_for("only the kept CRDs left", lambda: k.agentq_objects() == kept, 180)
        assert not (k.json("-n", "agentq-system", "get", "pods") or {}).get("items")
        # In the kept CRDs: the tasks, and the pool's AgentWorker with its worker Lease
        # (owned by it); nothing else, no other Lease.
        left = k.leftovers()
        say(f"uninstalled; in the kept CRDs: {left}")
        assert left == {
            "agenttasks.agentq.dev": sorted(f"{POOL}/{n}" for n in (*ACROSS, "after-upgrade")),
            "agentworkers.agentq.dev": [f"{POOL}/{WORKER}"],
            "leases": [f"{POOL}/agentq-worker-{WORKER}"],
        }, left
        lease = k.json("-n", POOL, "get", "lease", f"agentq-worker-{WORKER}")
        worker_uid = k.json("-n", POOL, "get", "agentworker", WORKER)["metadata"]["uid"]
        owners = [(r["kind"], r["uid"]) for r in lease["metadata"].get("ownerReferences", [])]
        # (Still held, often: helm deletes the pool's RoleBinding and ServiceAccount
        # while its pod stops, and the sidecar's release is refused. Harmless: it runs
        # out, and no operator is left to read it.)
        assert owners == [("AgentWorker", worker_uid)], owners
        k("delete", "crd", *CRDS, "--wait")
        assert k.agentq_objects() == []
        wait_for("the worker Lease to go with its AgentWorker", lambda: not k.leftovers(), 60)
        say("nothing of agentq's left, no Lease, once the kept CRDs were deleted")
