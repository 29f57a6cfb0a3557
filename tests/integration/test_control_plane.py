"""The embedded control plane is a real Kubernetes API server with real controllers.

Each test here would fail against a mock: CRD schema validation, resourceVersion
preconditions on Leases and owner-reference garbage collection are performed by
kube-apiserver and kube-controller-manager themselves.
"""

from __future__ import annotations

import datetime
import json
import time

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from agentq.controlplane.versions import KUBERNETES_VERSION
from fleet import ControlPlane

WIDGET_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "widgets.smoke.agentq.dev"},
    "spec": {
        "group": "smoke.agentq.dev",
        "scope": "Namespaced",
        "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "properties": {
                            "spec": {
                                "type": "object",
                                "required": ["size"],
                                "properties": {"size": {"type": "integer", "minimum": 1}},
                            }
                        },
                    }
                },
            }
        ],
    },
}


def widget(name: str, size: object) -> str:
    return json.dumps(
        {
            "apiVersion": "smoke.agentq.dev/v1",
            "kind": "Widget",
            "metadata": {"name": name},
            "spec": {"size": size},
        }
    )


def test_server_reports_the_pinned_version(control_plane: ControlPlane) -> None:
    version = json.loads(control_plane.kubectl("version", "-o", "json").stdout)
    assert version["serverVersion"]["gitVersion"] == KUBERNETES_VERSION
    assert version["clientVersion"]["gitVersion"] == KUBERNETES_VERSION


def test_crd_is_served_and_its_schema_enforced(control_plane: ControlPlane, namespace: str) -> None:
    control_plane.kubectl("apply", "-f", "-", input=json.dumps(WIDGET_CRD))
    control_plane.kubectl(
        "wait", "--for=condition=Established", "crd/widgets.smoke.agentq.dev", "--timeout=30s"
    )

    control_plane.kubectl("apply", "-n", namespace, "-f", "-", input=widget("good", 3))
    read = json.loads(
        control_plane.kubectl("get", "-n", namespace, "widget/good", "-o", "json").stdout
    )
    assert read["spec"] == {"size": 3}
    assert read["metadata"]["uid"]

    refused = control_plane.kubectl(
        "apply", "-n", namespace, "-f", "-", input=widget("bad", 0), check=False
    )
    assert refused.returncode != 0
    assert "spec.size" in refused.stderr
    assert "should be greater than or equal to 1" in refused.stderr
    absent = control_plane.kubectl("get", "-n", namespace, "widget/bad", check=False)
    assert absent.returncode != 0 and "NotFound" in absent.stderr


def test_lease_update_with_stale_resource_version_conflicts(
    control_plane: ControlPlane, namespace: str
) -> None:
    leases = client.CoordinationV1Api(control_plane.api_client())
    now = datetime.datetime.now(datetime.UTC)
    created = leases.create_namespaced_lease(
        namespace,
        client.V1Lease(
            metadata=client.V1ObjectMeta(name="claim"),
            spec=client.V1LeaseSpec(
                holder_identity="worker-a", lease_duration_seconds=15, renew_time=now
            ),
        ),
    )
    stale_version = created.metadata.resource_version

    created.spec.renew_time = now + datetime.timedelta(seconds=5)
    renewed = leases.replace_namespaced_lease("claim", namespace, created)
    assert renewed.metadata.resource_version != stale_version

    created.metadata.resource_version = stale_version
    created.spec.holder_identity = "zombie"
    with pytest.raises(ApiException) as refused:
        leases.replace_namespaced_lease("claim", namespace, created)
    assert refused.value.status == 409

    current = leases.read_namespaced_lease("claim", namespace)
    assert current.spec.holder_identity == "worker-a"
    assert current.metadata.resource_version == renewed.metadata.resource_version


def test_dependents_are_garbage_collected_with_their_owner(
    control_plane: ControlPlane, namespace: str
) -> None:
    core = client.CoreV1Api(control_plane.api_client())
    owner = core.create_namespaced_config_map(
        namespace, client.V1ConfigMap(metadata=client.V1ObjectMeta(name="owner"))
    )
    core.create_namespaced_config_map(
        namespace,
        client.V1ConfigMap(
            metadata=client.V1ObjectMeta(
                name="dependent",
                owner_references=[
                    client.V1OwnerReference(
                        api_version="v1", kind="ConfigMap", name="owner", uid=owner.metadata.uid
                    )
                ],
            )
        ),
    )
    core.delete_namespaced_config_map("owner", namespace)

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            core.read_namespaced_config_map("dependent", namespace)
        except ApiException as err:
            assert err.status == 404
            return
        time.sleep(0.25)
    pytest.fail("the dependent ConfigMap outlived its owner by 60 s: no garbage collector runs")
