"""The kustomize bases: what they contain, and that the operator does its whole job
with exactly the ServiceAccount and RBAC they install (a missing rule fails here).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kubernetes import client

from accounts import kubeconfig_for_token, token
from builders import task, worker
from fleet import ControlPlane, Fleet
from manifests import MANIFESTS, agent_objects, install_base, kustomize


def _by_kind(objects: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(o["kind"], o["metadata"]["name"]): o for o in objects}


def test_install_base_holds_everything_an_install_needs(control_plane: ControlPlane) -> None:
    objects = _by_kind(install_base(control_plane.kubectl_path))
    assert ("Namespace", "agentq-system") in objects
    for crd in ("agenttasks.agentq.dev", "agentworkers.agentq.dev"):
        assert ("CustomResourceDefinition", crd) in objects
    for kind, name in [
        ("ServiceAccount", "agentq-operator"),
        ("ClusterRole", "agentq-operator"),
        ("ClusterRoleBinding", "agentq-operator"),
        ("ClusterRole", "agentq-agent"),
        ("ValidatingAdmissionPolicy", "agentq-agent-writes"),
        ("ValidatingAdmissionPolicyBinding", "agentq-agent-writes"),
    ]:
        assert (kind, name) in objects, (kind, name)
    operator = objects[("Deployment", "agentq-operator")]
    assert operator["spec"]["replicas"] == 2
    pod = operator["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "agentq-operator"
    assert pod["securityContext"]["runAsNonRoot"] is True
    (container,) = pod["containers"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert {m["mountPath"] for m in container["volumeMounts"]} == {"/tmp"}
    assert {"LEADER_NAMESPACE"} <= {e["name"] for e in container["env"]}
    assert container["image"] == "agentq:dev"
    # The agent role: no delete, no AgentTask writes, no status writes.
    agent_rules = objects[("ClusterRole", "agentq-agent")]["rules"]
    for rule in agent_rules:
        assert "delete" not in rule["verbs"]
        assert not any(r.endswith("/status") for r in rule["resources"])
        if "agenttasks" in rule["resources"]:
            assert set(rule["verbs"]) == {"get"}


def test_agent_base_runs_the_sidecar_as_a_native_sidecar(control_plane: ControlPlane) -> None:
    objects = _by_kind(kustomize(control_plane.kubectl_path, MANIFESTS / "agent"))
    pod = objects[("Deployment", "agent-example")]["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "agentq-agent-example"
    assert pod["terminationGracePeriodSeconds"] >= 10
    (sidecar,) = pod["initContainers"]
    assert sidecar["restartPolicy"] == "Always"
    assert sidecar["args"] == ["sidecar"]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert probe in sidecar
    (agent,) = pod["containers"]
    for container in (sidecar, agent):
        assert container["resources"]["requests"] and container["resources"]["limits"]
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
    binding = objects[("RoleBinding", "agentq-agent-example")]
    assert binding["roleRef"]["name"] == "agentq-agent"
    # Rendered for another worker, every reference to the worker follows.
    renamed = _by_kind(agent_objects(control_plane.kubectl_path, worker="large", namespace="ns1"))
    assert ("ServiceAccount", "agentq-agent-large") in renamed
    pod = renamed[("Deployment", "agent-large")]["spec"]["template"]["spec"]
    env = {e["name"]: e.get("value") for e in pod["initContainers"][0]["env"]}
    assert env["AGENTQ_WORKER"] == "large"
    assert pod["serviceAccountName"] == "agentq-agent-large"
    assert "example" not in str(renamed)


def test_the_operator_works_with_exactly_its_own_account(
    control_plane: ControlPlane, agentq_installed: None, fleet: Fleet, tmp_path: Path
) -> None:
    core = client.CoreV1Api(control_plane.api_client())
    own = kubeconfig_for_token(
        control_plane.kubeconfig,
        token(core, "agentq-system", "agentq-operator"),
        tmp_path / "operator.kubeconfig",
    )
    operator = fleet.operator(env={"KUBECONFIG": str(own)})
    fleet.add_worker(worker("w1").capabilities("llm").max_in_flight(2))
    fleet.agent("w1", "complete", work_seconds=0.2)
    fleet.add_worker(worker("w2").capabilities("llm").max_in_flight(2))
    fleet.agent("w2", "fail", work_seconds=0.2)
    for i in range(4):
        fleet.add_task(task(f"t{i}").requires("llm").max_reclaims(0))
    done = fleet.wait_all(
        lambda items: (
            len(items) == 4
            and all(
                (t.get("status") or {}).get("phase") in ("Succeeded", "DeadLettered", "Failed")
                for t in items
            )
        ),
        timeout=90,
    )
    assert {t["status"]["phase"] for t in done} <= {"Succeeded", "DeadLettered", "Failed"}
    # Events, worker status and the leader Lease were written with its own rights.
    fleet.wait_reasons("t0", {"Assigned": 1})
    fleet.wait_all(lambda _: "phase" in (fleet.worker("w1").get("status") or {}))
    log = operator.text()
    assert "Forbidden" not in log and " 403" not in log and "forbidden" not in log, log[-3000:]
