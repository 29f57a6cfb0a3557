"""The operator's claim API against the real API server (docs/tenancy.md,
"Cross-namespace claims"): the TokenReview path for real.

Worker w1 of namespace ``pool`` holds a claim of task ``job`` of the team's namespace.
The claim API runs here, with the operator's own ServiceAccount (manifests/: it may
``create tokenreviews``) and a fake lookup of the store; the sidecar's own client
(``OperatorClaims``) asks it with TokenRequest tokens: w1's of audience
``agentq.dev/operator`` gets the task; w1's of the API server's audience, worker w2's,
and a w1 of another namespace are refused (403); the task deleted, the claim is over (410).
"""

from __future__ import annotations

import asyncio
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from kubernetes import client
from prometheus_client import REGISTRY

from accounts import create_account, kubeconfig_for_token, token
from agentq import GROUP, VERSION, kube, protocol
from agentq.controlplane.cluster import free_port
from agentq.operator.claim_api import AUDIENCE, ClaimRef, ClaimServer
from agentq.sidecar.operator_claims import ClaimError, OperatorClaims
from builders import queue, task, worker
from certs import SERVICE_NAME, Ca
from fleet import ControlPlane, Fleet
from manifests import agent_objects, to_yaml


@pytest.fixture
def pool(core_api: client.CoreV1Api) -> Iterator[str]:
    """The workers' namespace, apart from the team's (the fleet's)."""
    name = f"pool-{uuid.uuid4().hex[:8]}"
    core_api.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    try:
        yield name
    finally:
        core_api.delete_namespace(name)


def counted(code: int) -> float:
    value = REGISTRY.get_sample_value("agentq_claim_api_requests_total", {"code": str(code)})
    return value or 0.0


def test_only_the_holders_own_token_of_the_operators_audience_gets_the_task(
    control_plane: ControlPlane,
    agentq_installed: None,
    fleet: Fleet,
    pool: str,
    core_api: client.CoreV1Api,
    tmp_path: Path,
) -> None:
    team = fleet.namespace
    for namespace, account in [
        (pool, "agentq-agent-w1"),
        (pool, "agentq-agent-w2"),
        (team, "agentq-agent-w1"),
    ]:
        create_account(core_api, namespace, account)
    tokens = {
        "w1": token(core_api, pool, "agentq-agent-w1", audiences=[AUDIENCE]),
        "w1-api-audience": token(core_api, pool, "agentq-agent-w1"),
        "w2": token(core_api, pool, "agentq-agent-w2", audiences=[AUDIENCE]),
        "w1-of-team": token(core_api, team, "agentq-agent-w1", audiences=[AUDIENCE]),
    }
    files = {}
    for name, value in tokens.items():
        files[name] = tmp_path / f"{name}.token"
        files[name].write_text(value)

    created = fleet.add_task(task("job").payload({"prompt": "summarise", "n": 3}))
    uid = created["metadata"]["uid"]
    fleet.custom.patch_namespaced_custom_object_status(
        GROUP,
        VERSION,
        team,
        "agenttasks",
        "job",
        {"status": {"phase": "Assigned", "worker": "w1", "fencingToken": 7, "attempt": 1}},
    )
    lease = protocol.cross_task_lease_name(team, "job")
    ref = ClaimRef(task_namespace=team, task_name="job", task_uid=uid, worker="w1", token=7)

    def lookup(lease_namespace: str, lease_name: str) -> ClaimRef | None:
        return ref if (lease_namespace, lease_name) == (pool, lease) else None

    # The operator's own account, with exactly the RBAC manifests/ gives it.
    operator_kubeconfig = kubeconfig_for_token(
        control_plane.kubeconfig,
        token(core_api, "agentq-system", "agentq-operator"),
        tmp_path / "operator.kubeconfig",
    )
    before = {code: counted(code) for code in (200, 401, 403, 410)}

    async def scenario() -> dict[str, Any]:
        port = free_port()
        server = await ClaimServer.start(
            kube.from_kubeconfig(operator_kubeconfig), lookup, port=port, host="127.0.0.1"
        )
        url = f"http://127.0.0.1:{port}"
        seen: dict[str, Any] = {}
        try:
            for name, path in files.items():
                sidecar = OperatorClaims(url, str(path))
                try:
                    seen[name] = await sidecar.read(pool, lease)
                except ClaimError as err:
                    seen[name] = (err.status, err.message)
                finally:
                    await sidecar.close()
            # w1's token asking for a Lease of the team's namespace: not its namespace.
            sidecar = OperatorClaims(url, str(files["w1"]))
            try:
                await sidecar.read(team, lease)
            except ClaimError as err:
                seen["w1-elsewhere"] = (err.status, err.message)
            async with (
                aiohttp.ClientSession() as session,
                session.get(f"{url}/v1/claims/{pool}/{lease}") as rsp,
            ):
                seen["no-token"] = (rsp.status, await rsp.json())
            seen["reviews"] = server.api.token_reviews
            # The task deleted: the claim is over.
            fleet.custom.delete_namespaced_custom_object(GROUP, VERSION, team, "agenttasks", "job")
            try:
                await sidecar.read(pool, lease)
            except ClaimError as err:
                seen["deleted"] = (err.status, err.message)
            finally:
                await sidecar.close()
        finally:
            await server.close()
        return seen

    seen = asyncio.run(scenario())
    assert seen["w1"] == {
        "metadata": {"name": "job", "namespace": team, "uid": uid},
        "spec": seen["w1"]["spec"],
        "status": {"attempt": 1},
    }
    assert seen["w1"]["spec"]["payload"] == {"prompt": "summarise", "n": 3}
    assert seen["w1-api-audience"][0] == 403, seen["w1-api-audience"]
    assert AUDIENCE in seen["w1-api-audience"][1]
    assert seen["w2"][0] == 403 and "not yours" in seen["w2"][1], seen["w2"]
    assert seen["w1-of-team"][0] == 403, seen["w1-of-team"]
    assert seen["w1-elsewhere"][0] == 403, seen["w1-elsewhere"]
    assert seen["no-token"][0] == 401
    assert seen["deleted"][0] == 410, seen["deleted"]
    # One TokenReview per token: w1's answered from the cache the second time.
    assert seen["reviews"] == 4
    assert counted(200) == before[200] + 1
    assert counted(403) == before[403] + 4
    assert counted(401) == before[401] + 1
    assert counted(410) == before[410] + 1


def test_the_operator_serves_the_claim_api_on_its_claim_port(
    agentq_crds: None, fleet: Fleet, core_api: client.CoreV1Api
) -> None:
    """``agentq operator --claim-port``: the API answers from the operator's process
    (a claim it does not know is 404 to its rightful worker, 403 to another audience's
    token, 401 without one) and stops with it."""
    create_account(core_api, fleet.namespace, "agentq-agent-w1")
    good = token(core_api, fleet.namespace, "agentq-agent-w1", audiences=[AUDIENCE])
    other = token(core_api, fleet.namespace, "agentq-agent-w1")
    port = free_port()
    operator = fleet.operator("--claim-port", str(port))
    url = f"http://127.0.0.1:{port}/v1/claims/{fleet.namespace}/agentq-xtask-team.job"

    def ask(bearer: str | None) -> int:
        request = urllib.request.Request(
            url, headers={"Authorization": f"Bearer {bearer}"} if bearer else {}
        )
        try:
            with urllib.request.urlopen(request, timeout=10) as rsp:
                return int(rsp.status)
        except urllib.error.HTTPError as err:
            return int(err.code)

    deadline = time.monotonic() + 30
    while True:
        try:
            first = ask(None)
            break
        except urllib.error.URLError:
            assert time.monotonic() < deadline, operator.text()[-3000:]
            time.sleep(0.2)
    assert first == 401
    assert ask(other) == 403
    assert ask(good) == 404


def test_a_real_sidecar_reads_its_claim_over_tls_and_one_trusting_another_ca_is_refused(
    control_plane: ControlPlane,
    agentq_installed: None,
    fleet: Fleet,
    pool: str,
    core_api: client.CoreV1Api,
    tmp_path: Path,
) -> None:
    """``agentq operator --claim-cert-file/--claim-key-file`` and real sidecars with
    ``--operator-ca-file``: the operator's certificate names the Service (not the
    address dialled: ``--operator-server-name`` is checked), signed by the CA of w1's
    bundle. The workers live in the fleet's namespace, the team's tasks in another
    (``pool`` here is the team's). The task for w1 succeeds with its payload read over
    TLS; the one for w2, whose bundle is another CA's, stays Assigned: w2's sidecar
    refuses the handshake (an error log), and the operator runs on. Plain HTTP to the
    TLS port gets no answer."""
    workers, team = fleet.namespace, pool
    ca, other = Ca.make(), Ca.make("not-the-operators-ca")
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    ca.write_serving(cert, key, (SERVICE_NAME,))
    bundles = {"w1": ca.write(tmp_path / "ca.crt"), "w2": other.write(tmp_path / "other.crt")}
    selector = {"matchLabels": {"kubernetes.io/metadata.name": team}}
    body = queue("q-tls").set("spec.namespaceSelector", selector).workers_in(workers).obj()
    fleet.custom.create_cluster_custom_object(GROUP, VERSION, "agentqueues", body)
    port = free_port()
    try:
        for name, capability in (("w1", "llm"), ("w2", "gpu")):
            objects = agent_objects(control_plane.kubectl_path, worker=name, namespace=workers)
            accounts = [o for o in objects if o["kind"] in ("ServiceAccount", "RoleBinding")]
            control_plane.kubectl("apply", "-f", "-", input=to_yaml(accounts))
            account = f"agentq-agent-{name}"
            kubeconfig = kubeconfig_for_token(
                control_plane.kubeconfig,
                token(core_api, workers, account),
                tmp_path / f"{name}.kubeconfig",
            )
            claim_token = tmp_path / f"{name}.claims.token"
            claim_token.write_text(token(core_api, workers, account, audiences=[AUDIENCE]))
            fleet.add_worker(worker(name).capabilities(capability).max_in_flight(1))
            fleet.agent(
                name,
                "complete",
                work_seconds=0.2,
                kubeconfig=str(kubeconfig),
                operator_url=f"https://127.0.0.1:{port}",
                operator_token_file=str(claim_token),
                operator_ca_file=str(bundles[name]),
                operator_server_name=SERVICE_NAME,
            )
        operator = fleet.operator(
            *("--namespace", team, "--claim-port", str(port)),
            *("--claim-cert-file", str(cert), "--claim-key-file", str(key)),
        )
        for name, capability in (("good", "llm"), ("refused", "gpu")):
            body = task(name).requires(capability).queue("q-tls").namespace(team)
            fleet.custom.create_namespaced_custom_object(
                GROUP, VERSION, team, "agenttasks", body.payload({"secret": name}).obj()
            )

        def status(name: str) -> dict[str, Any]:
            got = fleet.custom.get_namespaced_custom_object(
                GROUP, VERSION, team, "agenttasks", name
            )
            return dict(got.get("status") or {})

        deadline = time.monotonic() + 90
        while status("good").get("phase") != "Succeeded":
            assert time.monotonic() < deadline, fleet.logs()
            time.sleep(0.3)
        good = status("good")
        assert (good["worker"], good["workerNamespace"]) == ("w1", workers), good
        assert good["result"] == {"by": "w1"}
        # w2 holds its claim, but its sidecar will not talk to an operator it cannot verify.
        w2 = fleet.pairs[1].sidecar
        while "CERTIFICATE_VERIFY_FAILED" not in w2.text():
            assert time.monotonic() < deadline, w2.text()[-3000:]
            time.sleep(0.3)
        assert status("refused").get("phase") == "Assigned", status("refused")
        refusal = next(e for e in w2.events() if "CERTIFICATE_VERIFY_FAILED" in str(e))
        assert refusal["level"] == "ERROR", refusal
        assert operator.popen.poll() is None, operator.text()[-3000:]
        assert "serving TLS certificate" in operator.text()
        # The port speaks TLS only: a plain HTTP request gets no answer.
        with pytest.raises((urllib.error.URLError, ConnectionError)):
            urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/claims/{workers}/x", timeout=5)
    finally:
        fleet.custom.delete_cluster_custom_object(GROUP, VERSION, "agentqueues", "q-tls")
