"""Integration fixtures: one real control plane (etcd + kube-apiserver +
kube-controller-manager as local processes) for the whole test session.

The control plane is started once per session in a temporary state directory,
tied to the test process (it dies with it, even on SIGKILL) and stopped by pid
at the end. Set ``AGENTQ_TEST_KUBECONFIG`` to run against an already running
cluster instead (for example one from ``agentq cluster up``).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentq.controlplane import Cluster
from agentq.controlplane.binaries import resolve
from agentq.controlplane.cluster import ClusterState
from fleet import ControlPlane, Fleet
from pgserver import PostgresServer, find_bin_dir


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    external = os.environ.get("AGENTQ_TEST_KUBECONFIG")
    if external:
        kubectl = str(resolve(build=True)["kubectl"])
        yield ControlPlane(
            kubeconfig=external,
            bin_dir=str(Path(kubectl).parent),
            server="",
            kubectl_path=kubectl,
        )
        return
    cluster = Cluster(tmp_path_factory.mktemp("controlplane"))
    state = cluster.up(build=True, tie_to_parent=True)
    try:
        yield ControlPlane(
            kubeconfig=state.kubeconfig,
            bin_dir=state.bin_dir,
            server=state.server,
            kubectl_path=state.binaries["kubectl"],
            cluster=cluster,
        )
    finally:
        cluster.down()


@pytest.fixture(scope="module")
def own_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Cluster, ClusterState]]:
    """A control plane for one test module alone, the CRDs installed: for tests that
    restart or stop the API server, which would disturb every other test on the shared
    one."""
    cluster = Cluster(tmp_path_factory.mktemp("own-controlplane"))
    state = cluster.up(build=True, tie_to_parent=True)
    try:
        install_crds(
            ControlPlane(
                kubeconfig=state.kubeconfig,
                bin_dir=state.bin_dir,
                server=state.server,
                kubectl_path=state.binaries["kubectl"],
                cluster=cluster,
            )
        )
        yield cluster, state
    finally:
        cluster.down()


@pytest.fixture
def namespace(control_plane: ControlPlane) -> Iterator[str]:
    """A fresh namespace for one test, deleted (without waiting) afterwards."""
    name = f"t-{uuid.uuid4().hex[:10]}"
    control_plane.kubectl("create", "namespace", name)
    yield name
    control_plane.kubectl("delete", "namespace", name, "--wait=false", check=False)


CRD_DIR = Path(__file__).resolve().parents[2] / "crds"


def install_crds(plane: ControlPlane) -> None:
    """The AgentTask and AgentWorker CRDs, installed and Established."""
    plane.kubectl("apply", "-f", str(CRD_DIR))
    plane.kubectl(
        "wait",
        "--for=condition=Established",
        "--timeout=60s",
        "crd/agenttasks.agentq.dev",
        "crd/agentworkers.agentq.dev",
    )


@pytest.fixture(scope="session")
def agentq_crds(control_plane: ControlPlane) -> None:
    """The AgentTask and AgentWorker CRDs, installed and Established."""
    install_crds(control_plane)


@pytest.fixture(scope="session")
def agentq_installed(control_plane: ControlPlane, agentq_crds: None) -> None:
    """manifests/ (CRDs, namespace, RBAC, the admission policy), without the operator's
    Deployment: its pods could not run on a control plane without a node."""
    from manifests import install_base, to_yaml

    objects = [o for o in install_base(control_plane.kubectl_path) if o["kind"] != "Deployment"]
    control_plane.kubectl("apply", "-f", "-", input=to_yaml(objects))


@pytest.fixture
def fleet(
    control_plane: ControlPlane, agentq_crds: None, namespace: str, tmp_path: Path
) -> Iterator[Fleet]:
    """A namespace with helpers to add workers, tasks, agents and operators to it."""
    fleet = Fleet(
        kubeconfig=control_plane.kubeconfig,
        namespace=namespace,
        workdir=tmp_path,
        kubectl=control_plane.kubectl_path,
    )
    try:
        yield fleet
    finally:
        fleet.close()


@pytest.fixture(scope="session")
def postgres() -> Iterator[str]:
    """A real PostgreSQL server (Debian's binaries, its own process); yields its DSN."""
    bin_dir = find_bin_dir()
    if bin_dir is None:
        if os.environ.get("CI"):
            pytest.fail("PostgreSQL's server binaries are missing; `make test` installs them")
        pytest.skip("needs PostgreSQL's server binaries (make test installs them)")
    server = PostgresServer(bin_dir)
    try:
        server.start()
        yield server.dsn
    finally:
        server.stop()
