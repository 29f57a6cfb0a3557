"""charts/agentq installed, upgraded and uninstalled by the pinned helm on a real API
server (a control plane of this module's own: the chart's CRDs and cluster-wide objects
must not meet the shared plane's).

No node: the operator's pods stay Pending, which is fine here; what is checked is what
the API server took and reads back: the CRDs Established, the admission policies and
their bindings, RBAC, the operator's Deployment; an upgrade's changed values in force
(the CRDs upgraded too); and after `helm uninstall` no agentq object left but the CRDs,
kept by the chart's default policy (crds.keep), and with crds.keep=false not even them.
``make e2e`` runs the chart with real pods (e2e/test_helm.py).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentq.controlplane import Cluster, binaries
from agentq.controlplane.cluster import ClusterState
from helmchart import CHART, Key, helm, key, template

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("own-cluster")]

RELEASE = "agentq"
# Every CRD of the repository (crds/<name>.yaml), as the chart carries them.
CRDS = tuple(sorted(p.stem for p in (Path(__file__).resolve().parents[2] / "crds").glob("*.yaml")))


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterState]:
    """A control plane of its own, nothing of agentq installed."""
    binaries.resolve(build=True, binary_set=binaries.HELM)  # `make helm`, if it was not
    cluster = Cluster(tmp_path_factory.mktemp("helm-controlplane"))
    state = cluster.up(build=True, tie_to_parent=True)
    try:
        yield state
    finally:
        cluster.down()


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("helm-home")


def _kubectl(state: ClusterState, *args: str, check: bool = True) -> str:
    done = subprocess.run(
        [state.binaries["kubectl"], "--kubeconfig", state.kubeconfig, *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if check and done.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)}: {done.stderr}")
    return done.stdout


def _read(state: ClusterState, k: Key) -> dict[str, Any] | None:
    """The object as the API server has it, or None."""
    api_version, kind, namespace, name = k
    resource = f"{kind}.{api_version.split('/')[0]}" if "/" in api_version else kind
    args = ["get", resource, name, "-o", "json", "--ignore-not-found"]
    if namespace:
        args += ["-n", namespace]
    out = _kubectl(state, *args)
    return json.loads(out) if out.strip() else None


def _wait(what: str, ok: Any, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not ok():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not within {timeout:.0f} s")
        time.sleep(0.5)


def _established(state: ClusterState, name: str) -> bool:
    crd = _read(state, ("apiextensions.k8s.io/v1", "CustomResourceDefinition", "", name))
    conditions = (crd or {}).get("status", {}).get("conditions", [])
    return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)


def _install(home: Path, state: ClusterState, *args: str) -> None:
    helm(
        home,
        "install",
        RELEASE,
        str(CHART),
        "--namespace",
        "default",
        *args,
        kubeconfig=state.kubeconfig,
    )


def _agentq_objects_left(state: ClusterState) -> list[str]:
    """Every object labelled part-of agentq, of the kinds the chart makes."""
    kinds = (
        "namespaces,clusterroles,clusterrolebindings,priorityclasses,"
        "validatingadmissionpolicies,validatingadmissionpolicybindings,"
        "customresourcedefinitions,deployments,serviceaccounts,networkpolicies,"
        "poddisruptionbudgets,rolebindings"
    )
    out = _kubectl(
        state, "get", kinds, "-A", "-l", "app.kubernetes.io/part-of=agentq", "-o", "name"
    )
    return sorted(out.split())


def test_install_upgrade_uninstall(plane: ClusterState, home: Path, tmp_path: Path) -> None:
    rendered = [key(o) for o in template(home)]

    # install: every object the chart renders is there, as the API server reads it back.
    _install(home, plane)
    for name in CRDS:
        _wait(f"CRD {name} Established", lambda name=name: _established(plane, name))
    for k in rendered:
        live = _read(plane, k)
        assert live is not None, f"{k} not created"
        labels = live["metadata"].get("labels", {})
        assert labels.get("app.kubernetes.io/managed-by") == "Helm", k
        assert labels.get("app.kubernetes.io/part-of") == "agentq", k
        assert live["metadata"]["annotations"]["meta.helm.sh/release-name"] == RELEASE
    policies = json.loads(_kubectl(plane, "get", "validatingadmissionpolicies", "-o", "json"))
    assert {p["metadata"]["name"] for p in policies["items"]} >= {
        "agentq-agent-writes",
        "agentq-operator-leases",
        "agentq-leader-epoch",
    }
    namespace = _read(plane, ("v1", "Namespace", "", "agentq-system"))
    assert namespace is not None
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    deployment = _read(plane, ("apps/v1", "Deployment", "agentq-system", "agentq-operator"))
    assert deployment is not None and deployment["spec"]["replicas"] == 2
    # The admission policy is in force: an agent's account may not write a foreign Lease.
    _wait("agentq-agent-writes in force", lambda: _policy_refuses_agent(plane))

    # upgrade: changed values take effect; an object turned off goes; the CRDs are
    # upgraded with the chart (a new chart version reaches their labels).
    chart = tmp_path / "agentq"
    shutil.copytree(CHART, chart)
    meta = chart / "Chart.yaml"
    meta.write_text(meta.read_text().replace("\nversion: ", "\nversion: 9.9.9-upgrade # ", 1))
    helm(
        home,
        "upgrade",
        RELEASE,
        str(chart),
        "--namespace",
        "default",
        "--set",
        "operator.replicas=3",
        "--set",
        "operator.leaderElection.leaseSeconds=30",
        "--set",
        "networkPolicy.enabled=false",
        kubeconfig=plane.kubeconfig,
    )
    deployment = _read(plane, ("apps/v1", "Deployment", "agentq-system", "agentq-operator"))
    assert deployment is not None and deployment["spec"]["replicas"] == 3
    env = {
        e["name"]: e.get("value")
        for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    assert env["AGENTQ_LEADER_LEASE_SECONDS"] == "30"
    assert (
        _read(plane, ("networking.k8s.io/v1", "NetworkPolicy", "agentq-system", "agentq-operator"))
        is None
    )
    for name in CRDS:
        crd = _read(plane, ("apiextensions.k8s.io/v1", "CustomResourceDefinition", "", name))
        assert crd is not None
        assert crd["metadata"]["labels"]["helm.sh/chart"] == "agentq-9.9.9-upgrade", name
    status = json.loads(
        helm(
            home, "status", RELEASE, "-n", "default", "-o", "json", kubeconfig=plane.kubeconfig
        ).stdout
    )
    assert status["version"] == 2 and status["info"]["status"] == "deployed"

    # uninstall: nothing of agentq's is left but the CRDs, kept (crds.keep, the default).
    _uninstall(home, plane)
    _wait(
        "only the CRDs left after uninstall",
        lambda: (
            _agentq_objects_left(plane)
            == sorted(f"customresourcedefinition.apiextensions.k8s.io/{n}" for n in CRDS)
        ),
        timeout=120,
    )
    releases = helm(home, "list", "-A", "-o", "json", kubeconfig=plane.kubeconfig).stdout
    assert json.loads(releases) == []

    # A new install takes the kept CRDs back; with crds.keep=false uninstall deletes them.
    _install(home, plane, "--set", "crds.keep=false")
    for name in CRDS:
        _wait(f"CRD {name} Established", lambda name=name: _established(plane, name))
    _uninstall(home, plane)
    _wait("no agentq object left", lambda: _agentq_objects_left(plane) == [], timeout=120)


def _uninstall(home: Path, plane: ClusterState) -> None:
    """``helm uninstall --wait``; waits for the namespace and CRDs to go, which a loaded
    controller manager may take minutes over: if it does not end, what is left says why."""
    try:
        helm(
            home, "uninstall", RELEASE, "-n", "default", "--wait", "--timeout", "280s",
            kubeconfig=plane.kubeconfig, timeout=300,
        )  # fmt: skip
    except subprocess.TimeoutExpired as err:
        left = _kubectl(plane, "get", "namespaces,crds", "-o", "wide", check=False)
        objects = _agentq_objects_left(plane)
        raise AssertionError(f"helm uninstall hung: {objects}\n{left}") from err


def _policy_refuses_agent(plane: ClusterState) -> bool:
    """A server-side dry run of an agent account's Lease create (not its worker Lease) is
    refused by agentq-agent-writes. The account is impersonated with the admins' group,
    so that RBAC lets the request through to admission."""
    lease = {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": "not-a-worker-lease", "namespace": "default"},
        "spec": {},
    }
    done = subprocess.run(
        [
            plane.binaries["kubectl"],
            "--kubeconfig",
            plane.kubeconfig,
            "create",
            "--dry-run=server",
            "--as=system:serviceaccount:default:agentq-agent-x",
            "--as-group=system:masters",
            "-f",
            "-",
        ],
        input=json.dumps(lease),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    return "agentq-agent-writes" in done.stderr
