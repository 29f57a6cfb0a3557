"""The agent's RBAC role and the admission policy agentq-agent-writes, on the real
API server, with real ServiceAccount tokens (TokenRequest, bound to a Pod object
like the token a kubelet mounts).

An agent may keep its own worker Lease, renew and report on the task Leases its
worker holds, and register its own AgentWorker. Every foreign write is refused:
by RBAC where the role lacks the verb, and by the policy where RBAC cannot say
"only your own"; with a role that allows everything, the policy alone still
refuses each of them. An account not named agentq-agent-* is not affected.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client

from accounts import api_for_token, bound_pod, create_account, refused, token
from agentq import GROUP, VERSION
from builders import worker
from fleet import ControlPlane
from manifests import agent_objects, to_yaml

POLICY = "ValidatingAdmissionPolicy 'agentq-agent-writes'"


def lease(
    name: str, *, holder: str, kind: str, worker: str, token_: str = "7", **labels: str
) -> client.V1Lease:
    annotations = (
        {"agentq.dev/fencing-token": token_, "agentq.dev/attempt": "1", "agentq.dev/task-uid": "u1"}
        if kind == "task"
        else {}
    )
    return client.V1Lease(
        metadata=client.V1ObjectMeta(
            name=name,
            labels={"agentq.dev/lease": kind, "agentq.dev/worker": worker, **labels},
            annotations=annotations,
        ),
        spec=client.V1LeaseSpec(
            holder_identity=holder,
            lease_duration_seconds=15,
            renew_time=datetime.datetime.now(datetime.UTC),
        ),
    )


class Agent:
    """Worker ``worker``'s agent: its account, a pod-bound token, and API clients."""

    def __init__(self, control_plane: ControlPlane, namespace: str, worker: str) -> None:
        admin = control_plane.api_client()
        core = client.CoreV1Api(admin)
        objects = agent_objects(control_plane.kubectl_path, worker=worker, namespace=namespace)
        accounts = [o for o in objects if o["kind"] in ("ServiceAccount", "RoleBinding")]
        control_plane.kubectl("apply", "-f", "-", input=to_yaml(accounts))
        self.account = f"agentq-agent-{worker}"
        pod = bound_pod(core, namespace, self.account, f"agent-{worker}-pod")
        self.api = api_for_token(
            control_plane.kubeconfig, token(core, namespace, self.account, pod=pod)
        )
        self.leases = client.CoordinationV1Api(self.api)
        self.custom = client.CustomObjectsApi(self.api)


@pytest.fixture
def setup(
    control_plane: ControlPlane, agentq_installed: None, namespace: str
) -> Iterator[tuple[Agent, client.CoordinationV1Api]]:
    admin_leases = client.CoordinationV1Api(control_plane.api_client())
    # As the operator grants them: task t1 to worker alpha, t2 to worker beta.
    admin_leases.create_namespaced_lease(
        namespace,
        lease(
            "agentq-task-t1",
            holder="alpha",
            kind="task",
            worker="alpha",
            **{"agentq.dev/task": "t1"},
        ),
    )
    admin_leases.create_namespaced_lease(
        namespace,
        lease(
            "agentq-task-t2", holder="beta", kind="task", worker="beta", **{"agentq.dev/task": "t2"}
        ),
    )
    yield Agent(control_plane, namespace, "alpha"), admin_leases


def renewed(current: client.V1Lease, **annotations: str) -> client.V1Lease:
    current.spec.renew_time = datetime.datetime.now(datetime.UTC)
    current.metadata.annotations = {**(current.metadata.annotations or {}), **annotations}
    return current


def test_an_agent_keeps_its_own_worker_lease_and_renews_its_task_leases(
    setup: tuple[Agent, client.CoordinationV1Api], namespace: str
) -> None:
    agent, admin = setup
    created = agent.leases.create_namespaced_lease(
        namespace,
        lease("agentq-worker-alpha", holder="agent-alpha-pod", kind="worker", worker="alpha"),
    )
    created.spec.renew_time = datetime.datetime.now(datetime.UTC)
    agent.leases.replace_namespaced_lease("agentq-worker-alpha", namespace, created)
    # A release (holder cleared, as the sidecar does on SIGTERM) is its own business.
    current = agent.leases.read_namespaced_lease("agentq-worker-alpha", namespace)
    current.spec.holder_identity = None
    agent.leases.replace_namespaced_lease("agentq-worker-alpha", namespace, current)

    task = agent.leases.read_namespaced_lease("agentq-task-t1", namespace)
    task = agent.leases.replace_namespaced_lease(
        "agentq-task-t1", namespace, renewed(task, **{"agentq.dev/progress": "3/10"})
    )
    report = '{"token": 7, "worker": "alpha", "outcome": "Succeeded"}'
    written = agent.leases.replace_namespaced_lease(
        "agentq-task-t1", namespace, renewed(task, **{"agentq.dev/report": report})
    )
    assert written.metadata.annotations["agentq.dev/report"] == report
    # Letting its claim go (the holder cleared), as the sidecar does once the operator
    # revoked the claim (a cancel, a deadline): the task ends at once, not at expiry.
    written.metadata.annotations["agentq.dev/revoked"] = "Cancelled"
    revoked = admin.replace_namespaced_lease("agentq-task-t1", namespace, written)
    revoked.spec.holder_identity = None
    let_go = agent.leases.replace_namespaced_lease("agentq-task-t1", namespace, revoked)
    assert let_go.spec.holder_identity is None

    registered = agent.custom.create_namespaced_custom_object(
        GROUP, VERSION, namespace, "agentworkers", worker("alpha", "llm").obj()
    )
    assert registered["metadata"]["name"] == "alpha"


def foreign_writes(agent: Agent, namespace: str) -> dict[str, Callable[[], Any]]:
    """Every write an agent of worker alpha must not make, by name."""
    leases = agent.leases

    def task_lease_edit(**change: Any) -> Callable[[], Any]:
        def call() -> Any:
            current = leases.read_namespaced_lease("agentq-task-t1", namespace)
            for key, value in change.items():
                if key == "holder":
                    current.spec.holder_identity = value
                else:
                    current.metadata.annotations[key] = value
            return leases.replace_namespaced_lease("agentq-task-t1", namespace, current)

        return call

    def foreign_task_renewal() -> Any:
        current = leases.read_namespaced_lease("agentq-task-t2", namespace)
        return leases.replace_namespaced_lease("agentq-task-t2", namespace, renewed(current))

    return {
        "another worker's Lease": lambda: leases.create_namespaced_lease(
            namespace, lease("agentq-worker-beta", holder="x", kind="worker", worker="beta")
        ),
        "own worker Lease labelled for another worker": lambda: leases.create_namespaced_lease(
            namespace, lease("agentq-worker-alpha", holder="x", kind="worker", worker="beta")
        ),
        "an unrelated Lease": lambda: leases.create_namespaced_lease(
            namespace,
            client.V1Lease(
                metadata=client.V1ObjectMeta(name="agentq-operator"), spec=client.V1LeaseSpec()
            ),
        ),
        "another worker's task Lease": foreign_task_renewal,
        "handing its task Lease to another worker": task_lease_edit(holder="beta"),
        "a new fencing token": task_lease_edit(**{"agentq.dev/fencing-token": "8"}),
        "a new task UID": task_lease_edit(**{"agentq.dev/task-uid": "u2"}),
        "marking its claim revoked": task_lease_edit(**{"agentq.dev/revoked": "Cancelled"}),
        "creating a task Lease": lambda: leases.create_namespaced_lease(
            namespace, lease("agentq-task-t3", holder="alpha", kind="task", worker="alpha")
        ),
        "deleting its task Lease": lambda: leases.delete_namespaced_lease(
            "agentq-task-t1", namespace
        ),
        "another worker's AgentWorker": lambda: agent.custom.create_namespaced_custom_object(
            GROUP,
            VERSION,
            namespace,
            "agentworkers",
            {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": "AgentWorker",
                "metadata": {"name": "beta"},
                "spec": {"capabilities": ["llm"]},
            },
        ),
        "an AgentTask": lambda: agent.custom.create_namespaced_custom_object(
            GROUP,
            VERSION,
            namespace,
            "agenttasks",
            {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": "AgentTask",
                "metadata": {"name": "forged"},
                "spec": {"requiredCapabilities": ["llm"]},
            },
        ),
    }


# The agent role lacks these verbs, so RBAC refuses them before admission.
REFUSED_BY_RBAC = {"deleting its task Lease", "an AgentTask"}


def test_every_foreign_write_is_refused(
    setup: tuple[Agent, client.CoordinationV1Api], namespace: str
) -> None:
    agent, admin = setup
    for what, call in foreign_writes(agent, namespace).items():
        by = "cannot" if what in REFUSED_BY_RBAC else POLICY
        refused(call, by=by)
    # Nothing changed: the operator's grants stand.
    t1 = admin.read_namespaced_lease("agentq-task-t1", namespace)
    assert t1.spec.holder_identity == "alpha"
    assert t1.metadata.annotations["agentq.dev/fencing-token"] == "7"
    assert admin.read_namespaced_lease("agentq-task-t2", namespace).spec.holder_identity == "beta"


def test_the_revoked_mark_is_the_operators_the_holder_lets_go_but_never_edits_it(
    setup: tuple[Agent, client.CoordinationV1Api], namespace: str
) -> None:
    """The operator marked worker alpha's claim of t1 revoked (a cancel): the holder may
    renew (a last report) and let the claim go with the mark as it is, but neither
    change nor remove it, held or let go (the operator no longer trusts the mark alone,
    claims.revoked_by_operator; the policy keeps it the operator's anyway)."""
    agent, admin = setup
    marked = admin.read_namespaced_lease("agentq-task-t1", namespace)
    marked.metadata.annotations["agentq.dev/revoked"] = "Cancelled"
    admin.replace_namespaced_lease("agentq-task-t1", namespace, marked)

    def edit(*, revoked: str | None, holder: str | None = "alpha") -> Callable[[], Any]:
        def call() -> Any:
            current = agent.leases.read_namespaced_lease("agentq-task-t1", namespace)
            current.spec.holder_identity = holder
            if revoked is None:
                del current.metadata.annotations["agentq.dev/revoked"]
            else:
                current.metadata.annotations["agentq.dev/revoked"] = revoked
            return agent.leases.replace_namespaced_lease("agentq-task-t1", namespace, current)

        return call

    says = "revoked mark"
    refused(edit(revoked="DeadlineExceeded"), by=POLICY, says=says)
    refused(edit(revoked=""), by=POLICY, says=says)
    refused(edit(revoked=None), by=POLICY, says=says)
    refused(edit(revoked=None, holder=None), by=POLICY, says=says)
    report = '{"token": 7, "worker": "alpha", "outcome": "Failed"}'
    current = agent.leases.read_namespaced_lease("agentq-task-t1", namespace)
    agent.leases.replace_namespaced_lease(
        "agentq-task-t1", namespace, renewed(current, **{"agentq.dev/report": report})
    )
    let_go = edit(revoked="Cancelled", holder=None)()
    assert let_go.spec.holder_identity is None
    assert let_go.metadata.annotations["agentq.dev/revoked"] == "Cancelled"
    # Let go, the Lease is no longer the agent's to mark either.
    refused(edit(revoked=None, holder=None), by=POLICY)


def test_the_policy_refuses_them_even_where_rbac_would_allow(
    setup: tuple[Agent, client.CoordinationV1Api], control_plane: ControlPlane, namespace: str
) -> None:
    agent, _ = setup
    rbac = client.RbacAuthorizationV1Api(control_plane.api_client())
    rbac.create_namespaced_role(
        namespace,
        client.V1Role(
            metadata=client.V1ObjectMeta(name="everything"),
            rules=[
                client.V1PolicyRule(
                    api_groups=["agentq.dev", "coordination.k8s.io"], resources=["*"], verbs=["*"]
                )
            ],
        ),
    )
    for account in (agent.account, "other-app"):
        rbac.create_namespaced_role_binding(
            namespace,
            client.V1RoleBinding(
                metadata=client.V1ObjectMeta(name=f"everything-{account}"),
                role_ref=client.V1RoleRef(
                    api_group="rbac.authorization.k8s.io", kind="Role", name="everything"
                ),
                subjects=[
                    client.RbacV1Subject(kind="ServiceAccount", name=account, namespace=namespace)
                ],
            ),
        )
    for what, call in foreign_writes(agent, namespace).items():
        body = refused(call, by=POLICY)
        assert "agent alpha" in body or "agents may not change AgentTasks" in body, (what, body)

    # An account that is not an agent's is not the policy's business.
    core = client.CoreV1Api(control_plane.api_client())
    create_account(core, namespace, "other-app")
    other = client.CoordinationV1Api(
        api_for_token(control_plane.kubeconfig, token(core, namespace, "other-app"))
    )
    other.create_namespaced_lease(
        namespace, lease("agentq-worker-beta", holder="x", kind="worker", worker="beta")
    )


def test_a_workers_spec_is_a_persons_the_sidecar_only_lowers_it(
    setup: tuple[Agent, client.CoordinationV1Api], control_plane: ControlPlane, namespace: str
) -> None:
    """A person registered worker alpha and drained it (``agentq drain``: paused); its
    sidecar's token may not un-pause it, raise its weight or maxInFlight, add a
    capability, or touch its metadata; it may lower and narrow them (its flags say less)."""
    agent, _ = setup
    admin = client.CustomObjectsApi(control_plane.api_client())
    admin.create_namespaced_custom_object(
        GROUP,
        VERSION,
        namespace,
        "agentworkers",
        worker("alpha", "llm", "gpu").label("team", "a").weight(2).max_in_flight(4).paused().obj(),
    )

    def patch(body: dict[str, Any]) -> Any:
        return agent.custom.patch_namespaced_custom_object(
            GROUP, VERSION, namespace, "agentworkers", "alpha", body
        )

    says = "may not change spec.paused"
    refused(lambda: patch({"spec": {"paused": False}}), by=POLICY, says=says)
    raising = "may only lower weight and maxInFlight and narrow capabilities"
    for spec in (
        {"weight": 3},
        {"weight": 2.5},
        {"maxInFlight": 5},
        {"capabilities": ["llm", "gpu", "code"]},
        {"capabilities": ["code"]},
        {"weight": 1, "maxInFlight": 100},
    ):
        refused(lambda spec=spec: patch({"spec": spec}), by=POLICY, says=raising)
    refused(lambda: patch({"metadata": {"labels": {"team": "b"}}}), by=POLICY, says="labels")
    refused(
        lambda: patch({"metadata": {"finalizers": ["x.dev/keep"]}}), by=POLICY, says="finalizers"
    )

    lowered = patch({"spec": {"weight": 0.5, "maxInFlight": 2, "capabilities": ["llm"]}})
    assert lowered["spec"] == {
        "capabilities": ["llm"],
        "weight": 0.5,
        "maxInFlight": 2,
        "paused": True,
    }
    # Once lowered, raising back to what the person had set is a person's again.
    refused(lambda: patch({"spec": {"weight": 2}}), by=POLICY, says=raising)
    body = admin.get_namespaced_custom_object(GROUP, VERSION, namespace, "agentworkers", "alpha")
    assert body["spec"]["paused"] is True and body["metadata"]["labels"] == {"team": "a"}
    # The person may do all of it.
    admin.patch_namespaced_custom_object(
        GROUP,
        VERSION,
        namespace,
        "agentworkers",
        "alpha",
        {"spec": {"paused": False, "weight": 8, "capabilities": ["llm", "code"]}},
    )


def test_a_pool_pod_acts_as_the_worker_named_after_it_and_no_other(
    control_plane: ControlPlane, agentq_installed: None, namespace: str
) -> None:
    """An autoscaled pool (docs/autoscaling.md) runs every pod under one account,
    agentq-pool-<pool>; each pod is the worker named after itself: the pod name its
    token is bound to, which the API server vouches for. It may keep that worker's Lease
    and register that AgentWorker (owned by the pod), never another pod's or the pool's
    name; a pool token bound to no pod is no worker at all."""
    admin = control_plane.api_client()
    core = client.CoreV1Api(admin)
    account = "agentq-pool-p"
    create_account(core, namespace, account)
    client.RbacAuthorizationV1Api(admin).create_namespaced_role_binding(
        namespace,
        client.V1RoleBinding(
            metadata=client.V1ObjectMeta(name=account),
            role_ref=client.V1RoleRef(
                api_group="rbac.authorization.k8s.io", kind="ClusterRole", name="agentq-agent"
            ),
            subjects=[client.RbacV1Subject(kind="ServiceAccount", name=account)],
        ),
    )
    pod = bound_pod(core, namespace, account, "p-abc12")
    api = api_for_token(control_plane.kubeconfig, token(core, namespace, account, pod=pod))
    leases = client.CoordinationV1Api(api)
    custom = client.CustomObjectsApi(api)
    mine = lease("agentq-worker-p-abc12", holder="p-abc12", kind="worker", worker="p-abc12")
    created = leases.create_namespaced_lease(namespace, mine)
    created.metadata.annotations = {"agentq.dev/draining": "true"}
    leases.replace_namespaced_lease("agentq-worker-p-abc12", namespace, created)
    owned = worker("p-abc12", "llm").obj()
    owned["metadata"]["ownerReferences"] = [
        {"apiVersion": "v1", "kind": "Pod", "name": "p-abc12", "uid": pod.metadata.uid}
    ]
    custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "agentworkers", owned)
    for other in ("p-other", "p"):
        refused(
            lambda other=other: leases.create_namespaced_lease(
                namespace,
                lease(f"agentq-worker-{other}", holder="p-abc12", kind="worker", worker=other),
            ),
            by=POLICY,
        )
        refused(
            lambda other=other: custom.create_namespaced_custom_object(
                GROUP, VERSION, namespace, "agentworkers", worker(other, "llm").obj()
            ),
            by=POLICY,
        )
    unbound = client.CoordinationV1Api(
        api_for_token(control_plane.kubeconfig, token(core, namespace, account))
    )
    refused(
        lambda: unbound.create_namespaced_lease(
            namespace, lease("agentq-worker-x", holder="x", kind="worker", worker="x")
        ),
        by=POLICY,
    )
