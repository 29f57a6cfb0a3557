"""The kustomize bases: what they contain, and that the operator does its whole job
with exactly the ServiceAccount and RBAC they install (a missing rule fails here).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from accounts import bound_pod, kubeconfig_for_token, token
from agentq import GROUP, VERSION
from agentq.fencing import open_store
from builders import task, worker
from fleet import ControlPlane, Fleet
from manifests import MANIFESTS, agent_objects, containers, install_base, kustomize, to_yaml


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
        ("ValidatingAdmissionPolicy", "agentq-operator-leases"),
        ("ValidatingAdmissionPolicyBinding", "agentq-operator-leases"),
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
    assert {"AGENTQ_LEADER_NAMESPACE"} <= {e["name"] for e in container["env"]}
    assert container["image"] == "agentq:dev"
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    # Scheduled ahead of ordinary pods; evicted one replica at a time; reachable only on
    # its metrics port, only from a namespace labelled for it.
    assert pod["priorityClassName"] == "agentq-operator"
    assert objects[("PriorityClass", "agentq-operator")]["value"] > 0
    labels = operator["spec"]["selector"]["matchLabels"]
    budget = objects[("PodDisruptionBudget", "agentq-operator")]["spec"]
    assert budget["selector"]["matchLabels"] == labels and budget["maxUnavailable"] == 1
    network = objects[("NetworkPolicy", "agentq-operator")]["spec"]
    assert network["podSelector"]["matchLabels"] == labels
    assert network["policyTypes"] == ["Ingress"]
    scrape, claims = network["ingress"]
    assert scrape["from"] == [
        {"namespaceSelector": {"matchLabels": {"agentq.dev/metrics-access": "allow"}}}
    ]
    assert scrape["ports"] == [{"protocol": "TCP", "port": "metrics"}]
    # The claim port: agent pods of any namespace only (the agent pods' label: below).
    assert claims["from"] == [
        {
            "namespaceSelector": {},
            "podSelector": {"matchLabels": {"app.kubernetes.io/name": "agentq-agent"}},
        }
    ]
    assert claims["ports"] == [{"protocol": "TCP", "port": "claims"}]
    # The claim API: on its own port, behind a Service over every replica; it checks
    # agents' tokens with TokenReviews, which the operator may create.
    env = {e["name"]: e.get("value") for e in container["env"]}
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["claims"] == int(env["AGENTQ_CLAIM_PORT"]) == 8444
    service = objects[("Service", "agentq-operator-claims")]
    assert service["metadata"]["namespace"] == "agentq-system"
    assert service["spec"]["selector"] == labels
    assert service["spec"]["ports"] == [
        {"name": "claims", "port": 8444, "targetPort": "claims", "protocol": "TCP"}
    ]
    assert {
        "apiGroups": ["authentication.k8s.io"],
        "resources": ["tokenreviews"],
        "verbs": ["create"],
    } in objects[("ClusterRole", "agentq-operator")]["rules"]
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
    assert_credentials_only_in_the_sidecar(pod)
    # The sidecar reaches the operator's claim API through its Service, and the
    # NetworkPolicy admits these pods by their label.
    base = _by_kind(install_base(control_plane.kubectl_path))
    service = base[("Service", "agentq-operator-claims")]
    env = {e["name"]: e.get("value") for e in sidecar["env"]}
    name, namespace = service["metadata"]["name"], service["metadata"]["namespace"]
    port = service["spec"]["ports"][0]["port"]
    assert env["AGENTQ_OPERATOR_URL"] == f"http://{name}.{namespace}.svc:{port}"
    (_, claims) = base[("NetworkPolicy", "agentq-operator")]["spec"]["ingress"]
    labels = objects[("Deployment", "agent-example")]["spec"]["template"]["metadata"]["labels"]
    assert claims["from"][0]["podSelector"]["matchLabels"].items() <= labels.items()
    # Rendered for another worker, every reference to the worker follows.
    renamed = _by_kind(agent_objects(control_plane.kubectl_path, worker="large", namespace="ns1"))
    assert ("ServiceAccount", "agentq-agent-large") in renamed
    pod = renamed[("Deployment", "agent-large")]["spec"]["template"]["spec"]
    env = {e["name"]: e.get("value") for e in pod["initContainers"][0]["env"]}
    assert env["AGENTQ_WORKER"] == "large"
    assert pod["serviceAccountName"] == "agentq-agent-large"
    assert "example" not in str(renamed)


SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


def assert_credentials_only_in_the_sidecar(pod: dict[str, Any]) -> None:
    """The agent container gets no ServiceAccount token; the sidecar mounts a projected
    one where the in-cluster config looks; the two share one volume, holding the
    sidecar's secret, read-only for the agent; each has its own HOME and /tmp."""
    assert pod["automountServiceAccountToken"] is False
    (sidecar,) = pod["initContainers"]
    (agent,) = pod["containers"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {
        c["name"]: {m["mountPath"]: m for m in c.get("volumeMounts", [])} for c in (sidecar, agent)
    }
    account = mounts["sidecar"][SERVICE_ACCOUNT_DIR]
    assert account.get("readOnly") is True
    sources = volumes[account["name"]]["projected"]["sources"]
    assert {next(iter(s)) for s in sources} == {"serviceAccountToken", "configMap", "downwardAPI"}
    assert [s["configMap"]["name"] for s in sources if "configMap" in s] == ["kube-root-ca.crt"]
    assert not any(m["name"] == account["name"] for m in mounts["agent"].values())
    assert not any(p.startswith("/var/run/secrets") for p in mounts["agent"])
    # The token for the operator's claim API: its audience alone, 10 minutes, the
    # sidecar alone, where AGENTQ_OPERATOR_TOKEN_FILE says.
    sidecar_env = {e["name"]: e.get("value") for e in sidecar["env"]}
    token_path = Path(sidecar_env["AGENTQ_OPERATOR_TOKEN_FILE"])
    operator = mounts["sidecar"][str(token_path.parent)]
    assert operator.get("readOnly") is True
    (source,) = volumes[operator["name"]]["projected"]["sources"]
    assert source == {
        "serviceAccountToken": {
            "path": token_path.name,
            "audience": "agentq.dev/operator",
            "expirationSeconds": 600,
        }
    }
    assert not any(m["name"] == operator["name"] for m in mounts["agent"].values())
    shared = {m["name"] for m in mounts["sidecar"].values()} & {
        m["name"] for m in mounts["agent"].values()
    }
    assert len(shared) == 1, shared
    (name,) = shared
    assert "emptyDir" in volumes[name]
    (agent_side,) = [m for m in mounts["agent"].values() if m["name"] == name]
    assert agent_side.get("readOnly") is True
    env = {c["name"]: {e["name"]: e.get("value") for e in c["env"]} for c in (sidecar, agent)}
    token_file = env["sidecar"]["AGENTQ_SIDECAR_TOKEN_FILE"]
    assert env["agent"]["AGENTQ_SIDECAR_TOKEN_FILE"] == token_file
    assert token_file.startswith(agent_side["mountPath"] + "/")
    for container in ("sidecar", "agent"):
        home = env[container]["HOME"]
        assert home in mounts[container] and "/tmp" in mounts[container], container
    # Probes and scraping on the metrics port, never the agent API (it wants the secret).
    assert env["sidecar"]["AGENTQ_SIDECAR_LISTEN"].startswith("127.0.0.1:")
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert sidecar[probe]["httpGet"]["port"] == "metrics", probe


def test_the_agent_pod_passes_the_restricted_pod_security_as_is(fleet: Fleet) -> None:
    """The agent pod (projected token, emptyDirs, httpGet probes on the metrics port)
    is admitted by the API server in a namespace enforcing PodSecurity restricted."""
    fleet.kubectl(
        "label", "namespace", fleet.namespace, "pod-security.kubernetes.io/enforce=restricted"
    )
    objects = agent_objects(fleet.kubectl_path, worker="psa", namespace=fleet.namespace)
    (deployment,) = [o for o in objects if o["kind"] == "Deployment"]
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "agent-psa", "namespace": fleet.namespace},
        "spec": deployment["spec"]["template"]["spec"],
    }
    accounts = [o for o in objects if o["kind"] in ("ServiceAccount", "RoleBinding")]
    fleet.kubectl("apply", "-f", "-", input=to_yaml(accounts))
    out = fleet.kubectl("apply", "--dry-run=server", "-f", "-", input=to_yaml([pod]))
    assert "pod/agent-psa created (server dry run)" in out, out


def test_the_operator_works_with_exactly_its_own_account(
    control_plane: ControlPlane, agentq_installed: None, fleet: Fleet, tmp_path: Path
) -> None:
    core = client.CoreV1Api(control_plane.api_client())
    own = kubeconfig_for_token(
        control_plane.kubeconfig,
        token(core, "agentq-system", "agentq-operator"),
        tmp_path / "operator.kubeconfig",
    )
    # Its election Lease and token counter in its own namespace: the admission policy
    # agentq-operator-leases allows those two names there and no unlabelled Lease else.
    operator = fleet.operator("--leader-namespace", "agentq-system", env={"KUBECONFIG": str(own)})
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


def _agent_kubeconfig(
    control_plane: ControlPlane, namespace: str, worker_name: str, path: Path
) -> Path:
    """Worker ``worker_name``'s own account from manifests/agent/ (the shipped role
    ``agentq-agent``), with a token bound to a Pod object as a kubelet would mount it."""
    core = client.CoreV1Api(control_plane.api_client())
    objects = agent_objects(control_plane.kubectl_path, worker=worker_name, namespace=namespace)
    accounts = [o for o in objects if o["kind"] in ("ServiceAccount", "RoleBinding")]
    control_plane.kubectl("apply", "-f", "-", input=to_yaml(accounts))
    account = f"agentq-agent-{worker_name}"
    pod = bound_pod(core, namespace, account, f"{worker_name}-pod")
    return kubeconfig_for_token(
        control_plane.kubeconfig, token(core, namespace, account, pod=pod), path
    )


def test_agents_do_their_whole_job_with_their_own_accounts_under_the_admission_policy(
    control_plane: ControlPlane, agentq_installed: None, fleet: Fleet, tmp_path: Path
) -> None:
    """Sidecars with exactly the shipped role and pod-bound tokens, under the policy
    agentq-agent-writes: each registers its own AgentWorker, keeps its worker Lease,
    renews and reports on its task Leases; a frozen sidecar's claim is reclaimed and,
    woken up, it is refused (by the policy or a conflict), tells its agent, and keeps
    serving; the sink shows one output per task."""
    sink = f"sqlite://{tmp_path / 'sink.db'}"
    own = {
        name: _agent_kubeconfig(control_plane, fleet.namespace, name, tmp_path / f"{name}.kcfg")
        for name in ("a", "b")
    }
    # a's agent works long enough to be frozen mid-task; it registers itself from flags.
    pair_a = fleet.agent(
        "a", "complete", kubeconfig=str(own["a"]), sink=sink, capabilities="slow", work_seconds=20
    )
    pair_b = fleet.agent(
        "b", "complete", kubeconfig=str(own["b"]), sink=sink, capabilities="fast", work_seconds=0.2
    )
    fleet.operator()
    fleet.wait_all(lambda _: _ready(fleet, "a") and _ready(fleet, "b"), timeout=60)
    for i in range(3):
        fleet.add_task(task(f"quick{i}").requires("fast"))
    for i in range(3):
        fleet.wait_phase(f"quick{i}", "Succeeded", timeout=60)

    fleet.add_task(task("long").requires("slow").lease(3).backoff(initial=0))
    first = fleet.wait_phase("long", "Running", timeout=30)["status"]
    assert first["worker"] == "a"
    # b may take it once a's claim is gone: b now offers "slow" too (its own update).
    fleet.custom.patch_namespaced_custom_object(
        GROUP,
        VERSION,
        fleet.namespace,
        "agentworkers",
        "b",
        {"spec": {"capabilities": ["fast", "slow"]}},
    )
    before_freeze = len(pair_a.sidecar.text())
    pair_a.sidecar.signal(signal.SIGSTOP)
    try:
        done = fleet.wait_task(
            "long",
            lambda b: (b.get("status") or {}).get("phase") == "Succeeded",
            timeout=60,
            what="re-dispatched to b and done",
        )["status"]
    finally:
        pair_a.sidecar.signal(signal.SIGCONT)
    assert done["worker"] == "b" and done["fencingToken"] > first["fencingToken"]

    # a's sidecar, awake, learns its claim is gone and tells its agent; it keeps serving.
    deadline = time.monotonic() + 30
    while not [e for e in pair_a.agent.events() if e["event"] in ("lost", "sink-refused")]:
        assert time.monotonic() < deadline, pair_a.agent.text()[-3000:]
        time.sleep(0.2)
    assert pair_a.sidecar.popen.poll() is None, pair_a.sidecar.text()[-3000:]
    assert not [e for e in pair_a.agent.events() if e["event"] == "reported"]

    with open_store(sink) as store:
        rows = {r.key: r for r in store.records()}
    assert sorted(rows) == ["long", "quick0", "quick1", "quick2"]
    assert rows["long"].token == done["fencingToken"] and rows["long"].value["by"] == "b"
    # b never met a refusal: its role and the policy allow everything it does.
    for text in (pair_b.sidecar.text(), pair_a.sidecar.text()[:before_freeze]):
        assert "Forbidden" not in text and "forbidden" not in text, text[-3000:]
    worker_lease = fleet.leases.read_namespaced_lease("agentq-worker-b", fleet.namespace)
    assert worker_lease.spec.holder_identity == "b-pod"


def _ready(fleet: Fleet, name: str) -> bool:
    """Whether AgentWorker ``name`` exists (its sidecar registers it) and is Ready."""
    try:
        body = fleet.worker(name)
    except client.ApiException as err:
        if err.status == 404:
            return False
        raise
    return bool((body.get("status") or {}).get("phase") == "Ready")


IMAGE = "registry.example/team/agentq:0.1.0"


def _images(objects: list[dict[str, Any]]) -> set[str]:
    return {c["image"] for obj in objects for c in containers(obj)}


def test_one_image_override_reaches_every_component_examples_included(
    control_plane: ControlPlane, tmp_path: Path
) -> None:
    """The documented real-cluster path: the image set once reaches the operator, the
    agent base and the examples (which go through manifests/agent/). Two ways: in
    manifests/image/ (the one place the tree names it), or one `images:` entry of an
    overlay; either way no `agentq:dev` is left."""
    kubectl = control_plane.kubectl_path
    # The tree as shipped names agentq:dev everywhere, from that one place.
    for directory in (
        MANIFESTS,
        MANIFESTS / "agent",
        MANIFESTS / "examples",
        MANIFESTS / "examples" / "autoscaling",
    ):
        assert _images(kustomize(kubectl, directory)) == {"agentq:dev"}, directory

    # 1. A copy of the tree with the image set in manifests/image/ alone.
    tree = tmp_path / "tree"
    shutil.copytree(MANIFESTS, tree / "manifests")
    shutil.copytree(MANIFESTS.parent / "crds", tree / "crds")
    component = tree / "manifests" / "image" / "kustomization.yaml"
    body = yaml.safe_load(component.read_text())
    name, tag = IMAGE.rsplit(":", 1)
    body["images"] = [{"name": "agentq", "newName": name, "newTag": tag}]
    component.write_text(yaml.safe_dump(body))
    for sub in ("", "agent", "examples", "examples/autoscaling"):
        objects = kustomize(kubectl, tree / "manifests" / sub)
        assert "agentq:dev" not in json.dumps(objects), sub
        assert _images(objects) == {IMAGE}, sub

    # 2. An overlay of the shipped tree: one `images:` entry, every component follows.
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    overlay.joinpath("kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "resources": [
                    os.path.relpath(MANIFESTS, overlay),
                    os.path.relpath(MANIFESTS / "examples", overlay),
                ],
                "images": [{"name": "agentq", "newName": name, "newTag": tag}],
            }
        )
    )
    objects = kustomize(kubectl, overlay)
    assert "agentq:dev" not in json.dumps(objects)
    assert _images(objects) == {IMAGE}
    assert {"agentq-operator", "agent-example"} <= {
        o["metadata"]["name"] for o in objects if o["kind"] == "Deployment"
    }
