"""A leader frozen mid-grant, its request held past a takeover, must not put a worker
over its maxInFlight when the request finally reaches the API server: the grant
carries the old leader's epoch and the admission policy agentq-leader-epoch
(manifests/leader-epoch-policy.yaml) refuses it (docs/operator.md, "Fencing the
leader itself").

Replica A talks to the API server through a relay the test controls. While the relay
holds A's requests, A grants task ``new`` to worker ``w`` (maxInFlight 1): the
request is on the wire. A is frozen (SIGSTOP, so its connection stays open and the
request stays whole); the standby B takes over and, since ``w`` was given the
capability an older task ``old`` waited for, grants ``old`` to ``w``. Then the relay
lets A's grant through: the API server would apply it (``new`` has not changed, so
its compare-and-swap succeeds) -- but its epoch is older than the election Lease's,
and the policy refuses it. What the API server holds is read back throughout.

Without the policy or the epoch this test fails: ``w`` holds both tasks.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from agentq import GROUP, VERSION, protocol
from builders import task, worker
from fleet import ControlPlane, Fleet, Process
from manifests import MANIFESTS, install_base
from relay import (
    only_old_on_w,
    relayed_kubeconfig,
    standby_and_an_older_task,
    takeover_grants_old_to_w,
    wait_for,
)

pytestmark = pytest.mark.integration

FLAGS = ("--leader-election", "--leader-lease-seconds", "4")
LEADER_LEASE = "agentq-operator"


def policy_for(namespace: str) -> list[dict[str, Any]]:
    """manifests/leader-epoch-policy.yaml bound to this test's namespace alone, its
    paramRef the election Lease the test's operators use (in the same namespace)."""
    policy, binding = yaml.safe_load_all((MANIFESTS / "leader-epoch-policy.yaml").read_text())
    name = f"{protocol.LEADER_EPOCH_POLICY}-{namespace}"
    policy["metadata"]["name"] = name
    binding["metadata"]["name"] = name
    binding["spec"]["policyName"] = name
    binding["spec"]["paramRef"]["namespace"] = namespace
    binding["spec"]["matchResources"] = {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
    }
    return [policy, binding]


@pytest.fixture
def epoch_policy(control_plane: ControlPlane, fleet: Fleet) -> Iterator[None]:
    """The policy in force for the fleet's namespace, with the election Lease made
    (released: the first operator takes it at once, raising leaseTransitions to 1)."""
    objects = policy_for(fleet.namespace)
    text = yaml.safe_dump_all(objects)
    fleet.leases.create_namespaced_lease(
        fleet.namespace,
        client.V1Lease(
            metadata=client.V1ObjectMeta(name=LEADER_LEASE),
            spec=client.V1LeaseSpec(lease_duration_seconds=1, lease_transitions=0),
        ),
    )
    control_plane.kubectl("apply", "-f", "-", input=text)
    try:
        wait_in_force(fleet)
        yield
    finally:
        control_plane.kubectl("delete", "--ignore-not-found", "-f", "-", input=text)


def wait_in_force(fleet: Fleet, timeout: float = 60) -> None:
    """Until a grant without an epoch is refused (a dry run on a probe task): the API
    server loads a new policy and binding some time after they are written."""
    fleet.add_task(task("probe").requires("nobody-has-this"))
    grant = {"status": {"phase": "Assigned", "worker": "nobody", "fencingToken": 1}}
    deadline = time.monotonic() + timeout
    while True:
        try:
            fleet.custom.patch_namespaced_custom_object_status(
                GROUP, VERSION, fleet.namespace, "agenttasks", "probe", grant, dry_run="All"
            )
        except ApiException as err:
            if err.status == 403 and protocol.LEADER_EPOCH_POLICY in str(err.body):
                assert "leader epoch (none)" in str(err.body), err.body
                return
            raise
        assert time.monotonic() < deadline, f"the epoch policy is not in force after {timeout}s"
        time.sleep(0.2)


def transitions(fleet: Fleet) -> int:
    lease = fleet.leases.read_namespaced_lease(LEADER_LEASE, fleet.namespace)
    return int(lease.spec.lease_transitions or 0)


@pytest.mark.timeout(240)
def test_a_frozen_leaders_grant_held_past_a_takeover_is_refused_for_its_epoch(
    fleet: Fleet, epoch_policy: None, tmp_path: Path
) -> None:
    fleet.add_worker(worker("w").capabilities("llm").max_in_flight(1))
    fleet.agent("w", "hold").wait_serving()
    relay, kubeconfig = relayed_kubeconfig(fleet.kubeconfig, tmp_path)
    a: Process | None = None
    try:
        a = fleet.operator(*FLAGS, env={"KUBECONFIG": kubeconfig})
        replica_a = a
        wait_for("A leads", lambda: str(replica_a.pid) in fleet.leader(), fleet)
        epoch_a = transitions(fleet)
        b = standby_and_an_older_task(fleet, *FLAGS)

        relay.hold()
        fleet.add_task(task("new").requires("llm").lease(120))
        before = fleet.task("new")
        time.sleep(1.5)  # A grants new to w: the request is on the wire, held
        a.signal(signal.SIGSTOP)  # frozen mid-grant; its connection stays open
        assert (fleet.task("new").get("status") or {}).get("phase") in (None, "Pending")

        takeover_grants_old_to_w(fleet, b)  # while A is frozen
        epoch_b = transitions(fleet)
        assert epoch_b > epoch_a
        assert fleet.task("old")["status"]["leaderEpoch"] == epoch_b
        # A's held grant would win its compare-and-swap: nobody wrote new since.
        assert (
            fleet.task("new")["metadata"]["resourceVersion"]
            == (before["metadata"]["resourceVersion"])
        )

        relay.flow()  # A's grant reaches the API server, A still frozen
        only_old_on_w(fleet, 5, "a deposed leader's grant put w over maxInFlight 1")

        a.signal(signal.SIGCONT)
        # A resumes: whatever it would send, it sends now.
        only_old_on_w(fleet, 8, "two deciders put w over maxInFlight 1")
        assert str(b.pid) in fleet.leader()
        assert (fleet.task("new").get("status") or {}).get("phase") in (None, "Pending")
        assert fleet.worker("w")["spec"]["maxInFlight"] == 1
    finally:
        if a is not None:
            a.signal(signal.SIGCONT)
        relay.close()


def test_the_install_base_binds_the_policy_to_the_operators_election_lease(
    control_plane: ControlPlane,
) -> None:
    """The binding's paramRef is where the Deployment's operator keeps its election
    Lease (LEADER_NAMESPACE, and the default LEADER_LEASE), and lets grants through when
    there is none (--no-leader-election)."""
    objects = {
        (o["kind"], o["metadata"]["name"]): o for o in install_base(control_plane.kubectl_path)
    }
    policy = objects[("ValidatingAdmissionPolicy", protocol.LEADER_EPOCH_POLICY)]
    assert policy["spec"]["paramKind"] == {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease"}
    binding = objects[("ValidatingAdmissionPolicyBinding", protocol.LEADER_EPOCH_POLICY)]
    operator = objects[("Deployment", "agentq-operator")]
    (container,) = operator["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert binding["spec"]["paramRef"] == {
        "name": env.get("AGENTQ_LEADER_LEASE", LEADER_LEASE),
        "namespace": env["AGENTQ_LEADER_NAMESPACE"],
        "parameterNotFoundAction": "Allow",
    }
