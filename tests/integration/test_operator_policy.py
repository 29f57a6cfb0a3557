"""The admission policy agentq-operator-leases on the real API server, with a real token
of the operator's ServiceAccount (manifests/operator-rbac.yaml).

The operator's ClusterRole may write every Lease in every namespace (RBAC cannot select
by label); the policy narrows it to agentq's own: Leases labelled agentq.dev/lease (and a
claim's Lease whose label was removed, to repair it), and its election Lease and
fencing-token counter in its own namespace. A node's heartbeat, another controller's
leader Lease, or a foreign Lease relabelled as agentq's are refused.
"""

from __future__ import annotations

import datetime
import uuid
from collections.abc import Iterator
from functools import partial

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from accounts import api_for_token, refused, token
from fleet import ControlPlane

POLICY = "ValidatingAdmissionPolicy 'agentq-operator-leases'"
HOME = "agentq-system"  # the operator's namespace (manifests/namespace.yaml)


def lease(name: str, **labels: str) -> client.V1Lease:
    return client.V1Lease(
        metadata=client.V1ObjectMeta(name=name, labels=labels or None),
        spec=client.V1LeaseSpec(
            holder_identity="someone",
            lease_duration_seconds=40,
            renew_time=datetime.datetime.now(datetime.UTC),
        ),
    )


@pytest.fixture
def leases(
    control_plane: ControlPlane, agentq_installed: None
) -> Iterator[tuple[client.CoordinationV1Api, client.CoordinationV1Api]]:
    """(the operator's, the admin's) Lease clients."""
    admin = control_plane.api_client()
    core = client.CoreV1Api(admin)
    own = api_for_token(control_plane.kubeconfig, token(core, HOME, "agentq-operator"))
    try:
        yield client.CoordinationV1Api(own), client.CoordinationV1Api(admin)
    finally:
        own.close()
        admin.close()


def test_the_operator_cannot_touch_a_node_heartbeat_or_a_foreign_lease(
    leases: tuple[client.CoordinationV1Api, client.CoordinationV1Api], namespace: str
) -> None:
    operator, admin = leases
    # A node's heartbeat, as a kubelet keeps it, and another controller's leader Lease.
    node = f"node-{uuid.uuid4().hex[:8]}"
    admin.create_namespaced_lease("kube-node-lease", lease(node))
    admin.create_namespaced_lease(namespace, lease("other-controller-leader"))
    try:
        for ns, name in (("kube-node-lease", node), (namespace, "other-controller-leader")):
            current = operator.read_namespaced_lease(name, ns)  # reading stays allowed
            current.spec.holder_identity = "agentq"
            body = refused(partial(operator.replace_namespaced_lease, name, ns, current), by=POLICY)
            assert f"not Lease {ns}/{name}" in body, body
            # Relabelling it as agentq's does not make it agentq's.
            current.metadata.labels = {"agentq.dev/lease": "task"}
            refused(partial(operator.replace_namespaced_lease, name, ns, current), by=POLICY)
            relabel = {"metadata": {"labels": {"agentq.dev/lease": "task"}}}
            refused(partial(operator.patch_namespaced_lease, name, ns, relabel), by=POLICY)
            refused(partial(operator.delete_namespaced_lease, name, ns), by=POLICY)
        # Nor may it create an unlabelled one, nor its election Lease's name elsewhere.
        refused(lambda: operator.create_namespaced_lease(namespace, lease("anything")), by=POLICY)
        refused(
            lambda: operator.create_namespaced_lease(namespace, lease("agentq-operator")), by=POLICY
        )
        refused(
            lambda: operator.create_namespaced_lease(
                "kube-node-lease", lease("agentq-fencing-tokens")
            ),
            by=POLICY,
        )
        # Nothing changed.
        heartbeat = admin.read_namespaced_lease(node, "kube-node-lease")
        assert heartbeat.spec.holder_identity == "someone"
        assert not heartbeat.metadata.labels
    finally:
        admin.delete_namespaced_lease(node, "kube-node-lease")


def test_the_operator_writes_its_claims_and_its_own_election_lease(
    leases: tuple[client.CoordinationV1Api, client.CoordinationV1Api], namespace: str
) -> None:
    operator, admin = leases
    claim = operator.create_namespaced_lease(
        namespace, lease("agentq-task-t1", **{"agentq.dev/lease": "task"})
    )
    claim.spec.holder_identity = "w1"
    operator.replace_namespaced_lease("agentq-task-t1", namespace, claim)
    operator.patch_namespaced_lease(
        "agentq-task-t1", namespace, {"metadata": {"annotations": {"agentq.dev/revoked": "x"}}}
    )
    # A claim whose label someone removed: the operator may put it back, or delete it.
    admin.patch_namespaced_lease(
        "agentq-task-t1", namespace, {"metadata": {"labels": {"agentq.dev/lease": None}}}
    )
    stripped = operator.read_namespaced_lease("agentq-task-t1", namespace)
    assert not stripped.metadata.labels
    # ... but not leave it unlabelled.
    stripped.spec.holder_identity = "w2"
    refused(
        lambda: operator.replace_namespaced_lease("agentq-task-t1", namespace, stripped), by=POLICY
    )
    stripped.metadata.labels = {"agentq.dev/lease": "task"}
    operator.replace_namespaced_lease("agentq-task-t1", namespace, stripped)
    operator.delete_namespaced_lease("agentq-task-t1", namespace)
    admin.create_namespaced_lease(namespace, lease("agentq-task-t2"))
    operator.delete_namespaced_lease("agentq-task-t2", namespace)

    # Its election Lease and token counter in its own namespace (dry runs: a test that
    # runs the operator with its account elects on the real ones).
    for name in ("agentq-operator", "agentq-fencing-tokens"):
        try:
            current = operator.read_namespaced_lease(name, HOME)
        except ApiException as err:
            assert err.status == 404, err
            operator.create_namespaced_lease(HOME, lease(name), dry_run="All")
        else:
            current.spec.renew_time = datetime.datetime.now(datetime.UTC)
            operator.replace_namespaced_lease(name, HOME, current, dry_run="All")
