"""agentq on real pods: the scenario, on an operator installed either way (see
conftest.py for where it runs).

``make e2e`` runs it on the Helm chart's install, between the install and the
upgrade (e2e/test_helm.py calls ``run_scenario``); ``test_agentq_on_real_pods``
runs it on the kustomize base (``e2e/kind/run.sh`` on kind, or this file alone on
the local node).

1. The install, with the locally built image: 2 operator replicas as pods, running
   as their own ServiceAccount (never as admin).
2. Three agent Deployments from manifests/agent/ (``agentq agent-sim`` behind the
   ``agentq sidecar`` native sidecar) with weights 1:2:4, plus a fourth whose agent
   fails every task it gets: the only one with the capability the poison task needs.
3. A backlog once every worker is Ready: the first assignments' cost shares are
   within the DRR bound (one maximum task cost) of the weights.
4. While the work runs: force-delete one agent pod, SIGKILL another pod's agent
   container through the container runtime, delete the leader operator pod.
5. From the API server: every task terminal; the force-deleted pod's tasks were
   reclaimed and completed by other workers; the poison task DeadLettered after
   its allowed attempts; the standby operator took over; and a real agent pod's
   own token is refused (policy or RBAC) for another worker's Lease, for a task
   Lease it does not hold, and for an AgentTask.
6. Credentials only where needed: the agent container has no token and the API
   server takes it for anonymous; the sidecar's agent API refuses a call without the
   pod's secret, with a wrong one, under a rebinding Host or as a form post, from
   the agent container; from another pod it cannot be reached at all, while the
   metrics port can (tests/podchecks.py).
7. Its namespace deleted, and with it its agents, tasks, AgentWorkers and Leases.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections import Counter
from typing import Any

import pytest
from kubernetes import client

from manifests import agent_objects, to_yaml
from nodetools import Platform, wait_for
from podchecks import (
    FROM_ITS_AGENT,
    NO_CREDENTIALS,
    SIDECAR_CALLS,
    judge_from_another_pod,
    judge_no_credentials,
)
from podcluster import Cluster, in_container, install, installed, phase

NAMESPACE = "agentq-e2e"
WEIGHTS = {"small": 1, "medium": 2, "large": 4}
POISON_WORKER = "flaky"
BACKLOG = 42
COSTS = [1 + i % 3 for i in range(BACKLOG)]
WORK_SECONDS = 20
LEASE_SECONDS = 10
POISON_MAX_RECLAIMS = 2

_started = time.monotonic()


def say(line: str) -> None:
    print(f"[e2e {time.monotonic() - _started:6.1f}s] {line}", flush=True)


@pytest.mark.timeout(1800)
def test_agentq_on_real_pods(platform: Platform) -> None:
    """The scenario on the kustomize install (``e2e/kind/run.sh``, or this file alone).
    ``make e2e`` runs it on the chart's install instead: e2e/test_helm.py."""
    global _started
    _started = time.monotonic()
    k = Cluster(platform, NAMESPACE)
    install(k, say)
    run_scenario(platform)


def run_scenario(platform: Platform) -> None:
    """The scenario on an operator installed already, by the kustomize base or the
    chart (CRDs, the operator's two replicas in agentq-system, its policies): its own
    agents from manifests/agent in namespace NAMESPACE, which it deletes at the end,
    leaving the install as it found it."""
    global _started
    _started = time.monotonic()
    k = Cluster(platform, NAMESPACE)
    leader = installed(k, say)

    k.apply(
        [
            {
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {
                    "name": NAMESPACE,
                    "labels": {"pod-security.kubernetes.io/enforce": "restricted"},
                },
            }
        ]
    )
    agents: list[dict[str, Any]] = []
    for worker, weight in WEIGHTS.items():
        agents += agent_objects(
            platform.kubectl,
            worker=worker,
            namespace=NAMESPACE,
            image=platform.image,
            env={
                "AGENTQ_CAPABILITIES": "llm",
                "AGENTQ_WEIGHT": str(weight),
                "AGENTQ_MAX_IN_FLIGHT": "100",
            },
            agent_args=[
                "agent-sim",
                "--behaviour",
                "complete",
                "--work-seconds",
                str(WORK_SECONDS),
            ],
        )
    agents += agent_objects(
        platform.kubectl,
        worker=POISON_WORKER,
        namespace=NAMESPACE,
        image=platform.image,
        env={"AGENTQ_CAPABILITIES": "poison", "AGENTQ_MAX_IN_FLIGHT": "1"},
        agent_args=["agent-sim", "--behaviour", "fail", "--work-seconds", "1"],
    )
    k.apply(agents)
    for worker in [*WEIGHTS, POISON_WORKER]:
        k.kubectl("-n", NAMESPACE, "rollout", "status", f"deploy/agent-{worker}", "--timeout=300s")
    for worker in [*WEIGHTS, POISON_WORKER]:
        wait_for(f"worker {worker} Ready", lambda w=worker: k.worker_phase(w) == "Ready", 120)
    say("4 agent pods Running (agent-sim + native sidecar); every AgentWorker Ready")

    tasks = [
        {
            "apiVersion": "agentq.dev/v1alpha1",
            "kind": "AgentTask",
            "metadata": {"name": f"job-{i:03d}", "namespace": NAMESPACE},
            "spec": {
                "requiredCapabilities": ["llm"],
                "cost": cost,
                "leaseDurationSeconds": LEASE_SECONDS,
                "payload": {"n": i},
            },
        }
        for i, cost in enumerate(COSTS)
    ]
    tasks.append(
        {
            "apiVersion": "agentq.dev/v1alpha1",
            "kind": "AgentTask",
            "metadata": {"name": "poison", "namespace": NAMESPACE},
            "spec": {
                "requiredCapabilities": ["poison"],
                "leaseDurationSeconds": LEASE_SECONDS,
                "maxReclaims": POISON_MAX_RECLAIMS,
                "retryBackoff": {"initialSeconds": 1, "maxSeconds": 2},
            },
        }
    )
    k.kubectl("apply", "-f", "-", input=to_yaml(tasks))
    say(f"submitted {BACKLOG} tasks (costs 1..3, {WORK_SECONDS}s of work each) and a poison task")

    def all_assigned() -> list[dict[str, Any]] | None:
        items = [t for t in k.tasks() if t["metadata"]["name"] != "poison"]
        if len(items) == BACKLOG and all((t.get("status") or {}).get("worker") for t in items):
            return items
        return None

    first = wait_for("the whole backlog to be assigned", all_assigned, 120, every=0.5)
    served: Counter[str] = Counter()
    for t in first:
        served[t["status"]["worker"]] += t["spec"]["cost"]
    total = sum(COSTS)
    for worker, weight in WEIGHTS.items():
        fair = total * weight / sum(WEIGHTS.values())
        assert abs(served[worker] - fair) <= max(COSTS), (worker, dict(served), fair)
    say(f"first assignments by cost {dict(served)} of {total}: within one task cost of 1:2:4")

    # -- faults, while the work runs -------------------------------------------------------
    # The claims the deleted pod holds, by the fencing token of their attempt.
    victims = {
        t["metadata"]["name"]: t["status"]["fencingToken"]
        for t in first
        if t["status"]["worker"] == "medium"
    }
    doomed = k.pod_of("medium").metadata.name
    k.kubectl("-n", NAMESPACE, "delete", "pod", doomed, "--grace-period=0", "--force")
    say(f"force-deleted pod {doomed} holding {len(victims)} tasks")

    pod = k.pod_of("small")
    (agent_status,) = [c for c in pod.status.container_statuses if c.name == "agent"]
    container_id = agent_status.container_id.split("://", 1)[1]
    subprocess.run(
        [*platform.ctr, "-n", "k8s.io", "tasks", "kill", "--signal", "SIGKILL", container_id],
        check=True,
        capture_output=True,
        timeout=60,
    )
    wait_for(
        "the kubelet to restart the killed agent container",
        lambda: any(
            c.name == "agent" and c.restart_count > agent_status.restart_count
            for c in k.core.read_namespaced_pod(
                pod.metadata.name, NAMESPACE
            ).status.container_statuses
        ),
        120,
    )
    say(f"SIGKILLed the agent container of {pod.metadata.name} through containerd; restarted")

    leader_pod = leader.rsplit("-", 2)[0]
    k.kubectl("-n", "agentq-system", "delete", "pod", leader_pod, "--wait=false")
    new_leader = wait_for(
        "the standby operator to take over",
        lambda: (lambda h: h if h and not h.startswith(leader_pod + "-") else None)(k.leader()),
        90,
        every=0.5,
    )
    say(f"deleted the leader pod {leader_pod}; {new_leader} leads")

    # -- the outcome, from the API server ------------------------------------------------------
    final = wait_for(
        "every task to end",
        lambda: (
            lambda items: (
                items
                if all(phase(t) in ("Succeeded", "Failed", "DeadLettered") for t in items)
                else None
            )
        )(k.tasks()),
        600,
        every=2,
    )
    by_name = {t["metadata"]["name"]: t for t in final}
    phases = Counter(phase(t) for t in final)
    assert phases == {"Succeeded": BACKLOG, "DeadLettered": 1}, phases
    poison = by_name["poison"]["status"]
    assert phase(by_name["poison"]) == "DeadLettered"
    assert poison["attempt"] == POISON_MAX_RECLAIMS + 1, poison
    assert all(h["worker"] == POISON_WORKER for h in poison["history"])
    for name, killed_token in victims.items():
        status = by_name[name]["status"]
        assert status["reclaims"] >= 1, (name, status)
        # Completed by a later attempt, not by the deleted pod's...
        assert status["fencingToken"] != killed_token, (name, status)
        history = status["history"]
        (ended,) = [i for i, h in enumerate(history) if h["token"] == killed_token]
        assert history[ended]["worker"] == "medium", (name, history)
        assert history[ended]["reason"] == "LeaseExpired", (name, history)
        # ...and redispatched elsewhere (another worker had room). Later reclaims (the
        # other faults) may bring it back to medium's new pod: that is allowed.
        after = history[ended + 1]["worker"] if ended + 1 < len(history) else status["worker"]
        assert after != "medium", (name, history, status["worker"])
    reclaimed = sum(t["status"].get("reclaims", 0) for t in final)
    say(
        f"all {BACKLOG} tasks Succeeded ({reclaimed} reclaims; the {len(victims)} of the deleted "
        f"pod completed elsewhere); poison DeadLettered after {poison['attempt']} attempts"
    )
    k.kubectl(
        "-n", "agentq-system", "rollout", "status", "deploy/agentq-operator", "--timeout=300s"
    )

    cancel_and_deadline(k)

    refusals(k)
    say("the agent pod's own token was refused for every foreign write")

    credentials_only_where_needed(k)

    # Its agents, tasks, AgentWorkers and Leases go with the namespace (the agents
    # release their worker Leases on the way out, the operator still running).
    k.kubectl("delete", "namespace", NAMESPACE, "--wait", "--timeout=300s")
    say(f"namespace {NAMESPACE} deleted: the scenario's agents, tasks and Leases with it")


def credentials_only_where_needed(k: Cluster) -> None:
    """Item 1 and 4 of issue 19 on real pods: the agent container cannot authenticate to
    the API server; the sidecar API wants the pod's secret, and another pod cannot
    reach it."""
    large = k.pod_of("large")
    pod = large.metadata.name
    spec = large.spec
    assert spec.automount_service_account_token is False
    agent_mounts = [m.mount_path for c in spec.containers for m in c.volume_mounts or []]
    assert not any(p.startswith("/var/run/secrets") for p in agent_mounts), agent_mounts

    found = in_container(k, pod, "agent", NO_CREDENTIALS, NAMESPACE)
    for what, value in found.items():
        say(f"  agent container of {pod}: {what}: {str(value)[:160]}")
    problems = judge_no_credentials(found)
    assert not problems, problems
    say("the agent container has no Kubernetes credential: the API server takes it as anonymous")

    api, metrics = "http://127.0.0.1:8700", "http://127.0.0.1:8701"
    calls = in_container(k, pod, "agent", SIDECAR_CALLS, api, metrics)
    for what, answer in calls.items():
        say(f"  from the agent container, {what}: {answer}")
    assert calls == FROM_ITS_AGENT, calls
    say("the sidecar API refused every call without the pod's secret, from its own pod")

    other = k.pod_of("small").metadata.name
    ip = large.status.pod_ip
    calls = in_container(k, other, "agent", SIDECAR_CALLS, f"http://{ip}:8700", f"http://{ip}:8701")
    for what, answer in calls.items():
        say(f"  from pod {other} at {ip}, {what}: {answer}")
    problems = judge_from_another_pod(calls)
    assert not problems, problems
    say(f"from pod {other}, {pod}'s agent API cannot be reached; its metrics port can")


def cancel_and_deadline(k: Cluster) -> None:
    """A cancel and a deadline on real pods: the running attempt's agent is told (its
    container logs 'revoked') and the task ends, never dispatched again."""

    def spec(**extra: Any) -> dict[str, Any]:
        return {"requiredCapabilities": ["llm"], "leaseDurationSeconds": LEASE_SECONDS, **extra}

    tasks = [
        {
            "apiVersion": "agentq.dev/v1alpha1",
            "kind": "AgentTask",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": spec(**extra),
        }
        for name, extra in (("to-cancel", {}), ("past-deadline", {"activeDeadlineSeconds": 5}))
    ]
    k.kubectl("apply", "-f", "-", input=to_yaml(tasks))

    def running(name: str) -> dict[str, Any] | None:
        task = next((t for t in k.tasks() if t["metadata"]["name"] == name), None)
        return task if task is not None and phase(task) == "Running" else None

    held = wait_for("the task to cancel to run", lambda: running("to-cancel"), 60, every=0.5)
    k.kubectl(
        "-n", NAMESPACE, "patch", "agenttask", "to-cancel", "--type=merge",
        "-p", '{"spec":{"cancel":true}}',
    )  # fmt: skip
    started = time.monotonic()
    done = wait_for(
        "the cancelled task to end",
        lambda: next(
            (
                t
                for t in k.tasks()
                if t["metadata"]["name"] == "to-cancel" and phase(t) == "Cancelled"
            ),
            None,
        ),
        LEASE_SECONDS + 15,
        every=0.5,
    )
    took = time.monotonic() - started
    worker = held["status"]["worker"]

    def told() -> list[dict[str, Any]]:
        # agent-sim's work is one blocking sleep that checks nothing: it hears of the cancel
        # when it next calls its sidecar (the complete after its work), and logs it then.
        pod = k.pod_of(worker).metadata.name
        logs = k.kubectl("-n", NAMESPACE, "logs", pod, "-c", "agent")
        lines = [json.loads(line) for line in logs.splitlines() if '"revoked"' in line]
        return [e for e in lines if e.get("task") == "to-cancel" and e.get("reason") == "Cancelled"]

    wait_for("the cancelled task's agent to be told", told, WORK_SECONDS + 30, every=1.0)
    assert done["status"]["history"][-1]["outcome"] == "Cancelled"
    say(f"cancelled a running task on {worker}: its agent was told, Cancelled after {took:.1f}s")

    failed = wait_for(
        "the task past its deadline to fail",
        lambda: next(
            (
                t
                for t in k.tasks()
                if t["metadata"]["name"] == "past-deadline" and phase(t) == "Failed"
            ),
            None,
        ),
        60,
        every=0.5,
    )
    assert failed["status"]["error"]["reason"] == "DeadlineExceeded", failed["status"]
    time.sleep(LEASE_SECONDS / 2)
    after = {t["metadata"]["name"]: phase(t) for t in k.tasks()}
    assert after["to-cancel"] == "Cancelled" and after["past-deadline"] == "Failed", after
    say("a task past its activeDeadlineSeconds ended Failed (DeadlineExceeded); neither ran again")


# Runs inside the agent pod, with nothing but what the kubelet mounted: the pod's
# own ServiceAccount token, the cluster CA and the Service address.
# With the pod's own mounted token: the calls a container of that pod makes.
POD_CLIENT = r"""
import json, os, ssl, sys, urllib.error, urllib.request
SA = "/var/run/secrets/kubernetes.io/serviceaccount/"
token = open(SA + "token").read()
tls = ssl.create_default_context(cafile=SA + "ca.crt")
env = os.environ
base = "https://%s:%s" % (env["KUBERNETES_SERVICE_HOST"], env["KUBERNETES_SERVICE_PORT"])
ns = open(SA + "namespace").read()

def call(method, path, body=None, ctype="application/json"):
    request = urllib.request.Request(base + path, method=method,
        data=json.dumps(body).encode() if body is not None else None,
        headers={"Authorization": "Bearer " + token, "Content-Type": ctype})
    try:
        with urllib.request.urlopen(request, context=tls, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read()).get("message", "")
"""

FOREIGN_WRITES = (
    POD_CLIENT
    + r"""
leases = "/apis/coordination.k8s.io/v1/namespaces/%s/leases" % ns
out = {}
status, own = call("GET", leases + "/agentq-worker-large")
out["own worker Lease (read)"] = (status, "")
out["another worker's Lease"] = call("POST", leases, {"metadata": {"name": "agentq-worker-small",
    "labels": {"agentq.dev/lease": "worker", "agentq.dev/worker": "small"}},
    "spec": {"holderIdentity": "me"}})
status, lease = call("GET", leases + "/agentq-task-planted")
lease["metadata"]["annotations"]["agentq.dev/report"] = json.dumps(
    {"token": 1, "worker": "large", "outcome": "Succeeded"})
out["a task Lease held by another worker"] = call("PUT", leases + "/agentq-task-planted", lease)
tasks = "/apis/agentq.dev/v1alpha1/namespaces/%s/agenttasks" % ns
out["an AgentTask"] = call("PATCH", tasks + "/job-000",
    {"metadata": {"labels": {"forged": "yes"}}}, "application/merge-patch+json")
# Reads: another team's task (its namespace is argv[1]), and a list of tasks anywhere.
other = "/apis/agentq.dev/v1alpha1/namespaces/%s/agenttasks" % sys.argv[1]
out["another team's AgentTask (read)"] = call("GET", other + "/team-b-plan")
out["another team's AgentTasks (list)"] = call("GET", other)
out["its own namespace's AgentTasks (list)"] = call("GET", tasks)
workers = "/apis/agentq.dev/v1alpha1/namespaces/%s/agentworkers" % ns
out["pausing or un-pausing its AgentWorker"] = call("PATCH", workers + "/large",
    {"spec": {"paused": True}}, "application/merge-patch+json")
out["raising its AgentWorker's weight"] = call("PATCH", workers + "/large",
    {"spec": {"weight": 1000, "maxInFlight": 1000}}, "application/merge-patch+json")
print(json.dumps(out))
"""
)

# The node's heartbeat Lease (kube-node-lease/<node>, argv[1]), as the operator.
NODE_LEASE_WRITE = (
    POD_CLIENT
    + r"""
path = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/" + sys.argv[1]
print(json.dumps(call("PATCH", path, {"spec": {"holderIdentity": "agentq"}},
    "application/merge-patch+json")))
"""
)

# With the operator's own token: a grant carrying an epoch older than the election
# Lease's leaseTransitions, as a deposed replica's late grant would.
STALE_GRANT = (
    POD_CLIENT
    + r"""
namespace, task = sys.argv[1], sys.argv[2]
lease = call("GET", "/apis/coordination.k8s.io/v1/namespaces/agentq-system/leases/agentq-operator")
transitions = lease[1].get("spec", {}).get("leaseTransitions", 0)
path = "/apis/agentq.dev/v1alpha1/namespaces/" + namespace + "/agenttasks/" + task + "/status"
patch = {"status": {"phase": "Assigned", "worker": "large", "fencingToken": 1,
    "attempt": 1, "leaderEpoch": transitions - 1}}
print(json.dumps([transitions] + list(call("PATCH", path, patch,
    "application/merge-patch+json"))))
"""
)


TEAM_B = "agentq-e2e-team-b"


def refusals(k: Cluster) -> None:
    """Another worker's claims, written with worker large's pod's own mounted token; and
    another team's task (namespace TEAM_B), read with it: an agent pod reads what its
    own namespace assigns it, and nothing of another team's (docs/tenancy.md)."""
    k.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=TEAM_B)))
    plan = {
        "apiVersion": "agentq.dev/v1alpha1",
        "kind": "AgentTask",
        "metadata": {"name": "team-b-plan", "namespace": TEAM_B},
        "spec": {"payload": {"secret": "team b's plan"}, "requiredCapabilities": ["none-here"]},
    }
    k.custom.create_namespaced_custom_object("agentq.dev", "v1alpha1", TEAM_B, "agenttasks", plan)
    k.leases.create_namespaced_lease(
        NAMESPACE,
        client.V1Lease(
            metadata=client.V1ObjectMeta(
                name="agentq-task-planted",
                labels={
                    "agentq.dev/lease": "task",
                    "agentq.dev/worker": "small",
                    "agentq.dev/task": "x",
                },
                annotations={"agentq.dev/fencing-token": "1", "agentq.dev/attempt": "1"},
            ),
            spec=client.V1LeaseSpec(holder_identity="small", lease_duration_seconds=30),
        ),
    )
    try:
        pod = k.pod_of("large").metadata.name
        found = in_container(k, pod, "sidecar", FOREIGN_WRITES, TEAM_B)
    finally:
        k.leases.delete_namespaced_lease("agentq-task-planted", NAMESPACE)
        k.core.delete_namespace(TEAM_B)
    results = {what: tuple(r) for what, r in found.items()}
    for what, (status, message) in results.items():
        say(f"  with pod {pod}'s own token, {what}: {status} {str(message)[:160]}")
    assert results["own worker Lease (read)"][0] == 200, results
    for what in ("another worker's Lease", "a task Lease held by another worker"):
        status, message = results[what]
        assert status == 403 and "agentq-agent-writes" in message, (what, results[what])
    status, message = results["an AgentTask"]
    assert status == 403 and "cannot patch" in message, results["an AgentTask"]
    for what, verb in (
        ("another team's AgentTask (read)", "cannot get"),
        ("another team's AgentTasks (list)", "cannot list"),
        ("its own namespace's AgentTasks (list)", "cannot list"),
    ):
        status, message = results[what]
        assert status == 403 and verb in message and "team b's plan" not in str(message), (
            what,
            results[what],
        )
    for what in ("pausing or un-pausing its AgentWorker", "raising its AgentWorker's weight"):
        status, message = results[what]
        assert status == 403 and "agentq-agent-writes" in message, (what, results[what])

    # The operator's own token on the node's heartbeat: refused by agentq-operator-leases.
    node_lease = k.leases.list_namespaced_lease("kube-node-lease").items[0]
    operator = k.core.list_namespaced_pod(
        "agentq-system", label_selector="app.kubernetes.io/name=agentq-operator"
    ).items[0]
    status, message = in_container(
        k, operator.metadata.name, "operator", NODE_LEASE_WRITE, node_lease.metadata.name,
        namespace="agentq-system",
    )  # fmt: skip
    say(f"  with operator {operator.metadata.name}'s token, the node's Lease: {status}")
    assert status == 403 and "agentq-operator-leases" in message, (status, message)
    after = k.leases.read_namespaced_lease(node_lease.metadata.name, "kube-node-lease")
    assert after.spec.holder_identity == node_lease.spec.holder_identity

    # A grant from an epoch before the current leader's (the leader pod was deleted
    # above, so the election Lease has changed hands): refused by agentq-leader-epoch.
    k.kubectl(
        "apply", "-f", "-",
        input=to_yaml([{
            "apiVersion": "agentq.dev/v1alpha1",
            "kind": "AgentTask",
            "metadata": {"name": "stale-grant", "namespace": NAMESPACE},
            "spec": {"requiredCapabilities": ["nobody-has-this"]},
        }]),
    )  # fmt: skip
    transitions, status, message = in_container(
        k, operator.metadata.name, "operator", STALE_GRANT, NAMESPACE, "stale-grant",
        namespace="agentq-system",
    )  # fmt: skip
    say(f"  with operator {operator.metadata.name}'s token, a grant of epoch {transitions - 1}"
        f" (the Lease's is {transitions}): {status}")  # fmt: skip
    assert transitions >= 1, transitions
    assert status == 403 and "agentq-leader-epoch" in message, (status, message)
    task = next(t for t in k.tasks() if t["metadata"]["name"] == "stale-grant")
    assert phase(task) != "Assigned", task.get("status")
    k.kubectl("-n", NAMESPACE, "delete", "agenttask", "stale-grant")
