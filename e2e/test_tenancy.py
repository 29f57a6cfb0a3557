"""Two teams share one agent pool on real pods (docs/tenancy.md; ``make e2e``, a
cluster of its own; conftest.py says where it runs).

1. The install base with the locally built image (2 operator replicas as pods), its
   claim port over TLS as a kustomize user without cert-manager makes it
   (docs/install.md): a CA and a serving certificate for the claim Service's DNS name
   made here, Secret agentq-operator-claims-tls made by hand, the component
   manifests/claim-tls; both replicas say agentq_claim_tls_ready 1.
2. Namespaces team-a and team-b, an AgentQueue each (weight 1, its namespaceSelector
   selecting its own namespace alone), both drawing on the AgentWorkers of a third
   namespace, agent-pool: agent pods from manifests/agent/ with the component
   manifests/agent/claim-tls (agent-sim behind the native sidecar, their
   ServiceAccounts' real tokens, the manifests' RBAC and admission policies; the CA as
   ConfigMap agentq-operator-ca of agent-pool); the sidecars read their team tasks from
   the operator's claim API over TLS, which checks their tokens with a TokenReview.
3. A team cannot use a queue its namespace is not selected by: team-b's task naming
   team-a's queue stays Pending with ``Queued: False``, reason ``QueueForbidden``,
   never dispatched.
4. An agent pod cannot read another team's task: from inside a pool pod, the sidecar's
   API token is refused ``get``/``list`` on team-a's and team-b's AgentTasks (403), its
   claim-API token is no API server token (401), the agent container has no token at
   all (anonymous); another worker's sidecar asking the claim API for a claim it does
   not hold is refused (403), while the holder's own gets the task; a plain HTTP
   request to the claim port gets no HTTP answer.
5. Team A queues 300 tasks, team B 100 after A's first 20 completions: read back from
   the API server (the grant order of the fencing tokens, the completion times), B gets
   >= 45 % of the completions while both have a backlog.
6. Every task Succeeded on its first attempt (0 reclaims); no claim Lease left; the
   sidecars' claim reads were answered 200, none failed TLS.
7. The Secret replaced (a new certificate) while the teams' tasks run: the kubelet
   updates the mounted files, the operator serves the new certificate without a
   restart (agentq_claim_tls_not_after_seconds), verified by a pool pod.
"""

from __future__ import annotations

import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from certs import SERVICE_NAME, Ca
from manifests import MANIFESTS, agent_objects, overlay, to_yaml
from nodetools import Platform, wait_for
from podchecks import CLAIM_READ, FETCH, TASK_READS, judge_task_reads, metric
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
OPERATOR_CA = "/var/run/secrets/agentq.dev/operator/ca.crt"  # manifests/agent/claim-tls
CLAIMS_SECRET = "agentq-operator-claims-tls"  # manifests/claim-tls
KEY_FILE_STAT = r"""
import json, os
s = os.stat("/var/run/secrets/agentq.dev/claims-tls/tls.key")
print(json.dumps([s.st_uid, s.st_gid, oct(s.st_mode & 0o777)]))
"""  # the mounted key's owner, group and mode, seen from the operator container
ROTATION_SECONDS = 150  # the kubelet's sync of a mounted Secret (~60-90 s), and a reload
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


def tls_secret(k: Cluster, ca: Ca, directory: Path, not_after: datetime) -> None:
    """Secret agentq-operator-claims-tls made (or replaced) by hand as docs/install.md
    says: a serving certificate of ``ca`` for the claim Service's DNS name alone."""
    cert, key = ca.serving((SERVICE_NAME,), not_after=not_after)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "tls.crt").write_bytes(cert)
    (directory / "tls.key").write_bytes(key)
    made = k.kubectl(
        "-n", "agentq-system", "create", "secret", "tls", CLAIMS_SECRET,
        f"--cert={directory / 'tls.crt'}", f"--key={directory / 'tls.key'}",
        "--dry-run=client", "-o", "yaml",
    )  # fmt: skip
    k.kubectl("apply", "-f", "-", input=made)


def scrape(k: Cluster, pod: str, container: str, url: str, namespace: str) -> str:
    """A pod's metrics, read from inside its container."""
    status, body = in_container(k, pod, container, FETCH, url, namespace=namespace)
    assert status == 200, (pod, status, body)
    return str(body)


def operator_tls(k: Cluster) -> dict[str, tuple[float, float]]:
    """Per operator pod: (agentq_claim_tls_ready, agentq_claim_tls_not_after_seconds)."""
    found = {}
    for pod in k.operator_pods():
        name = pod.metadata.name
        text = scrape(k, name, "operator", "http://127.0.0.1:8080/metrics", "agentq-system")
        ready = metric(text, "agentq_claim_tls_ready") or [-1.0]
        expiry = metric(text, "agentq_claim_tls_not_after_seconds") or [-1.0]
        found[name] = (ready[0], expiry[0])
    return found


def serving(k: Cluster, expiry: datetime) -> dict[str, tuple[float, float]] | None:
    """operator_tls() once every replica serves the certificate expiring at ``expiry``."""
    found = operator_tls(k)
    return found if all(v == (1, expiry.timestamp()) for v in found.values()) else None


def claim_leases(k: Cluster, namespace: str) -> list[str]:
    return sorted(
        lease.metadata.name
        for lease in k.leases.list_namespaced_lease(namespace).items
        if lease.metadata.name.startswith(("agentq-xtask-", "agentq-task-"))
    )


@pytest.mark.timeout(1200)
def test_two_teams_share_one_pool_on_real_pods(platform: Platform, tmp_path: Path) -> None:
    global _started
    _started = time.monotonic()
    k = Cluster(platform, POOL)
    # -- the claim port's certificate, by hand (docs/install.md, "TLS on the claim port")
    ca = Ca.make("agentq-e2e-claims-ca")
    (tmp_path / "ca.crt").write_bytes(ca.pem)
    now = datetime.now(UTC).replace(microsecond=0)
    first, second = now + timedelta(days=7), now + timedelta(days=8)
    k.kubectl("create", "namespace", "agentq-system")
    tls_secret(k, ca, tmp_path / "first", first)
    leader = install(k, say, overlay(tmp_path / "install", MANIFESTS, MANIFESTS / "claim-tls"))
    served = wait_for("both operator replicas to serve TLS", lambda: serving(k, first), 60)
    key_file = in_container(
        k, k.operator_pods()[0].metadata.name, "operator", KEY_FILE_STAT, namespace="agentq-system"
    )
    assert key_file[1] == 65532 and key_file[2] == "0o440", key_file  # the pod's fsGroup
    say(f"Secret {CLAIMS_SECRET} made by hand, for {SERVICE_NAME}; agentq_claim_tls_ready "
        f"and the certificate's expiry per replica: {served}; the key file's uid, gid, "
        f"mode: {key_file}")  # fmt: skip

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
            {  # the CA the pool's sidecars trust (manifests/agent/claim-tls), by hand
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": "agentq-operator-ca", "namespace": POOL},
                "data": {"ca.crt": ca.pem.decode()},
            }
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
    plain = f"http://{SERVICE_NAME}:8444"
    if not platform.cluster_dns:
        # No cluster DNS here: the sidecars dial the leader replica's claim port by its
        # pod IP instead of the Service name the manifests give (docs/install.md); the
        # certificate they check still names the Service alone.
        pod = next(p for p in k.operator_pods() if leader.startswith(p.metadata.name))
        env["AGENTQ_OPERATOR_URL"] = f"https://{pod.status.pod_ip}:8444"
        env["AGENTQ_OPERATOR_SERVER_NAME"] = SERVICE_NAME
        plain = f"http://{pod.status.pod_ip}:8444"
    agent_kustomization = overlay(
        tmp_path / "agent", MANIFESTS / "agent", MANIFESTS / "agent" / "claim-tls"
    )
    agents: list[dict[str, Any]] = []
    for worker in WORKERS:
        agents += agent_objects(
            platform.kubectl,
            worker=worker,
            namespace=POOL,
            directory=agent_kustomization,
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
        directory=agent_kustomization,
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

    # -- the certificate replaced; the kubelet updates the operator pods' files later --
    tls_secret(k, ca, tmp_path / "second", second)
    rotated = time.monotonic()
    say(f"Secret {CLAIMS_SECRET} replaced by a new certificate (expiry {second:%Y-%m-%d})")

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

    isolation(k, env, plain)

    # -- the late team's share -----------------------------------------------------------
    load_started = time.monotonic()

    def queue(team: str, count: int) -> None:
        tasks = [
            team_task(team, f"{team[-1]}-{i:03d}", team, payload={"n": i}) for i in range(count)
        ]
        k.kubectl("apply", "-f", "-", input=to_yaml(tasks))

    queue("team-a", A_TASKS)
    say(f"team-a queued {A_TASKS} tasks ({WORK_SECONDS}s of work each)")

    def a_done() -> int:
        return sum(phase(t) == "Succeeded" for t in k.tasks("team-a"))

    wait_for(f"team-a's first {B_AFTER} completions", lambda: a_done() >= B_AFTER, 240, every=0.5)
    queue("team-b", B_TASKS)
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

    # -- every claim read over TLS -------------------------------------------------------
    reads: Counter[str] = Counter()
    for worker in (*WORKERS, HOLDER):
        text = scrape(k, k.pod_of(worker).metadata.name, "sidecar",
                      "http://127.0.0.1:8701/metrics", POOL)  # fmt: skip
        for code in ("200", "tls", "error", "403", "404", "410"):
            reads[code] += sum(metric(text, "agentq_sidecar_claim_reads_total", code=code))
    say(f"the sidecars' claim reads by answer: {dict(reads)}")
    assert reads["200"] >= A_TASKS + B_TASKS + 1, reads  # the held one too
    assert reads["tls"] == 0 and reads["error"] == 0, reads

    # -- the replaced certificate served without a restart --------------------------------
    served = wait_for(
        "the operators to serve the replaced certificate", lambda: serving(k, second),
        max(5.0, ROTATION_SECONDS - (time.monotonic() - rotated)), every=2,
    )  # fmt: skip
    took = time.monotonic() - rotated
    for pod in k.operator_pods():
        assert pod.status.container_statuses[0].restart_count == 0, pod.metadata.name
    pool_pod = k.pod_of(WORKERS[0]).metadata.name
    url = env.get("AGENTQ_OPERATOR_URL", f"https://{SERVICE_NAME}:8444")
    after = in_container(k, pool_pod, "sidecar", CLAIM_READ, url, OPERATOR_TOKEN, POOL,
                         "agentq-xtask-team-a.none", OPERATOR_CA, SERVICE_NAME)  # fmt: skip
    assert after[0] in (403, 404), after  # an HTTP answer: the new certificate verified
    say(f"the replaced certificate served by both replicas {took:.0f}s after the Secret's "
        f"update, no restart: {served}; {pool_pod}'s claim read then: {after}")  # fmt: skip


def isolation(k: Cluster, env: dict[str, str], plain: str) -> None:
    """An agent pod reads no team's task but the one its worker holds, and that one
    only through the operator's claim API over TLS with its own token; the claim port
    gives no plain HTTP answer (``plain``: its http:// URL)."""
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

    url = env.get("AGENTQ_OPERATOR_URL", f"https://{SERVICE_NAME}:8444")
    tls = (OPERATOR_CA, SERVICE_NAME)  # the sidecar's CA bundle and the name it checks
    claim = (CLAIM_READ, url, OPERATOR_TOKEN, POOL, lease)
    other = in_container(k, pod, "sidecar", *claim, *tls)
    say(f"  {pod}'s sidecar asking the claim API for {HOLDER}'s claim: {other}")
    assert other[0] == 403 and "not yours" in other[1], other
    assert SECRET_A not in str(other)
    # The agent container has no CA bundle (nor token): it asks without verifying.
    anonymous = in_container(k, pod, "agent", *claim, "", SERVICE_NAME)
    say(f"  {pod}'s agent container asking it without a token: {anonymous}")
    assert anonymous[0] == 401 and SECRET_A not in str(anonymous), anonymous
    holder = k.pod_of(HOLDER).metadata.name
    own = in_container(k, holder, "sidecar", *claim, *tls)
    assert own[0] == 200 and own[1]["spec"]["payload"] == {"p": SECRET_A}, own
    say(f"another worker's sidecar was refused {HOLDER}'s claim (403); {holder}'s got the task")
    cleartext = in_container(k, holder, "sidecar", CLAIM_READ, plain, OPERATOR_TOKEN, POOL, lease)
    say(f"  {holder}'s sidecar asking {plain} in plain HTTP: {cleartext}")
    assert cleartext[0] == 0 and SECRET_A not in str(cleartext), cleartext

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
