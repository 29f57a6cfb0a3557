"""Two teams share one agent pool on real pods (docs/tenancy.md; ``make e2e``, a
cluster of its own; conftest.py says where it runs).

1. The install base with the locally built image (2 operator replicas as pods).
2. Namespaces team-a and team-b, an AgentQueue each (weight 1, its namespaceSelector
   selecting its own namespace alone), both drawing on the AgentWorkers of a third
   namespace, agent-pool: agent pods from manifests/agent/ (agent-sim behind the
   native sidecar, their ServiceAccounts' real tokens, the manifests' RBAC and
   admission policies); the sidecars read their team tasks from the operator's claim
   API, which checks their tokens with a TokenReview.
3. A team cannot use a queue its namespace is not selected by: team-b's task naming
   team-a's queue stays Pending with ``Queued: False``, reason ``QueueForbidden``,
   never dispatched.
4. An agent pod cannot read another team's task: from inside a pool pod, the sidecar's
   API token is refused ``get``/``list`` on team-a's and team-b's AgentTasks (403), its
   claim-API token is no API server token (401), the agent container has no token at
   all (anonymous); another worker's sidecar asking the claim API for a claim it does
   not hold is refused (403), while the holder's own gets the task.
5. Team A queues 300 tasks, team B 100 after A's first 20 completions: read back from
   the API server (the grant order of the fencing tokens, the completion times), B gets
   >= 45 % of the completions while both have a backlog.
6. Every task Succeeded on its first attempt (0 reclaims); no claim Lease left.
"""

from __future__ import annotations

import time
from collections import Counter
from datetime import datetime
from typing import Any

import pytest

from manifests import agent_objects, to_yaml
from nodetools import Platform, wait_for
from podchecks import CLAIM_READ, TASK_READS, judge_task_reads
from podcluster import Cluster, in_container, install, phase

TEAMS = ("team-a", "team-b")
POOL = "agent-pool"
WORKERS = ("pool-1", "pool-2")  # the pool's workers of capability llm
HOLDER = "holder"  # holds the task it is given until it is cancelled
SLOTS = 4  # per worker
WORK_SECONDS = 0.5
A_TASKS, B_TASKS, B_AFTER = 300, 100, 20
SA = "/var/run/secrets/kubernetes.io/serviceaccount/"
OPERATOR_TOKEN = "/var/run/secrets/agentq.dev/operator/token"
SECRET_A, SECRET_B = "team a's plan", "team b's plan"

_started = time.monotonic()


def say(line: str) -> None:
    print(f"[e2e tenancy {time.monotonic() - _started:6.1f}s] {line}", flush=True)


def team_task(namespace: str, name: str, queue: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "agentq.dev/v1alpha1",
        "kind": "AgentTask",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"requiredCapabilities": ["llm"], "queue": queue, **spec},
    }


def token(t: dict[str, Any]) -> int:
    return int((t.get("status") or {}).get("fencingToken") or 0)


def finished(t: dict[str, Any]) -> float:
    stamp = str((t.get("status") or {}).get("finishedAt") or "")
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp() if stamp else 0.0


def condition(t: dict[str, Any], kind: str) -> tuple[str, str] | None:
    for c in (t.get("status") or {}).get("conditions") or []:
        if c.get("type") == kind:
            return str(c.get("status")), str(c.get("reason"))
    return None


def claim_leases(k: Cluster, namespace: str) -> list[str]:
    return sorted(
        lease.metadata.name
        for lease in k.leases.list_namespaced_lease(namespace).items
        if lease.metadata.name.startswith(("agentq-xtask-", "agentq-task-"))
    )


@pytest.mark.timeout(1200)
def test_two_teams_share_one_pool_on_real_pods(platform: Platform) -> None:
    global _started
    _started = time.monotonic()
    k = Cluster(platform, POOL)
    leader = install(k, say)

    # -- the teams, their queues and the pool ------------------------------------------
    k.apply(
        [
            {
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {
                    "name": name,
                    "labels": {"pod-security.kubernetes.io/enforce": "restricted"},
                },
            }
            for name in (*TEAMS, POOL)
        ]
        + [
            {
                "apiVersion": "agentq.dev/v1alpha1",
                "kind": "AgentQueue",
                "metadata": {"name": team},
                "spec": {
                    "weight": 1,
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": team}},
                    "workerNamespace": POOL,
                },
            }
            for team in TEAMS
        ]
    )
    env = {}
    if not platform.cluster_dns:
        # No cluster DNS here: the sidecars dial the leader replica's claim port by its
        # pod IP instead of the Service name the manifests give (docs/install.md).
        pod = next(p for p in k.operator_pods() if leader.startswith(p.metadata.name))
        env["AGENTQ_OPERATOR_URL"] = f"http://{pod.status.pod_ip}:8444"
    agents: list[dict[str, Any]] = []
    for worker in WORKERS:
        agents += agent_objects(
            platform.kubectl,
            worker=worker,
            namespace=POOL,
            image=platform.image,
            env={**env, "AGENTQ_CAPABILITIES": "llm", "AGENTQ_MAX_IN_FLIGHT": str(SLOTS)},
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
        worker=HOLDER,
        namespace=POOL,
        image=platform.image,
        env={**env, "AGENTQ_CAPABILITIES": "hold", "AGENTQ_MAX_IN_FLIGHT": "1"},
        agent_args=["agent-sim", "--behaviour", "hold"],
    )
    k.apply(agents)
    for worker in (*WORKERS, HOLDER):
        k.kubectl("-n", POOL, "rollout", "status", f"deploy/agent-{worker}", "--timeout=300s")
    for worker in (*WORKERS, HOLDER):
        wait_for(f"worker {worker} Ready", lambda w=worker: k.worker_phase(w) == "Ready", 120)
    say(f"queues {', '.join(TEAMS)} (weight 1 each) over {POOL}: workers {WORKERS} Ready")

    # -- a queue the namespace is not selected by --------------------------------------
    k.kubectl(
        "apply", "-f", "-",
        input=to_yaml([team_task("team-b", "wrong-queue", "team-a", payload={"p": SECRET_B})]),
    )  # fmt: skip

    def forbidden() -> dict[str, Any] | None:
        (t,) = [t for t in k.tasks("team-b") if t["metadata"]["name"] == "wrong-queue"]
        return t if condition(t, "Queued") == ("False", "QueueForbidden") else None

    wait_for("team-b's task on team-a's queue to be refused", forbidden, 60, every=0.5)
    say("team-b's task naming queue team-a: Queued=False, QueueForbidden")

    isolation(k, env)

    # -- the late team's share -----------------------------------------------------------
    load_started = time.monotonic()
    k.kubectl(
        "apply", "-f", "-",
        input=to_yaml([
            team_task("team-a", f"a-{i:03d}", "team-a", payload={"n": i})
            for i in range(A_TASKS)
        ]),
    )  # fmt: skip
    say(f"team-a queued {A_TASKS} tasks ({WORK_SECONDS}s of work each)")

    def a_done() -> int:
        return sum(phase(t) == "Succeeded" for t in k.tasks("team-a"))

    wait_for(f"team-a's first {B_AFTER} completions", lambda: a_done() >= B_AFTER, 240, every=0.5)
    k.kubectl(
        "apply", "-f", "-",
        input=to_yaml([
            team_task("team-b", f"b-{i:03d}", "team-b", payload={"n": i})
            for i in range(B_TASKS)
        ]),
    )  # fmt: skip
    say(f"team-b queued {B_TASKS} tasks after team-a's first {B_AFTER} completions")

    def everything() -> list[dict[str, Any]] | None:
        items = [
            t for team in TEAMS for t in k.tasks(team) if t["metadata"]["name"] != "wrong-queue"
        ]
        return items if all(phase(t) == "Succeeded" for t in items) else None

    done = wait_for("every team task to succeed", everything, 600, every=2)
    took = time.monotonic() - load_started
    assert len(done) == A_TASKS + B_TASKS
    say(f"all {len(done)} team tasks Succeeded in {took:.0f}s ({len(done) / took:.1f}/s)")
    share(done)

    # -- the end: no reclaim, no claim Lease, the forbidden task never dispatched --------
    reclaims = {t["metadata"]["name"]: t["status"].get("reclaims", 0) for t in done}
    assert not any(reclaims.values()), {n: r for n, r in reclaims.items() if r}
    assert all(len(t["status"].get("history") or []) <= 1 for t in done)
    for t in done:
        assert (t["status"]["workerNamespace"], t["status"]["worker"][:5]) == (POOL, "pool-")
    wait_for("every claim Lease deleted", lambda: not claim_leases(k, POOL), 60)
    for team in TEAMS:
        assert not claim_leases(k, team), claim_leases(k, team)
    (wrong,) = [t for t in k.tasks("team-b") if t["metadata"]["name"] == "wrong-queue"]
    status = wrong.get("status") or {}
    assert phase(wrong) == "Pending" and not status.get("worker") and not token(wrong), status
    assert condition(wrong, "Queued") == ("False", "QueueForbidden"), status
    say("0 reclaims; no claim Lease left; team-b's task on team-a's queue never dispatched")


def isolation(k: Cluster, env: dict[str, str]) -> None:
    """An agent pod reads no team's task but the one its worker holds, and that one
    only through the operator's claim API with its own token."""
    k.kubectl(
        "apply", "-f", "-",
        input=to_yaml([
            team_task("team-a", "held", "team-a", requiredCapabilities=["hold"],
                      payload={"p": SECRET_A}),
        ]),
    )  # fmt: skip

    def running() -> dict[str, Any] | None:
        (t,) = [t for t in k.tasks("team-a") if t["metadata"]["name"] == "held"]
        return t if phase(t) == "Running" else None

    held = wait_for("team-a's task to run on the holder", running, 120, every=0.5)
    status = held["status"]
    assert (status["workerNamespace"], status["worker"]) == (POOL, HOLDER), status
    lease = status["leaseName"]
    assert lease == "agentq-xtask-team-a.held", lease
    assert lease in claim_leases(k, POOL)

    pod = k.pod_of(WORKERS[0]).metadata.name
    targets = ["team-a/held", "team-a/", "team-b/wrong-queue", "team-b/"]
    for container, token_file in (
        ("sidecar", SA + "token"),
        ("sidecar", OPERATOR_TOKEN),
        ("agent", SA + "token"),
    ):
        found = in_container(k, pod, container, TASK_READS, token_file, SA + "ca.crt", *targets)
        for target in targets:
            say(f"  {pod} {container}, {token_file.split('/')[-2]} token, {target}: "
                f"{found[target][0]} {str(found[target][1])[:120]}")  # fmt: skip
        assert found.pop("a token") == (container == "sidecar"), (container, found)
        problems = judge_task_reads(found, SECRET_A) + judge_task_reads(found, SECRET_B)
        assert not problems, (container, token_file, problems)
        if token_file == SA + "token" and container == "sidecar":
            for target in targets:
                verb = "cannot list" if target.endswith("/") else "cannot get"
                assert found[target][0] == 403 and verb in found[target][1], found[target]
        else:  # no credential the API server takes: anonymous, or a token not for it
            assert all(s in (401, 403) for s, _ in found.values()), found
    say("a pool pod's sidecar and agent containers cannot read either team's AgentTasks")

    url = env.get("AGENTQ_OPERATOR_URL", "http://agentq-operator-claims.agentq-system.svc:8444")
    other = in_container(k, pod, "sidecar", CLAIM_READ, url, OPERATOR_TOKEN, POOL, lease)
    say(f"  {pod}'s sidecar asking the claim API for {HOLDER}'s claim: {other}")
    assert other[0] == 403 and "not yours" in other[1], other
    assert SECRET_A not in str(other)
    anonymous = in_container(k, pod, "agent", CLAIM_READ, url, OPERATOR_TOKEN, POOL, lease)
    say(f"  {pod}'s agent container asking it without a token: {anonymous}")
    assert anonymous[0] == 401 and SECRET_A not in str(anonymous), anonymous
    holder = k.pod_of(HOLDER).metadata.name
    own = in_container(k, holder, "sidecar", CLAIM_READ, url, OPERATOR_TOKEN, POOL, lease)
    assert own[0] == 200 and own[1]["spec"]["payload"] == {"p": SECRET_A}, own
    say(f"another worker's sidecar was refused {HOLDER}'s claim (403); {holder}'s got the task")

    started = time.monotonic()
    k.kubectl(
        "-n", "team-a", "patch", "agenttask", "held", "--type=merge",
        "-p", '{"spec":{"cancel":true}}',
    )  # fmt: skip

    def cancelled() -> dict[str, Any] | None:
        (t,) = [t for t in k.tasks("team-a") if t["metadata"]["name"] == "held"]
        return t if phase(t) == "Cancelled" else None

    wait_for("the held task to be cancelled", cancelled, 60, every=0.5)
    took = time.monotonic() - started
    wait_for("its claim Lease deleted", lambda: lease not in claim_leases(k, POOL), 60)
    # Ended by the holder letting the revoked claim go, not by its 30 s lease running out.
    assert took < 10, f"Cancelled after {took:.1f}s"
    wait_for(
        "the holder's agent to be told",
        lambda: '"revoked"' in k.kubectl("-n", POOL, "logs", holder, "-c", "agent"),
        30,
    )
    k.kubectl("-n", "team-a", "delete", "agenttask", "held")
    say(f"the held task Cancelled after {took:.1f}s (its agent told); its claim Lease deleted")


def share(done: list[dict[str, Any]]) -> None:
    """B's part of the completions while both teams had a backlog: from B's first grant
    to its last (fencing tokens rise with every grant), as in
    tests/integration/test_operator_queues.py; and by the completion times."""

    def is_b(t: dict[str, Any]) -> bool:
        return str(t["metadata"]["name"]).startswith("b-")

    b_tokens = sorted(token(t) for t in done if is_b(t))
    window = [t for t in done if b_tokens[0] <= token(t) <= b_tokens[-1]]
    b_share = sum(map(is_b, window)) / len(window)
    a_after = sum(not is_b(t) and token(t) > b_tokens[-1] for t in done)
    a_before = sum(not is_b(t) and token(t) < b_tokens[0] for t in done)
    # By completion time (whole seconds): the seconds strictly between B's first and
    # last completion.
    b_times = sorted(finished(t) for t in done if is_b(t))
    timed = [t for t in done if b_times[0] < finished(t) < b_times[-1]]
    t_share = sum(map(is_b, timed)) / max(1, len(timed))
    per_team = Counter("b" if is_b(t) else "a" for t in window)
    say(
        f"team-b's share of the completions while both had a backlog: {b_share:.1%} by grant "
        f"order ({dict(per_team)} of {len(window)}; {a_before} of team-a's before, {a_after} "
        f"after), {t_share:.1%} by completion time ({len(timed)} completions in "
        f"{b_times[-1] - b_times[0]:.0f}s)"
    )
    assert a_after > 0, "team-a ran out of work: the window was not a shared backlog"
    assert b_share >= 0.45, (b_share, dict(per_team))
