"""Integration fixtures: one real control plane (etcd + kube-apiserver +
kube-controller-manager as local processes) for the whole test session.

The control plane is started once per session in a temporary state directory,
tied to the test process (it dies with it, even on SIGKILL) and stopped by pid
at the end; in a parallel run (``-n``) the xdist controller starts it once for
all workers (``tests/parallel.py``). Set ``AGENTQ_TEST_KUBECONFIG`` to run
against an already running cluster instead (for example one from ``agentq
cluster up``).
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

import parallel
from agentq import protocol
from agentq.controlplane import Cluster
from agentq.controlplane.binaries import resolve
from agentq.controlplane.cluster import ClusterState
from fleet import ControlPlane, Fleet, install_crds
from pgserver import PostgresServer, find_bin_dir


@pytest.fixture(scope="session")
def control_plane(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ControlPlane]:
    shared = parallel.shared_plane(request.config)
    if shared is not None:
        yield shared
        return
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
def own_fleet(own_cluster: tuple[Cluster, ClusterState], tmp_path: Path) -> Iterator[Fleet]:
    """A fleet in a fresh namespace of ``own_cluster`` (the module's own control plane)."""
    _, state = own_cluster
    fleet = Fleet(
        kubeconfig=state.kubeconfig,
        namespace=f"own-{uuid.uuid4().hex[:8]}",
        workdir=tmp_path,
        kubectl=state.binaries["kubectl"],
    )
    fleet.kubectl("create", "namespace", fleet.namespace)
    try:
        yield fleet
    finally:
        fleet.close()


@pytest.fixture(scope="session")
def core_api(control_plane: ControlPlane) -> Iterator[client.CoreV1Api]:
    """The admin's core API client, in this process (a kubectl per call is a process)."""
    api = control_plane.api_client()
    try:
        yield client.CoreV1Api(api)
    finally:
        api.close()


@pytest.fixture
def namespace(core_api: client.CoreV1Api) -> Iterator[str]:
    """A fresh namespace for one test, deleted (without waiting) afterwards."""
    name = f"t-{uuid.uuid4().hex[:10]}"
    core_api.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    yield name
    try:
        core_api.delete_namespace(name)  # returns at once; the namespace goes later
    except ApiException as err:
        if err.status != 404:
            raise


@pytest.fixture(scope="session")
def agentq_crds(request: pytest.FixtureRequest, control_plane: ControlPlane) -> None:
    """The AgentTask and AgentWorker CRDs, installed and Established."""
    parallel.once(request.config, "crds", lambda: install_crds(control_plane))


@pytest.fixture(scope="session")
def agentq_installed(
    request: pytest.FixtureRequest, control_plane: ControlPlane, agentq_crds: None
) -> None:
    """manifests/ (CRDs, namespace, RBAC, the admission policy), without the operator's
    Deployment: its pods could not run on a control plane without a node. Returns once
    the admission policy is in force."""
    from manifests import install_base, to_yaml

    def install() -> None:
        base = install_base(control_plane.kubectl_path)
        # Not the leader-epoch policy: bound cluster-wide, it fences every AgentTask status
        # write against the election Lease agentq-system/agentq-operator (which
        # test_manifests' operator makes), and the shared control plane runs many operators
        # without leader election in other namespaces: their grants, carrying no epoch,
        # would be refused. test_leader_epoch_fence binds it to its own namespace.
        objects = [
            o
            for o in base
            if o["kind"] != "Deployment" and o["metadata"]["name"] != protocol.LEADER_EPOCH_POLICY
        ]
        control_plane.kubectl("apply", "-f", "-", input=to_yaml(objects))
        wait_policy_in_force(control_plane)

    parallel.once(request.config, "agentq-installed", install)


def wait_policy_in_force(control_plane: ControlPlane, timeout: float = 60) -> None:
    """Until the API server enforces both admission policies, agentq-agent-writes and
    agentq-operator-leases: it loads a new policy some time after the write (a test that
    ran at once saw a foreign write accepted). Each probe is a dry-run create of a Lease
    the policy refuses (an agent's in another namespace than its account's; an unlabelled
    one of the operator's), as the account impersonated with group system:masters (so
    RBAC allows it and the policy alone can refuse)."""
    probes = {
        "agentq-agent-writes": (
            "system:serviceaccount:agentq-probe:agentq-agent-p",
            client.V1ObjectMeta(
                name="agentq-worker-p",
                labels={"agentq.dev/lease": "worker", "agentq.dev/worker": "p"},
            ),
        ),
        "agentq-operator-leases": (
            "system:serviceaccount:agentq-probe:agentq-operator",
            client.V1ObjectMeta(name="agentq-probe"),
        ),
    }
    deadline = time.monotonic() + timeout
    for policy, (user, metadata) in probes.items():
        api = control_plane.api_client()
        api.set_default_header("Impersonate-User", user)
        api.set_default_header("Impersonate-Group", "system:masters")
        leases = client.CoordinationV1Api(api)
        probe = client.V1Lease(
            metadata=metadata,
            spec=client.V1LeaseSpec(holder_identity="p", lease_duration_seconds=10),
        )
        try:
            while True:
                try:
                    leases.create_namespaced_lease("default", probe, dry_run="All")
                except ApiException as err:
                    if err.status == 403 and policy in str(err.body):
                        break
                    raise
                if time.monotonic() > deadline:
                    raise AssertionError(f"admission policy {policy} not in force after {timeout}s")
                time.sleep(0.2)
        finally:
            api.close()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A failed test that used a fleet shows the tail of its processes' logs (operator,
    sidecars, agents): what CI prints is all there is to read after a flaky run."""
    outcome = yield
    report = outcome.get_result()
    fleet = getattr(item, "funcargs", {}).get("fleet")
    if report.failed and report.when == "call" and isinstance(fleet, Fleet):
        try:
            report.sections.append(("fleet logs (tails)", fleet.logs(tail=80)))
        except OSError as err:  # a log file gone: the failure itself still shows
            report.sections.append(("fleet logs (tails)", f"unreadable: {err}"))


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
