"""The e2e tests' hold on a cluster with real pods (e2e/test_scenario.py,
e2e/test_tenancy.py): the API clients, kubectl, the install base with the locally
built image, an agent pod's containers to run a podchecks script in.

``Cluster(platform, namespace)``: ``namespace`` is where its task, worker and pod
helpers look (the agents' namespace).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kubernetes import client, config

from manifests import MANIFESTS, install_base, to_yaml
from nodetools import Platform, wait_for

CRDS = (
    "crd/agenttasks.agentq.dev",
    "crd/agentworkers.agentq.dev",
    "crd/agentqueues.agentq.dev",
    "crd/agentbudgets.agentq.dev",
)


class Cluster:
    def __init__(self, platform: Platform, namespace: str) -> None:
        self.platform = platform
        self.namespace = namespace
        api = config.new_client_from_config(config_file=platform.kubeconfig)
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.leases = client.CoordinationV1Api(api)

    def kubectl(self, *args: str, input: str | None = None, check: bool = True) -> str:
        return self.platform.run_kubectl(*args, input=input, check=check)

    def apply(self, objects: list[dict[str, Any]]) -> None:
        for obj in objects:
            spec = obj.get("spec", {}).get("template", {}).get("spec", {})
            for container in [*spec.get("initContainers", []), *spec.get("containers", [])]:
                container["imagePullPolicy"] = self.platform.pull_policy
        self.kubectl("apply", "-f", "-", input=to_yaml(objects))

    def tasks(self, namespace: str | None = None) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = self.custom.list_namespaced_custom_object(
            "agentq.dev", "v1alpha1", namespace or self.namespace, "agenttasks"
        )["items"]
        return items

    def worker_phase(self, name: str) -> str:
        try:
            body = self.custom.get_namespaced_custom_object(
                "agentq.dev", "v1alpha1", self.namespace, "agentworkers", name
            )
        except client.ApiException:
            return ""
        return str((body.get("status") or {}).get("phase", ""))

    def pod_of(self, worker: str) -> client.V1Pod:
        pods = self.core.list_namespaced_pod(
            self.namespace, label_selector=f"agentq.dev/worker={worker}"
        ).items
        running = [
            p for p in pods if p.status.phase == "Running" and not p.metadata.deletion_timestamp
        ]
        assert len(running) == 1, [(p.metadata.name, p.status.phase) for p in pods]
        return running[0]

    def leader(self) -> str:
        lease = self.leases.read_namespaced_lease("agentq-operator", "agentq-system")
        return str(lease.spec.holder_identity or "")

    def operator_pods(self) -> list[client.V1Pod]:
        pods: list[client.V1Pod] = self.core.list_namespaced_pod(
            "agentq-system", label_selector="app.kubernetes.io/name=agentq-operator"
        ).items
        return pods


def install(k: Cluster, say: Callable[[str], None], directory: Path = MANIFESTS) -> str:
    """The install base (or an overlay of it, ``directory``) with the platform's image,
    then ``installed``."""
    say(f"installing the kustomize base with image {k.platform.image}")
    k.apply(install_base(k.platform.kubectl, image=k.platform.image, directory=directory))
    return installed(k, say)


def installed(k: Cluster, say: Callable[[str], None]) -> str:
    """An install, by the kustomize base or the chart, ready: CRDs established, the
    operator's 2 replicas rolled out as their own ServiceAccount, one of them leading
    (returned)."""
    k.kubectl("wait", "--for=condition=Established", "--timeout=60s", *CRDS)
    k.kubectl(
        "-n", "agentq-system", "rollout", "status", "deploy/agentq-operator", "--timeout=300s"
    )
    operators = k.operator_pods()
    assert len(operators) == 2
    for pod in operators:
        assert pod.spec.service_account_name == "agentq-operator"
        assert pod.spec.security_context.run_as_user == 65532
        assert pod.status.container_statuses[0].restart_count == 0, "operator crashed at start"
    leader: str = wait_for("an operator to lead", k.leader, 60)
    say(f"2 operator replicas Running as agentq-operator; leader {leader}")
    return leader


def phase(task: dict[str, Any]) -> str:
    return str((task.get("status") or {}).get("phase", ""))


def in_container(
    k: Cluster, pod: str, container: str, script: str, *args: str, namespace: str | None = None
) -> Any:
    """Run a podchecks script with the container's python3; its JSON line."""
    out = k.kubectl(
        "-n", namespace or k.namespace, "exec", pod, "-c", container,
        "--", "python3", "-c", script, *args,
    )  # fmt: skip
    return json.loads(out.strip().splitlines()[-1])
