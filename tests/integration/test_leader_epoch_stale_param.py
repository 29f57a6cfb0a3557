"""An uninstall and a new install on one API server must not stop dispatch for good.

The admission policy agentq-leader-epoch reads the election Lease as its parameter.
An API server whose last binding with a Lease parameter was deleted (``helm
uninstall``, ``kubectl delete -k``) stops its Lease informer for good and, bound
again, keeps judging with the Lease it held then, even after that Lease is gone
(kubernetes/kubernetes#130887; a restart of the API server cures it). A new install's
leader creates a new election Lease (leaseTransitions 0), so each of its grants
(epoch 0) was refused as "older than the leaseTransitions (3)" of the old install's
Lease, and nothing was ever dispatched: ``make e2e`` found it running the scenario
after the Helm e2e on one cluster.

The leader now takes the epoch the policy names when the Lease it holds says less
(docs/operator.md, "A stale policy parameter"), says so (an error log, the gauge
agentq_leader_epoch_policy_stale), and dispatches. This runs on a control plane of
its own: the shared one's other tests bind Lease parameters of their own.
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from test_leader_epoch_fence import LEADER_LEASE, policy_for

from agentq.controlplane import Cluster
from agentq.controlplane.cluster import ClusterState, free_port
from builders import task, worker
from fleet import ControlPlane, Fleet, install_crds

pytestmark = pytest.mark.integration

OLD_TRANSITIONS = 3


@pytest.fixture(scope="module")
def own_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    cluster = Cluster(tmp_path_factory.mktemp("stale-param-plane"))
    state: ClusterState = cluster.up(build=True, tie_to_parent=True)
    try:
        plane = ControlPlane(
            kubeconfig=state.kubeconfig,
            bin_dir=str(Path(state.binaries["kubectl"]).parent),
            server=state.server,
            kubectl_path=state.binaries["kubectl"],
        )
        install_crds(plane)
        yield plane
    finally:
        cluster.down()


def probe_grant(plane: ControlPlane, namespace: str, epoch: int) -> str:
    """A dry-run grant of the probe task with ``epoch``: '' if admitted, else why not."""
    patch = {"status": {"phase": "Assigned", "worker": "nobody", "fencingToken": 1}}
    patch["status"]["leaderEpoch"] = epoch
    done = plane.kubectl(
        "-n", namespace, "patch", "agenttask", "probe", "--subresource=status",
        "--type=merge", "--dry-run=server", "-p", json.dumps(patch), check=False,
    )  # fmt: skip
    return "" if done.returncode == 0 else done.stderr


def wait_until(what: str, predicate: object, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"not reached in {timeout}s: {what}"
        time.sleep(0.2)


@pytest.mark.timeout(300)
def test_a_new_install_dispatches_though_the_policy_holds_the_old_installs_lease(
    own_plane: ControlPlane, tmp_path: Path
) -> None:
    namespace = "stale-param"
    own_plane.kubectl("create", "namespace", namespace)
    fleet = Fleet(
        kubeconfig=own_plane.kubeconfig,
        namespace=namespace,
        workdir=tmp_path,
        kubectl=own_plane.kubectl_path,
    )
    policy = yaml.safe_dump_all(policy_for(namespace))
    try:
        # The old install: its election Lease after three takeovers, the policy bound.
        lease = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": LEADER_LEASE, "namespace": namespace},
            "spec": {"leaseDurationSeconds": 1, "leaseTransitions": OLD_TRANSITIONS},
        }
        own_plane.kubectl("apply", "-f", "-", input=json.dumps(lease))
        own_plane.kubectl("apply", "-f", "-", input=policy)
        fleet.add_task(task("probe").requires("nobody-has-this"))
        wait_until(
            "the policy to judge by the old Lease",
            lambda: f"leaseTransitions ({OLD_TRANSITIONS})" in probe_grant(own_plane, namespace, 0),
        )
        # Uninstalled: the binding goes (the API server stops its Lease informer), then
        # the Lease. The new install binds the policy again.
        own_plane.kubectl("delete", "-f", "-", input=policy)
        time.sleep(3)  # the API server's policy refresh (1 s) sees no Lease parameter
        own_plane.kubectl("-n", namespace, "delete", "lease", LEADER_LEASE)
        own_plane.kubectl("apply", "-f", "-", input=policy)
        wait_until("the policy bound again", lambda: probe_grant(own_plane, namespace, 0) != "")
        refusal = probe_grant(own_plane, namespace, 0)
        if f"leaseTransitions ({OLD_TRANSITIONS})" not in refusal:
            pytest.skip(f"this API server reads the Lease afresh: {refusal}")
        own_plane.kubectl("-n", namespace, "delete", "agenttask", "probe")

        # The new install's operator, a worker, a task: it is granted and done.
        fleet.add_worker(worker("w", "llm").max_in_flight(2))
        fleet.agent("w", "complete", work_seconds=0.2)
        port = free_port()
        operator = fleet.operator(
            "--leader-election", "--leader-lease-seconds", "4", "--metrics-port", str(port)
        )
        fleet.add_task(task("after-reinstall").requires("llm"))
        fleet.wait_phase("after-reinstall", "Succeeded", timeout=60)
        status = fleet.task("after-reinstall")["status"]
        assert status["leaderEpoch"] >= OLD_TRANSITIONS
        held = fleet.leases.read_namespaced_lease(LEADER_LEASE, namespace)
        assert held.spec.lease_transitions >= OLD_TRANSITIONS
        log = operator.text()
        assert "policy parameter is stale" in log, log[-3000:]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as rsp:
            assert "agentq_leader_epoch_policy_stale 1.0" in rsp.read().decode()
    finally:
        fleet.close()
        own_plane.kubectl("delete", "--ignore-not-found", "-f", "-", input=policy, check=False)
