"""Claims across namespaces on the real API server (docs/tenancy.md, "Cross-namespace
claims"): two teams' namespaces, one pool of workers in a third (the fleet's), real
sidecars that authenticate as their workers' own ServiceAccounts (TokenRequest tokens,
the RBAC and admission policy of manifests/) and agent-sim. A team task is granted to
a pool worker: its Lease ``agentq-xtask-<namespace>.<task>`` lives in the pool, and
the sidecar reads the task through the operator's claim API (it may not read the
team's AgentTasks)."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from accounts import bound_pod, create_account, kubeconfig_for_token, token
from agentq import GROUP, VERSION, protocol
from agentq.controlplane.cluster import free_port
from agentq.operator.claim_api import AUDIENCE
from agentq.sidecar.operator_claims import ClaimError, OperatorClaims
from builders import queue, task, worker
from fleet import ControlPlane, Fleet
from manifests import agent_objects, to_yaml


@pytest.fixture
def teams(core_api: client.CoreV1Api, fleet: Fleet) -> Iterator[tuple[str, str]]:
    """Two team namespaces and a queue each (selecting it by name) drawing on the pool
    (the fleet's namespace); all deleted afterwards."""
    suffix = uuid.uuid4().hex[:8]
    names = (f"team-a-{suffix}", f"team-b-{suffix}")
    for name in names:
        core_api.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
        body = (
            queue(f"q-{name}")
            .set("spec.namespaceSelector", {"matchLabels": {"kubernetes.io/metadata.name": name}})
            .workers_in(fleet.namespace)
            .obj()
        )
        fleet.custom.create_cluster_custom_object(GROUP, VERSION, "agentqueues", body)
    try:
        yield names
    finally:
        for name in names:
            fleet.custom.delete_cluster_custom_object(GROUP, VERSION, "agentqueues", f"q-{name}")
            core_api.delete_namespace(name)


class Pool:
    """The pool's workers, each with its account (manifests/agent/: ServiceAccount and
    RoleBinding), an API kubeconfig of its own and a token for the operator's claim API."""

    def __init__(self, control_plane: ControlPlane, fleet: Fleet, tmp_path: Path) -> None:
        self.control_plane = control_plane
        self.fleet = fleet
        self.tmp_path = tmp_path
        self.core = client.CoreV1Api(control_plane.api_client())
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.kubeconfigs: dict[str, Path] = {}
        self.claim_tokens: dict[str, Path] = {}

    def worker(self, name: str, slots: int) -> None:
        ns = self.fleet.namespace
        objects = agent_objects(self.control_plane.kubectl_path, worker=name, namespace=ns)
        accounts = [o for o in objects if o["kind"] in ("ServiceAccount", "RoleBinding")]
        self.control_plane.kubectl("apply", "-f", "-", input=to_yaml(accounts))
        account = f"agentq-agent-{name}"
        self.kubeconfigs[name] = kubeconfig_for_token(
            self.control_plane.kubeconfig,
            token(self.core, ns, account),
            self.tmp_path / f"{name}.kubeconfig",
        )
        self.claim_tokens[name] = self.tmp_path / f"{name}.claims.token"
        self.claim_tokens[name].write_text(token(self.core, ns, account, audiences=[AUDIENCE]))
        self.fleet.add_worker(worker(name).capabilities("llm").max_in_flight(slots))

    def agent(self, name: str, behaviour: str, **options: Any) -> Any:
        return self.fleet.agent(
            name,
            behaviour,
            kubeconfig=str(self.kubeconfigs[name]),
            operator_url=self.url,
            operator_token_file=str(self.claim_tokens[name]),
            **options,
        )

    def operator(self, teams: tuple[str, str]) -> Any:
        # Watching the pool and both teams (an operator confined to namespaces serves
        # a queue only if it watches its workerNamespace).
        flags = [f for team in teams for f in ("--namespace", team)]
        return self.fleet.operator(*flags, "--claim-port", str(self.port))


def team_task(fleet: Fleet, namespace: str, name: str, **spec: Any) -> dict[str, Any]:
    body = task(name).requires("llm").queue(f"q-{namespace}").namespace(namespace).obj()
    body["spec"].update(spec)
    created: dict[str, Any] = fleet.custom.create_namespaced_custom_object(
        GROUP, VERSION, namespace, "agenttasks", body
    )
    return created


def read(fleet: Fleet, namespace: str, name: str) -> dict[str, Any]:
    got: dict[str, Any] = fleet.custom.get_namespaced_custom_object(
        GROUP, VERSION, namespace, "agenttasks", name
    )
    return got


def until(what: str, check: Callable[[], Any], fleet: Fleet, timeout: float = 90) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not in {timeout}s\n{fleet.logs()}")
        time.sleep(0.2)


def xleases(fleet: Fleet) -> list[str]:
    listed = fleet.leases.list_namespaced_lease(fleet.namespace)
    return sorted(
        lease.metadata.name
        for lease in listed.items
        if lease.metadata.name.startswith(protocol.XTASK_LEASE_PREFIX)
    )


def test_tasks_of_two_teams_succeed_on_the_pools_workers(
    control_plane: ControlPlane,
    agentq_installed: None,
    fleet: Fleet,
    teams: tuple[str, str],
    tmp_path: Path,
) -> None:
    pool = Pool(control_plane, fleet, tmp_path)
    for name in ("w1", "w2"):
        pool.worker(name, slots=2)
        pool.agent(name, "complete", work_seconds=0.2)
    pool.operator(teams)
    names = [(team, f"job-{i}") for team in teams for i in range(4)]
    for team, name in names:
        team_task(fleet, team, name, payload={"team": team, "n": name})

    def done() -> list[dict[str, Any]] | None:
        bodies = [read(fleet, team, name) for team, name in names]
        ok = all((b.get("status") or {}).get("phase") == "Succeeded" for b in bodies)
        return bodies if ok else None

    bodies = until("every team task Succeeded", done, fleet, timeout=120)
    for body in bodies:
        status = body["status"]
        assert status["workerNamespace"] == fleet.namespace, status
        assert status["worker"] in ("w1", "w2"), status
        team = body["metadata"]["namespace"]
        assert status["leaseName"] == protocol.cross_task_lease_name(team, body["metadata"]["name"])
        assert status["result"] == {"by": status["worker"]}, status
    # Both workers served; every claim's Lease (in the pool) deleted by the operator.
    assert {b["status"]["worker"] for b in bodies} == {"w1", "w2"}
    until("the pool's claim Leases deleted", lambda: not xleases(fleet), fleet, timeout=30)
    # Nothing of the claims in the teams' namespaces.
    for team in teams:
        assert not fleet.leases.list_namespaced_lease(team).items


def test_a_foreign_claim_is_its_holders_alone_reclaimed_when_its_agent_dies_and_deleted_with_its_task(  # noqa: E501
    control_plane: ControlPlane,
    agentq_installed: None,
    fleet: Fleet,
    teams: tuple[str, str],
    tmp_path: Path,
) -> None:
    team_a, team_b = teams
    pool = Pool(control_plane, fleet, tmp_path)
    pool.worker("w1", slots=2)
    pool.worker("w2", slots=2)
    holder = pool.agent("w1", "hold", beat_seconds=1)
    pool.operator(teams)
    team_task(fleet, team_a, "slow", leaseDurationSeconds=6, payload={"secret": "a"})
    team_task(fleet, team_b, "gone", leaseDurationSeconds=30)
    for team, name in [(team_a, "slow"), (team_b, "gone")]:
        until(
            f"{team}/{name} Running on w1",
            lambda team=team, name=name: (
                (read(fleet, team, name).get("status") or {}).get("phase") == "Running"
            ),
            fleet,
        )
    slow = read(fleet, team_a, "slow")["status"]
    assert (slow["worker"], slow["workerNamespace"]) == ("w1", fleet.namespace)
    lease = protocol.cross_task_lease_name(team_a, "slow")
    got = fleet.leases.read_namespaced_lease(lease, fleet.namespace)
    assert got.metadata.labels[protocol.LABEL_TASK_NAMESPACE] == team_a
    assert not got.metadata.owner_references

    # Another worker's sidecar asking the operator for w1's claim: refused (403); w1's
    # own gets the task.
    async def ask(name: str) -> Any:
        claims = OperatorClaims(pool.url, str(pool.claim_tokens[name]))
        try:
            return await claims.read(fleet.namespace, lease)
        except ClaimError as err:
            return (err.status, err.message)
        finally:
            await claims.close()

    refused = asyncio.run(ask("w2"))
    assert refused[0] == 403 and "not yours" in refused[1], refused
    mine = asyncio.run(ask("w1"))
    assert mine["spec"]["payload"] == {"secret": "a"}, mine
    # The agent cannot read the team's AgentTask itself (its RBAC is its namespace's).
    agent_api = client.CustomObjectsApi(client.ApiClient(_config_for(pool.kubeconfigs["w1"])))
    with pytest.raises(client.ApiException) as err:
        agent_api.get_namespaced_custom_object(GROUP, VERSION, team_a, "agenttasks", "slow")
    assert err.value.status == 403

    # The team deletes its task: the operator deletes the claim's Lease in the pool.
    gone = protocol.cross_task_lease_name(team_b, "gone")
    assert gone in xleases(fleet)
    fleet.custom.delete_namespaced_custom_object(GROUP, VERSION, team_b, "agenttasks", "gone")
    until("the deleted task's Lease deleted", lambda: gone not in xleases(fleet), fleet, 30)

    # w1's pod dies (SIGKILL, sidecar and agent): its claim expires and is reclaimed,
    # then w2 runs the task to the end.
    holder.kill()
    pool.agent("w2", "complete", work_seconds=0.2)
    final = until(
        "the reclaimed task Succeeded",
        lambda: (
            (s := read(fleet, team_a, "slow").get("status") or {}).get("phase") == "Succeeded" and s
        ),
        fleet,
        timeout=90,
    )
    assert final["reclaims"] == 1, final
    assert (final["worker"], final["workerNamespace"]) == ("w2", fleet.namespace), final
    assert final["fencingToken"] > slow["fencingToken"]
    until("no claim Lease left", lambda: not xleases(fleet), fleet, timeout=30)


def _config_for(kubeconfig: Path) -> client.Configuration:
    from kubernetes import config

    configuration = client.Configuration()
    config.load_kube_config(config_file=str(kubeconfig), client_configuration=configuration)
    return configuration


def test_a_pool_pod_takes_foreign_claims_of_the_worker_it_registered_alone(
    control_plane: ControlPlane,
    agentq_installed: None,
    fleet: Fleet,
    teams: tuple[str, str],
    tmp_path: Path,
) -> None:
    """An autoscaled pool (docs/autoscaling.md): every pod runs under one account,
    agentq-pool-<pool>, and is the worker named after itself, registered by its sidecar
    and owned by the pod. The pod's sidecar, on tokens bound to the pod (TokenRequest),
    reads its worker's claims of both teams' tasks through the claim API and runs
    them; another pod of the pool, and a pool token bound to no pod, are refused."""
    ns = fleet.namespace
    core = client.CoreV1Api(control_plane.api_client())
    account = "agentq-pool-p"
    create_account(core, ns, account)
    client.RbacAuthorizationV1Api(control_plane.api_client()).create_namespaced_role_binding(
        ns,
        client.V1RoleBinding(
            metadata=client.V1ObjectMeta(name=account),
            role_ref=client.V1RoleRef(
                api_group="rbac.authorization.k8s.io", kind="ClusterRole", name="agentq-agent"
            ),
            subjects=[client.RbacV1Subject(kind="ServiceAccount", name=account)],
        ),
    )
    pods = {name: bound_pod(core, ns, account, name) for name in ("p-abc12", "p-def34")}
    claim_tokens = {}
    for name, pod in pods.items():
        claim_tokens[name] = tmp_path / f"{name}.claims.token"
        claim_tokens[name].write_text(token(core, ns, account, pod=pod, audiences=[AUDIENCE]))
    claim_tokens["unbound"] = tmp_path / "unbound.claims.token"
    claim_tokens["unbound"].write_text(token(core, ns, account, audiences=[AUDIENCE]))
    pool = Pool(control_plane, fleet, tmp_path)
    pod = pods["p-abc12"]
    kubeconfig = kubeconfig_for_token(
        control_plane.kubeconfig, token(core, ns, account, pod=pod), tmp_path / "pod.kubeconfig"
    )
    fleet.agent(
        "p-abc12",
        "complete",
        kubeconfig=str(kubeconfig),
        identity="p-abc12",
        operator_url=pool.url,
        operator_token_file=str(claim_tokens["p-abc12"]),
        capabilities="llm",
        max_in_flight=2,
        owner_pod_uid=pod.metadata.uid,
        work_seconds=6,  # long enough to ask the claim API while both run
    )
    pool.operator(teams)
    team_a, team_b = teams
    for team in teams:
        team_task(fleet, team, "job", payload={"team": team})
    for team in teams:
        until(
            f"{team}/job Running on the pool pod",
            lambda team=team: (
                (read(fleet, team, "job").get("status") or {}).get("phase") == "Running"
            ),
            fleet,
        )
    registered = fleet.custom.get_namespaced_custom_object(
        GROUP, VERSION, ns, "agentworkers", "p-abc12"
    )
    assert [(o["kind"], o["uid"]) for o in registered["metadata"]["ownerReferences"]] == [
        ("Pod", pod.metadata.uid)
    ]
    st = read(fleet, team_a, "job")["status"]
    assert (st["worker"], st["workerNamespace"]) == ("p-abc12", ns), st
    lease = protocol.cross_task_lease_name(team_a, "job")

    async def ask(name: str) -> Any:
        claims = OperatorClaims(pool.url, str(claim_tokens[name]))
        try:
            return await claims.read(ns, lease)
        except ClaimError as err:
            return (err.status, err.message)
        finally:
            await claims.close()

    mine = asyncio.run(ask("p-abc12"))
    assert mine["spec"]["payload"] == {"team": team_a}, mine
    other = asyncio.run(ask("p-def34"))
    assert other[0] == 403 and "not yours" in other[1], other
    unbound = asyncio.run(ask("unbound"))
    assert unbound[0] == 403 and "bound to no pod" in unbound[1], unbound
    # The agent reports: both teams' tasks succeed on the pod's worker.
    for team in (team_a, team_b):
        final = until(
            f"{team}/job Succeeded",
            lambda team=team: (
                (s := read(fleet, team, "job").get("status") or {}).get("phase") == "Succeeded"
                and s
            ),
            fleet,
            timeout=120,
        )
        assert final["worker"] == "p-abc12", final
    until("no claim Lease left", lambda: not xleases(fleet), fleet, timeout=30)


def test_a_cancelled_foreign_claim_is_revoked_at_once_and_its_agent_told(
    control_plane: ControlPlane,
    agentq_installed: None,
    fleet: Fleet,
    teams: tuple[str, str],
    tmp_path: Path,
) -> None:
    """A team cancels its task running on a pool worker: the holder's sidecar sees the
    revocation on the claim's Lease in the pool, tells its agent (409 Cancelled) and
    lets the Lease go, so the task ends Cancelled well before the lease would run out."""
    team_a, _ = teams
    pool = Pool(control_plane, fleet, tmp_path)
    pool.worker("w1", slots=1)
    holder = pool.agent("w1", "hold", beat_seconds=1)
    pool.operator(teams)
    team_task(fleet, team_a, "held", leaseDurationSeconds=30)
    until(
        "the task Running on w1",
        lambda: (read(fleet, team_a, "held").get("status") or {}).get("phase") == "Running",
        fleet,
    )
    started = time.monotonic()
    fleet.custom.patch_namespaced_custom_object(
        GROUP, VERSION, team_a, "agenttasks", "held", {"spec": {"cancel": True}}
    )
    until(
        "the task Cancelled",
        lambda: (read(fleet, team_a, "held").get("status") or {}).get("phase") == "Cancelled",
        fleet,
        timeout=40,
    )
    took = time.monotonic() - started
    assert took < 10, f"Cancelled after {took:.1f}s: by the lease's expiry, not the revocation"
    until(
        "the agent told its claim is revoked (Cancelled)",
        lambda: any(
            e.get("event") == "revoked" and e.get("reason") == "Cancelled"
            for e in holder.agent.events()
        ),
        fleet,
        timeout=10,
    )
    until("no claim Lease left", lambda: not xleases(fleet), fleet, timeout=30)
