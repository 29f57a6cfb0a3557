"""charts/agentq: lint-clean, the same objects as manifests/ for the defaults, its values
checked by values.schema.json, and each value doing what values.yaml says.

Needs only the pinned helm (``make helm``) and kubectl (``make controlplane``), no
cluster; ``make test`` builds both first. tests/integration/test_helm_install.py
installs the chart on a real API server.
"""

from __future__ import annotations

import base64
import difflib
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import serialization

import helmchart
import manifests
from agentq.controlplane import binaries
from helmchart import CHART, ROOT, by_key, helm, template


@pytest.fixture(scope="module")
def kubectl() -> str:
    try:
        return str(binaries.resolve(build=False)["kubectl"])
    except binaries.BinaryError as err:
        pytest.skip(f"kubectl not built ({err}); make controlplane")


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    try:
        helmchart.helm_path()
    except binaries.BinaryError as err:
        pytest.skip(f"helm not built ({err}); make helm")
    return tmp_path_factory.mktemp("helm-home")


def _diff(want: dict[str, Any], got: dict[str, Any]) -> str:
    return "\n".join(
        difflib.unified_diff(
            yaml.safe_dump(want, sort_keys=True).splitlines(),
            yaml.safe_dump(got, sort_keys=True).splitlines(),
            "kubectl kustomize",
            "helm template",
            lineterm="",
        )
    )


def _assert_same_objects(want: list[dict[str, Any]], got: list[dict[str, Any]]) -> None:
    wanted, rendered = by_key(want), by_key(got)
    assert sorted(rendered) == sorted(wanted), (
        f"only in kustomize: {sorted(set(wanted) - set(rendered))}; "
        f"only in the chart: {sorted(set(rendered) - set(wanted))}"
    )
    for k, obj in wanted.items():
        assert rendered[k] == obj, f"{k} differs:\n{_diff(obj, rendered[k])}"


def _find(objects: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [o for o in objects if o["kind"] == kind and name in (None, o["metadata"]["name"])]
    assert len(found) == 1, f"{len(found)} {kind} {name or ''} rendered"
    return found[0]


def _env(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in container.get("env", [])}


def test_lint_passes(home: Path) -> None:
    for values in ({}, {"agentPool.enabled": "true"}, {"autoscaledPool.enabled": "true"}):
        done = helm(home, "lint", "--strict", str(CHART), *helmchart.set_args(values))
        assert "0 chart(s) failed" in done.stdout, done.stdout


PLAIN = {"operator.claimTLS.mode": "none"}


def test_plain_http_renders_the_objects_of_manifests(home: Path, kubectl: str) -> None:
    """`helm template` with claimTLS.mode none == `kubectl kustomize manifests/`, object
    for object, but Helm's labels and the CRDs' keep annotation."""
    _assert_same_objects(manifests.install_base(kubectl), template(home, values=PLAIN))


def _generated_tls(objects: list[dict[str, Any]]) -> dict[str, Any]:
    """The chart's claim-port Secret (mode helm), taken out of ``objects``: a random
    CA each `helm template`, so checked for what it must be rather than compared."""
    secret = _find(objects, "Secret", "agentq-operator-claims-tls")
    objects.remove(secret)
    assert secret["type"] == "kubernetes.io/tls"
    assert secret["metadata"]["namespace"] == "agentq-system"
    return secret


def test_defaults_render_the_objects_of_the_cert_manager_example(home: Path, kubectl: str) -> None:
    """The defaults (claim port over TLS, certificate made by the chart) ==
    `kubectl kustomize examples/cert-manager/` but its cert-manager objects: the same
    operator mounting the same Secret, which the chart makes itself (the one allowed
    difference, checked by _generated_tls and test_the_generated_certificate_...)."""
    want = [
        o
        for o in manifests.kustomize(kubectl, manifests.CERT_MANAGER)
        if not o["apiVersion"].startswith("cert-manager.io/")
    ]
    got = template(home)
    _generated_tls(got)
    _assert_same_objects(want, got)


@pytest.mark.parametrize(
    ("values", "directory"),
    [
        (PLAIN, manifests.MANIFESTS / "agent"),
        ({}, manifests.CERT_MANAGER / "agent"),
    ],
    ids=["plain", "tls"],
)
def test_the_agent_pool_renders_the_objects_of_manifests_agent(
    home: Path, kubectl: str, values: dict[str, str], directory: Path
) -> None:
    """The default pool is manifests/agent/ in the release's namespace (with part-of
    agentq, as every object of the release); with TLS (the default) it is
    examples/cert-manager/agent/, and the chart adds the CA's ConfigMap there."""
    want = manifests.agent_objects(
        kubectl, worker="example", namespace="team-a", directory=directory
    )
    got = template(home, values={"agentPool.enabled": "true", **values}, namespace="team-a")
    pool = [o for o in got if o["metadata"].get("namespace") == "team-a"]
    for obj in pool:
        assert obj["metadata"]["labels"].pop("app.kubernetes.io/part-of") == "agentq"
    if values != PLAIN:
        bundle = _find(pool, "ConfigMap", "agentq-operator-ca")
        pool.remove(bundle)
        secret = _generated_tls(got)
        assert bundle["data"]["ca.crt"] == base64.b64decode(secret["data"]["ca.crt"]).decode()
    _assert_same_objects(want, pool)


def test_the_generated_certificate_serves_the_service_and_chains_to_its_ca(
    home: Path,
) -> None:
    """mode helm: a CA and a certificate it signed, for the Service's names, whose key
    is tls.key; the CA also in ConfigMap agentq-operator-ca of each caNamespaces."""
    objects = template(
        home,
        values={"namespace.name": "queues"},
        extra=["--set-json", 'operator.claimTLS.caNamespaces=["pool-a","pool-b"]'],
    )
    secret = _find(objects, "Secret", "agentq-operator-claims-tls")
    data = {k: base64.b64decode(v) for k, v in secret["data"].items()}
    ca = x509.load_pem_x509_certificate(data["ca.crt"])
    cert = x509.load_pem_x509_certificate(data["tls.crt"])
    cert.verify_directly_issued_by(ca)
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "agentq-operator-claims.queues.svc" in names.get_values_for_type(x509.DNSName)
    key = serialization.load_pem_private_key(data["tls.key"], password=None)
    assert key.public_key().public_numbers() == cert.public_key().public_numbers()  # type: ignore[union-attr]
    bundles = [o for o in objects if o["kind"] == "ConfigMap"]
    assert sorted(o["metadata"]["namespace"] for o in bundles) == ["pool-a", "pool-b"]
    assert {o["data"]["ca.crt"] for o in bundles} == {data["ca.crt"].decode()}


def test_claim_tls_modes(home: Path) -> None:
    """cert-manager: a Certificate from the issuer given (required), no Secret made;
    secret: the operator mounts yours; none: plain HTTP, nothing mounted."""
    managed = template(
        home,
        values={
            "operator.claimTLS.mode": "cert-manager",
            "operator.claimTLS.issuerRef.name": "corp-ca",
            "operator.claimTLS.issuerRef.kind": "ClusterIssuer",
        },
    )
    certificate = _find(managed, "Certificate", "agentq-operator-claims")
    assert certificate["spec"]["issuerRef"] == {"name": "corp-ca", "kind": "ClusterIssuer"}
    assert certificate["spec"]["secretName"] == "agentq-operator-claims-tls"
    assert not [o for o in managed if o["kind"] == "Secret"]
    with pytest.raises(AssertionError, match=r"needs operator\.claimTLS\.issuerRef\.name"):
        template(home, values={"operator.claimTLS.mode": "cert-manager"})
    own = template(
        home,
        values={"operator.claimTLS.mode": "secret", "operator.claimTLS.secretName": "mine"},
    )
    assert not [o for o in own if o["kind"] in ("Secret", "Certificate")]
    pod = _find(own, "Deployment")["spec"]["template"]["spec"]
    assert {
        "name": "claims-tls",
        "secret": {"secretName": "mine", "optional": True, "defaultMode": 0o440},
    } in pod["volumes"]
    assert _env(pod["containers"][0])["AGENTQ_CLAIM_CERT_FILE"].endswith("/tls.crt")
    plain = _find(template(home, values=PLAIN), "Deployment")["spec"]["template"]["spec"]
    assert "AGENTQ_CLAIM_CERT_FILE" not in _env(plain["containers"][0])


def test_the_autoscaled_pool_renders_manifests_examples_autoscaling(
    home: Path, kubectl: str
) -> None:
    """autoscaledPool with its defaults but plain HTTP to the claim port, in namespace
    agentq-pool, is manifests/examples/autoscaling/ but its Namespace (the release's, or
    made apart)."""
    want = [
        o
        for o in manifests.kustomize(kubectl, manifests.MANIFESTS / "examples" / "autoscaling")
        if o["kind"] != "Namespace"
    ]
    got = template(
        home, values={"autoscaledPool.enabled": "true", **PLAIN}, namespace="agentq-pool"
    )
    pool = [o for o in got if o["metadata"].get("namespace") == "agentq-pool"]
    for obj in pool:
        assert obj["metadata"]["labels"].pop("app.kubernetes.io/part-of") == "agentq"
    _assert_same_objects(want, pool)


def test_the_autoscaled_pool_reads_claims_over_tls_by_default(home: Path) -> None:
    """With TLS on (the default) a pool pod's sidecar reads cross-namespace claims as the
    agent pool's does: https to the Service, trusting only the chart's CA, whose
    ConfigMap the chart writes into the pool's namespace."""
    objects = template(
        home,
        namespace="agentq-system",
        values={"autoscaledPool.enabled": "true", "autoscaledPool.namespace": "pool-x"},
    )
    pod = _find(objects, "Deployment", "agent-pool-llm")["spec"]["template"]["spec"]
    env = _env(pod["initContainers"][0])
    assert env["AGENTQ_OPERATOR_URL"] == "https://agentq-operator-claims.agentq-system.svc:8444"
    assert env["AGENTQ_OPERATOR_CA_FILE"] == "/var/run/secrets/agentq.dev/operator/ca.crt"
    volume = next(v for v in pod["volumes"] if v["name"] == "agentq-operator-token")
    sources = [s["configMap"]["name"] for s in volume["projected"]["sources"] if "configMap" in s]
    assert sources == ["agentq-operator-ca"]
    bundles = [
        o
        for o in objects
        if o["kind"] == "ConfigMap" and o["metadata"]["name"] == "agentq-operator-ca"
    ]
    assert [b["metadata"]["namespace"] for b in bundles] == ["pool-x"]
    secret = _generated_tls(objects)
    assert bundles[0]["data"]["ca.crt"] == base64.b64decode(secret["data"]["ca.crt"]).decode()


def test_the_autoscaled_pool_follows_its_values(home: Path) -> None:
    objects = template(
        home,
        namespace="agents",
        values={
            "autoscaledPool.enabled": "true",
            "autoscaledPool.name": "coder",
            "autoscaledPool.maxInFlight": "4",
            "autoscaledPool.keda.maxReplicaCount": "10",
        },
        extra=["--set-json", 'autoscaledPool.capabilities=["python","llm"]'],
    )
    scaled = _find(objects, "ScaledObject", "agent-pool-coder")
    assert scaled["spec"]["scaleTargetRef"]["name"] == "agent-pool-coder"
    assert scaled["spec"]["maxReplicaCount"] == 10
    trigger = scaled["spec"]["triggers"][0]["metadata"]
    assert trigger["threshold"] == "4"
    assert 'namespace="agents",capabilities=~"llm,python|-"' in trigger["query"]
    pod = _find(objects, "Deployment", "agent-pool-coder")["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "agentq-pool-coder"
    env = _env(pod["initContainers"][0])
    assert env["AGENTQ_CAPABILITIES"] == "python,llm" and env["AGENTQ_MAX_IN_FLIGHT"] == "4"
    sidecar_env = {e["name"]: e for e in pod["initContainers"][0]["env"]}
    assert sidecar_env["AGENTQ_WORKER"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert _find(objects, "Deployment", "agent-pool-coder")["spec"]["replicas"] == 0
    # Off by default: nothing of it rendered.
    assert not [o for o in template(home) if o["kind"] == "ScaledObject"]


def test_the_charts_crds_are_the_repositorys(home: Path) -> None:
    for crd in sorted((ROOT / "crds").glob("*.yaml")):
        copy = CHART / "files" / "crds" / crd.name
        assert copy.is_file() and copy.read_bytes() == crd.read_bytes(), (
            f"{copy.relative_to(ROOT)} differs from {crd.relative_to(ROOT)}: "
            "cp crds/*.yaml charts/agentq/files/crds/"
        )
    assert {p.name for p in (CHART / "files" / "crds").glob("*")} == {
        p.name for p in (ROOT / "crds").glob("*.yaml")
    }


def test_every_template_names_the_manifest_it_follows() -> None:
    """A change to manifests/ must reach the chart: each template of a manifest says so."""
    for name in ("admission-policy", "operator-policy", "leader-epoch-policy", "operator"):
        text = (CHART / "templates" / f"{name}.yaml").read_text()
        assert f"manifests/{name}.yaml" in text


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"operator.replicas": "0"}, "at '/operator/replicas': minimum: got 0, want 1"),
        ({"operator.replicass": "3"}, "at '/operator': additional properties 'replicass'"),
        ({"image.digest": "sha256:abc"}, "at '/image/digest': 'sha256:abc' does not match"),
        ({"image.tag": "", "image.digest": ""}, "at '/image'"),
        ({"namespace.name": "Agentq_System"}, "at '/namespace/name'"),
        ({"operator.metricsPort": "70000"}, "at '/operator/metricsPort': maximum"),
        ({"agentPool.workers[0].name": "w"}, "at '/agentPool/workers/0': missing property"),
        ({"agentPool.workers[0].name": "Bad_Name"}, "at '/agentPool/workers/0/name'"),
        ({"agentPool.workerDefaults.weight": "0"}, "at '/agentPool/workerDefaults/weight'"),
        (
            {"podDisruptionBudget.maxUnavailable": "half"},
            "at '/podDisruptionBudget/maxUnavailable'",
        ),
        ({"crds.keep": "maybe"}, "at '/crds/keep': got string, want boolean"),
    ],
)
def test_bad_values_are_refused_with_the_path(
    home: Path, values: dict[str, str], message: str
) -> None:
    done = helm(home, "template", "agentq", str(CHART), *helmchart.set_args(values), check=False)
    assert done.returncode != 0, f"{values} was accepted"
    assert "values don't meet the specifications of the schema" in done.stderr, done.stderr
    assert message in done.stderr, done.stderr


def test_two_replicas_without_leader_election_are_refused(home: Path) -> None:
    values = {"operator.leaderElection.enabled": "false"}
    done = helm(home, "template", "agentq", str(CHART), *helmchart.set_args(values), check=False)
    assert done.returncode != 0
    assert "operator.replicas must be 1 when operator.leaderElection.enabled is false" in (
        done.stderr
    ), done.stderr


def test_one_replica_without_leader_election_is_accepted(home: Path) -> None:
    objects = template(
        home, values={"operator.leaderElection.enabled": "false", "operator.replicas": "1"}
    )
    deployment = _find(objects, "Deployment", "agentq-operator")
    assert deployment["spec"]["replicas"] == 1
    env = _env(deployment["spec"]["template"]["spec"]["containers"][0])
    assert env["AGENTQ_LEADER_ELECTION"] == "false"


def test_operator_values(home: Path) -> None:
    objects = template(
        home,
        values={
            "namespace.name": "queues",
            "image.repository": "registry.example/agentq",
            "image.digest": "sha256:" + "a" * 64,
            "operator.replicas": "3",
            "operator.leaderElection.leaseSeconds": "30",
            "operator.leaderElection.renewSeconds": "20",
            # (--set takes 1.5 for a string: a decimal comes from a file or --set-json.)
            "operator.maxReclaims": "5",
            "operator.metricsPort": "9090",
            "operator.claimPort": "9444",
            "operator.resources.limits.memory": "1Gi",
            "operator.extraEnv[0].name": "AGENTQ_WATCHER",
            "operator.extraEnv[0].value": "kopf",
            "imagePullSecrets[0]": "regcred",
        },
    )
    deployment = _find(objects, "Deployment", "agentq-operator")
    assert deployment["metadata"]["namespace"] == "queues"
    retry = template(home, extra=["--set-json", "operator.leaderElection.retrySeconds=1.5"])
    retry_env = _env(_find(retry, "Deployment")["spec"]["template"]["spec"]["containers"][0])
    assert retry_env["AGENTQ_LEADER_RETRY_SECONDS"] == "1.5"
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert deployment["spec"]["replicas"] == 3
    assert container["image"] == "registry.example/agentq@sha256:" + "a" * 64
    assert container["ports"] == [
        {"name": "metrics", "containerPort": 9090},
        {"name": "claims", "containerPort": 9444},
    ]
    claims = _find(objects, "Service", "agentq-operator-claims")
    assert claims["metadata"]["namespace"] == "queues"
    assert claims["spec"]["ports"][0]["port"] == 9444
    assert container["resources"]["limits"]["memory"] == "1Gi"
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    assert _env(container) == {
        "AGENTQ_LEADER_NAMESPACE": "queues",
        "AGENTQ_MAX_RECLAIMS": "5",
        "AGENTQ_RECONCILE_INTERVAL": "2",
        "AGENTQ_METRICS_PORT": "9090",
        "AGENTQ_CLAIM_PORT": "9444",
        "AGENTQ_LEADER_LEASE_SECONDS": "30",
        "AGENTQ_LEADER_RENEW_SECONDS": "20",
        "AGENTQ_WATCHER": "kopf",
        "AGENTQ_CLAIM_CERT_FILE": "/var/run/secrets/agentq.dev/claims-tls/tls.crt",
        "AGENTQ_CLAIM_KEY_FILE": "/var/run/secrets/agentq.dev/claims-tls/tls.key",
    }
    # Everything of the operator's follows it into its namespace, the election Lease's
    # fence too.
    for kind in ("ServiceAccount", "NetworkPolicy", "PodDisruptionBudget", "Namespace"):
        obj = _find(objects, kind)
        assert obj["metadata"].get("namespace", obj["metadata"]["name"]) == "queues"
    binding = _find(objects, "ClusterRoleBinding", "agentq-operator")
    assert binding["subjects"][0]["namespace"] == "queues"
    fence = _find(objects, "ValidatingAdmissionPolicyBinding", "agentq-leader-epoch")
    assert fence["spec"]["paramRef"]["namespace"] == "queues"


def test_toggles_leave_their_objects_out(home: Path) -> None:
    kinds = {o["kind"] for o in template(home)}
    assert {"Namespace", "CustomResourceDefinition", "NetworkPolicy"} <= kinds
    assert {"PodDisruptionBudget", "PriorityClass", "ValidatingAdmissionPolicy"} <= kinds
    objects = template(
        home,
        values={
            "namespace.create": "false",
            "crds.install": "false",
            "networkPolicy.enabled": "false",
            "podDisruptionBudget.enabled": "false",
            "priorityClass.create": "false",
            "admissionPolicies.enabled": "false",
        },
    )
    assert {o["kind"] for o in objects} == {
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Deployment",
        "Service",
        "Secret",
    }
    # An existing PriorityClass is still named; none with an empty name.
    pod = _find(objects, "Deployment")["spec"]["template"]["spec"]
    assert pod["priorityClassName"] == "agentq-operator"
    none = template(home, values={"priorityClass.create": "false", "priorityClass.name": ""})
    assert "priorityClassName" not in _find(none, "Deployment")["spec"]["template"]["spec"]


def test_crd_policy_keep_is_the_default(home: Path) -> None:
    for crd in (o for o in template(home) if o["kind"] == "CustomResourceDefinition"):
        assert crd["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}
        assert crd["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"
    for crd in (
        o
        for o in template(home, values={"crds.keep": "false"})
        if o["kind"] == "CustomResourceDefinition"
    ):
        assert "annotations" not in crd["metadata"]


def test_agent_pool_workers_and_replicas(home: Path) -> None:
    workers = [
        {
            "name": "coder",
            "replicas": 3,
            "capabilities": ["llm", "python"],
            "maxInFlight": 4,
            "args": ["my-agent"],
            "image": "registry.example/coder:1",
        },
        {"name": "reviewer", "capabilities": ["llm"]},
    ]
    objects = template(
        home,
        namespace="agents",
        values={"agentPool.enabled": "true", "agentPool.namespace": "pool"},
        extra=["--set-json", f"agentPool.workers={json.dumps(workers)}"],
    )
    pool = [o for o in objects if o["metadata"].get("namespace") == "pool"]
    deployments = sorted(o["metadata"]["name"] for o in pool if o["kind"] == "Deployment")
    assert deployments == ["agent-coder-0", "agent-coder-1", "agent-coder-2", "agent-reviewer"]
    accounts = sorted(o["metadata"]["name"] for o in pool if o["kind"] == "ServiceAccount")
    assert accounts == [*(f"agentq-agent-coder-{i}" for i in range(3)), "agentq-agent-reviewer"]
    pod = _find(pool, "Deployment", "agent-coder-1")["spec"]["template"]["spec"]
    sidecar, agent = pod["initContainers"][0], pod["containers"][0]
    assert pod["serviceAccountName"] == "agentq-agent-coder-1"
    env = _env(sidecar)
    assert (env["AGENTQ_WORKER"], env["AGENTQ_CAPABILITIES"]) == ("coder-1", "llm,python")
    assert env["AGENTQ_MAX_IN_FLIGHT"] == "4"
    assert agent["args"] == ["my-agent"]
    assert agent["image"] == "registry.example/coder:1"
    assert sidecar["image"] == "agentq:dev"
    # What an entry leaves out comes from workerDefaults.
    assert env["AGENTQ_WEIGHT"] == "1"
    reviewer = _find(pool, "Deployment", "agent-reviewer")["spec"]["template"]["spec"]
    assert _env(reviewer["initContainers"][0])["AGENTQ_MAX_IN_FLIGHT"] == "2"
    assert reviewer["containers"][0]["args"][0] == "agent-sim"
    assert reviewer["containers"][0]["image"] == "agentq:dev"

    # The sidecar's image apart (an operator upgrade that leaves the agents running).
    pinned = template(
        home,
        values={"agentPool.enabled": "true", "image.tag": "0.2.0",
                "agentPool.sidecar.image": "agentq:0.1.0"},
    )  # fmt: skip
    pod = _find(pinned, "Deployment", "agent-example")["spec"]["template"]["spec"]
    assert pod["initContainers"][0]["image"] == "agentq:0.1.0"
    assert pod["containers"][0]["image"] == "agentq:0.2.0"
    operator = _find(pinned, "Deployment", "agentq-operator")["spec"]["template"]["spec"]
    assert operator["containers"][0]["image"] == "agentq:0.2.0"


def _unreadable_secrets(objects: list[dict[str, Any]]) -> list[str]:
    """The Secret files a workload's non-root containers mount but cannot read: the
    kubelet writes them owned by root, group root unless the pod has an fsGroup (then
    the group is that, and the containers are in it), with the volume's mode."""
    problems = []
    for obj in objects:
        if obj["kind"] not in manifests.WORKLOADS:
            continue
        pod = obj["spec"]["template"]["spec"] if "template" in obj["spec"] else obj["spec"]
        pod_context = pod.get("securityContext") or {}
        secrets = {v["name"]: v["secret"] for v in pod.get("volumes", []) if "secret" in v}
        for container in manifests.containers(obj):
            context = {**pod_context, **(container.get("securityContext") or {})}
            if context.get("runAsUser", 0) == 0:
                continue
            for mount in container.get("volumeMounts", []):
                secret = secrets.get(mount["name"])
                if secret is None:
                    continue
                modes = [i.get("mode") for i in secret.get("items", [])]
                default = secret.get("defaultMode", 0o644)
                for mode in [m if m is not None else default for m in modes] or [default]:
                    if not (mode & 0o004 or (mode & 0o040 and "fsGroup" in pod_context)):
                        problems.append(
                            f"{obj['kind']} {obj['metadata']['name']}: {container['name']} "
                            f"(uid {context['runAsUser']}) cannot read Secret "
                            f"{secret['secretName']} (mode {mode:o}, "
                            f"fsGroup {pod_context.get('fsGroup')})"
                        )
    return problems


def test_the_operator_can_read_its_claim_certificate(
    home: Path, kubectl: str, tmp_path: Path
) -> None:
    """The claim port's Secret is mounted 0440 (the key is no one else's): readable by
    the operator (uid 65532) only through the pod's fsGroup -- without it, on a real
    kubelet the files are root's and the claim port never serves (found on real pods,
    e2e/test_tenancy.py). Kustomize with the component (by hand or cert-manager's
    example) and the chart, every mode."""
    by_hand = manifests.overlay(
        tmp_path / "by-hand", manifests.MANIFESTS, manifests.MANIFESTS / "claim-tls"
    )
    for directory in (by_hand, manifests.CERT_MANAGER):
        assert not _unreadable_secrets(manifests.kustomize(kubectl, directory)), directory
    for mode in ("helm", "secret"):
        objects = template(home, values={"operator.claimTLS.mode": mode})
        assert not _unreadable_secrets(objects), mode
