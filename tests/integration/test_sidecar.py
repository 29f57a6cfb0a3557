"""The agent's side of the contract, under real faults: sidecar + agent-sim pairs (real
processes) against the real API server and operator, writing to a fenced sink.

The property the seed is about, proven at the sink: at most one attempt's output
becomes visible, even when two attempts ran (a frozen agent, a frozen sidecar).
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from agentq import protocol
from agentq.fencing import open_store
from builders import task, worker
from fleet import AgentPair, Fleet, Process
from nodetools import wait_for

LEASE = 3


def sidecar_status(pair: AgentPair) -> dict[str, Any]:
    return pair.client(timeout=5).request("GET", "/v1/status")


def wait_event(
    proc: Process, predicate: Callable[[dict[str, Any]], bool], *, timeout: float, what: str
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        for event in proc.events():
            if predicate(event):
                return event
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not in {proc.log.name} after {timeout}s:\n{proc.text()}")
        time.sleep(0.1)


def wait_ready(fleet: Fleet, *names: str, timeout: float = 30) -> None:
    fleet.wait_all(
        lambda _: all(fleet.worker(n).get("status", {}).get("phase") == "Ready" for n in names),
        timeout=timeout,
    )


def sink_rows(url: str) -> dict[str, Any]:
    with open_store(url) as store:
        return {r.key: r for r in store.records()}


def test_agents_behind_sidecars_complete_tasks_with_one_sink_row_each(
    fleet: Fleet, tmp_path: Path
) -> None:
    sink = f"sqlite://{tmp_path / 'sink.db'}"
    for name in ("a", "b"):
        fleet.add_worker(worker(name).capabilities("llm").max_in_flight(3))
        fleet.agent(name, "complete", sink=sink, work_seconds=0.3)
    fleet.operator()
    # Both Ready before the tasks come: else a slow sidecar start (a loaded machine) lets
    # the first worker finish all eight and the last assertion reads a false unfairness.
    wait_ready(fleet, "a", "b")
    names = [f"t{i}" for i in range(8)]
    for i, name in enumerate(names):
        fleet.add_task(task(name).requires("llm").payload({"n": i}))
    items = fleet.wait_all(
        lambda items: all((t.get("status") or {}).get("phase") == "Succeeded" for t in items),
        timeout=90,
    )
    rows = sink_rows(sink)
    assert sorted(rows) == names
    for item in items:
        name, status = item["metadata"]["name"], item["status"]
        assert status["attempt"] == 1 and status["reclaims"] == 0
        assert status["result"] == {"by": status["worker"]}
        assert status["resultRef"].startswith("sqlite://") and status["resultRef"].endswith(name)
        row = rows[name]
        # The one row is the attempt the operator committed: same token, same worker.
        assert row.token == status["fencingToken"]
        assert row.value["by"] == status["worker"]
        assert row.value["payload"] == item["spec"]["payload"]  # the agent got its payload
        assert row.revision == 2  # fenced at the start, written at the end: nothing else
    assert {i["status"]["worker"] for i in items} == {"a", "b"}


def test_a_killed_agent_loses_its_task_which_another_worker_completes_once(
    fleet: Fleet, tmp_path: Path
) -> None:
    sink = f"sqlite://{tmp_path / 'sink.db'}"
    fleet.add_worker(worker("a").capabilities("llm"))
    pair_a = fleet.agent("a", "complete", sink=sink, work_seconds=30)
    fleet.operator()
    fleet.add_task(task("job").requires("llm").lease(LEASE).backoff(initial=0))
    first = fleet.wait_phase("job", "Running")["status"]
    assert first["worker"] == "a"
    fleet.add_worker(worker("b").capabilities("llm"))
    pair_b = fleet.agent("b", "complete", sink=sink, work_seconds=0.3)
    wait_ready(fleet, "b")

    pair_a.agent.kill()  # the agent dies; its sidecar lives on and must stop renewing
    done = fleet.wait_phase("job", "Succeeded", timeout=LEASE + 20)["status"]
    assert done["worker"] == "b" and done["attempt"] == 2 and done["reclaims"] == 1
    assert done["history"][0]["worker"] == "a"
    assert done["history"][0]["reason"] == "LeaseExpired"
    assert done["fencingToken"] > first["fencingToken"]
    assert pair_a.sidecar.popen.poll() is None  # the sidecar is fine; it just stopped renewing
    rows = sink_rows(sink)
    assert list(rows) == ["job"]
    assert rows["job"].token == done["fencingToken"] and rows["job"].value["by"] == "b"

    def reported() -> list[tuple[str, int]]:
        pairs = (pair_a, pair_b)
        return [
            (e["task"], e["token"])
            for p in pairs
            for e in p.agent.events()
            if e["event"] == "reported"
        ]

    # The operator commits from the sidecar's report on the Lease, possibly before the
    # agent has logged the sidecar's answer: wait for b's line (a's never comes).
    deadline = time.monotonic() + 10
    while not reported() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert reported() == [("job", done["fencingToken"])]


@pytest.mark.parametrize("frozen", ["agent", "sidecar"])
def test_a_frozen_attempt_wakes_up_fenced_at_the_sidecar_and_at_the_sink(
    fleet: Fleet, tmp_path: Path, frozen: str
) -> None:
    """The Celery case (a worker frozen mid-task, resumed later): with agentq the zombie's
    complete gets 409 and its sink write raises StaleTokenError; one output is visible."""
    sink = f"sqlite://{tmp_path / 'sink.db'}"
    fleet.add_worker(worker("a").capabilities("llm"))
    # Long enough that the zombie's work ends after its sidecar is awake again.
    pair_a = fleet.agent("a", "complete", sink=sink, work_seconds=15)
    fleet.operator()
    fleet.add_task(task("job").requires("llm").lease(LEASE).backoff(initial=0))
    first = fleet.wait_phase("job", "Running")["status"]
    assert first["worker"] == "a"
    wait_event(pair_a.agent, lambda e: e["event"] == "sink-fenced", timeout=10, what="a started")
    fleet.add_worker(worker("b").capabilities("llm"))
    pair_b = fleet.agent("b", "complete", sink=sink, work_seconds=0.3)
    wait_ready(fleet, "b")

    target = pair_a.agent if frozen == "agent" else pair_a.sidecar
    lease_before = fleet.task_lease("job")
    target.signal(signal.SIGSTOP)
    try:
        done = fleet.wait_phase("job", "Succeeded", timeout=LEASE + 20)["status"]
    finally:
        target.signal(signal.SIGCONT)
    # a's sidecar lives and keeps a Ready, so a retry may go back to a (whose frozen agent
    # cannot take it) before it reaches b: every attempt before b's expired.
    assert done["worker"] == "b" and done["attempt"] >= 2
    earlier = [h for h in done["history"] if h["token"] != done["fencingToken"]]
    assert len(earlier) == done["attempt"] - 1, done["history"]
    assert {(h["worker"], h["reason"]) for h in earlier} == {("a", "LeaseExpired")}
    assert lease_before is not None
    assert protocol.lease_token(lease_before.metadata.annotations) == first["fencingToken"]

    # The zombie wakes up, finishes its work and tries to publish it: refused twice.
    refused = wait_event(
        pair_a.agent, lambda e: e["event"] == "sink-refused", timeout=30, what="sink refusal"
    )
    assert refused["token"] == first["fencingToken"]
    assert refused["highest"] == done["fencingToken"]
    lost = wait_event(pair_a.agent, lambda e: e["event"] == "lost", timeout=30, what="409")
    assert lost["token"] == first["fencingToken"]
    assert "409" in lost["why"], lost
    assert not [e for e in pair_a.agent.events() if e["event"] == "reported"]

    # Exactly one attempt's output is visible: b's, with the committed token.
    rows = sink_rows(sink)
    assert list(rows) == ["job"]
    assert rows["job"].token == done["fencingToken"]
    assert rows["job"].value["by"] == "b" and rows["job"].value["token"] == done["fencingToken"]
    final = fleet.task("job")["status"]
    assert final["phase"] == "Succeeded" and final["result"] == {"by": "b"}
    # The zombie was stopped at its sidecar: the operator never even saw its report.
    # (The operator may refuse b's own report once more after committing it, a race
    # between its Lease delete and its watch; that is not the zombie's.)
    refusals = [e.message for e in fleet.events("job") if e.reason == "StaleReportRefused"]
    assert not [m for m in refusals if f"with token {first['fencingToken']}" in m], refusals
    assert pair_b.agent.popen.poll() is None


def test_a_task_longer_than_its_lease_keeps_one_attempt_while_the_agent_beats(
    fleet: Fleet, tmp_path: Path
) -> None:
    sink = f"sqlite://{tmp_path / 'sink.db'}"
    fleet.add_worker(worker("a").capabilities("llm"))
    fleet.add_worker(worker("b").capabilities("llm"))
    pair = fleet.agent("a", "complete", sink=sink, work_seconds=4 * LEASE)
    fleet.agent("b", "complete", sink=sink, work_seconds=0.2)
    fleet.operator()
    fleet.add_task(task("long").requires("llm").lease(LEASE))
    done = fleet.wait_phase("long", "Succeeded", timeout=4 * LEASE + 30)["status"]
    assert done["attempt"] == 1 and done["reclaims"] == 0
    assert "LeaseExpired" not in fleet.reasons("long")
    rows = sink_rows(sink)
    assert rows["long"].token == done["fencingToken"] and rows["long"].value["by"] == done["worker"]
    holder = pair if done["worker"] == "a" else None
    if holder is not None:
        status = sidecar_status(holder)
        # Renewed every heartbeat interval (1 s) for 12 s, and one API request each.
        assert status["renewals"] >= 4 * LEASE // 2, status
        assert status["renewalRequests"] == status["renewals"], status


def test_beating_without_progress_is_reclaimed_by_the_progress_deadline(fleet: Fleet) -> None:
    fleet.add_worker(worker("a").capabilities("llm"))
    pair = fleet.agent("a", "stuck")  # beats (so the sidecar renews), progress never moves
    fleet.operator()
    fleet.add_task(task("job").requires("llm").lease(LEASE).progress_deadline(4).max_reclaims(0))
    done = fleet.wait_phase("job", "DeadLettered", timeout=30)["status"]
    assert done["history"][-1]["reason"] == "ProgressDeadlineExceeded"
    assert "LeaseExpired" not in fleet.reasons("job")  # the lease itself was kept alive
    assert sidecar_status(pair)["renewals"] >= 2


def test_sigterm_releases_the_worker_lease_and_reports_nothing(fleet: Fleet) -> None:
    fleet.add_worker(worker("a").capabilities("llm"))
    pair = fleet.agent("a", "hold", worker_lease_seconds=15)
    fleet.operator()
    fleet.add_task(task("job").requires("llm").lease(LEASE).max_reclaims(0))
    fleet.wait_phase("job", "Running")
    wait_ready(fleet, "a")

    pair.agent.kill()  # the agent has gone (a pod's main container exits first)
    started = time.monotonic()
    pair.sidecar.signal(signal.SIGTERM)
    pair.sidecar.popen.wait(timeout=10)
    took = time.monotonic() - started
    assert pair.sidecar.popen.returncode == 0, pair.sidecar.text()
    assert took < 5 + 1, took  # --shutdown-seconds 5, well inside a pod's grace period
    lease = fleet.leases.read_namespaced_lease(protocol.worker_lease_name("a"), fleet.namespace)
    assert not lease.spec.holder_identity  # released, not left to run out (15 s)
    # NotReady long before the 15 s worker lease would have run out.
    fleet.wait_all(
        lambda _: fleet.worker("a").get("status", {}).get("phase") == "NotReady", timeout=8
    )
    assert time.monotonic() - started < 15
    # Nothing was reported on the agent's behalf: the claim simply runs out.
    done = fleet.wait_phase("job", "DeadLettered", timeout=LEASE + 15)["status"]
    assert done["history"][-1]["reason"] == "LeaseExpired"
    assert "result" not in done


def test_a_second_sidecar_for_the_worker_waits_and_never_serves_the_old_pods_tokens(
    fleet: Fleet,
) -> None:
    fleet.add_worker(worker("a").capabilities("llm"))
    old = fleet.agent("a", "hold", identity="a-pod-1")
    fleet.operator()
    fleet.add_task(task("job").requires("llm").lease(LEASE).backoff(initial=0))
    first = fleet.wait_phase("job", "Running")["status"]
    new = fleet.agent("a", "complete", identity="a-pod-2", work_seconds=0.2)
    new.wait_serving()
    time.sleep(2)
    assert "held by a-pod-1" in sidecar_status(new)["workerLease"]  # it waits its turn

    old.kill()  # the old pod dies without a goodbye; its agent might be a zombie
    done = fleet.wait_phase("job", "Succeeded", timeout=30)["status"]
    # The new pod took the worker Lease over, left the old pod's attempt to expire (its
    # agent may still be running with that token), and served only the new grant.
    assert done["attempt"] == 2 and done["history"][0]["reason"] == "LeaseExpired"
    tokens = [e["token"] for e in new.agent.events() if e["event"] == "assigned"]
    assert tokens == [done["fencingToken"]]
    assert first["fencingToken"] not in tokens


def test_the_sidecar_registers_and_updates_its_agent_worker_from_flags(fleet: Fleet) -> None:
    pair = fleet.agent("reg", "complete", capabilities="llm,gpu", max_in_flight=3, work_seconds=0.1)
    fleet.wait_all(lambda _: _worker_spec(fleet, "reg") is not None, timeout=30)
    spec = _worker_spec(fleet, "reg")
    assert spec is not None
    assert sorted(spec["capabilities"]) == ["gpu", "llm"] and spec["maxInFlight"] == 3
    fleet.operator()
    fleet.add_task(task("job").requires("gpu"))
    assert fleet.wait_phase("job", "Succeeded", timeout=30)["status"]["worker"] == "reg"
    pair.stop()
    fleet.agent("reg", "complete", capabilities="llm", weight=2.5, max_in_flight=3)
    fleet.wait_all(lambda _: (_worker_spec(fleet, "reg") or {}).get("weight") == 2.5, timeout=30)
    assert _worker_spec(fleet, "reg")["capabilities"] == ["llm"]  # type: ignore[index]


def test_the_worker_lease_goes_with_the_agent_worker_it_registered(fleet: Fleet) -> None:
    """The worker Lease is owned by the AgentWorker its sidecar registered: the garbage
    collector deletes it with the worker (an autoscaled pool's pod gone, the CRDs after
    an uninstall), where a released Lease was left behind for good (issue 22)."""
    pair = fleet.agent("owned", "complete", capabilities="llm", work_seconds=0.1)
    name = protocol.worker_lease_name("owned")

    def owners() -> list[tuple[str, str, str]] | None:
        try:
            lease = fleet.leases.read_namespaced_lease(name, fleet.namespace)
        except client.ApiException as err:
            if err.status == 404:
                return None
            raise
        return [(r.kind, r.name, r.uid) for r in lease.metadata.owner_references or []]

    wait_for("the worker Lease owned", owners, 30)
    uid = fleet.worker("owned")["metadata"]["uid"]
    assert owners() == [("AgentWorker", "owned", uid)]
    pair.stop()  # released, not deleted: the worker's next pod takes it over
    lease = fleet.leases.read_namespaced_lease(name, fleet.namespace)
    assert not lease.spec.holder_identity
    assert owners() == [("AgentWorker", "owned", uid)]
    fleet.custom.delete_namespaced_custom_object(
        "agentq.dev", "v1alpha1", fleet.namespace, "agentworkers", "owned"
    )
    wait_for("the garbage collector to delete the Lease", lambda: owners() is None, 60)


def _worker_spec(fleet: Fleet, name: str) -> dict[str, Any] | None:
    try:
        spec: dict[str, Any] = fleet.worker(name)["spec"]
        return spec
    except Exception:
        return None


def test_bad_flags_are_refused_before_anything_starts(fleet: Fleet) -> None:
    import subprocess

    from fleet import AGENTQ

    for flags, expected in (
        (["--capabilities", "GPU"], "capabilities"),
        (["--weight", "2"], "--capabilities"),
        (["--listen", "nowhere"], "HOST:PORT"),
    ):
        done = subprocess.run(
            [AGENTQ, "sidecar", "--worker", "w", "--namespace", fleet.namespace, *flags],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "KUBECONFIG": fleet.kubeconfig},
            check=False,
        )
        assert done.returncode == 2, (flags, done.stdout, done.stderr)
        assert expected in done.stderr, (flags, done.stderr)


SIDECAR_ROLE = """
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: agentq-sidecar}
rules:
  - apiGroups: [coordination.k8s.io]
    resources: [leases]
    verbs: [get, list, watch, create, update]
  - apiGroups: [agentq.dev]
    resources: [agenttasks]
    verbs: [get]
  - apiGroups: [agentq.dev]
    resources: [agentworkers]
    verbs: [get, create, patch]
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: agent}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: agentq-sidecar}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: agentq-sidecar}
subjects: [{kind: ServiceAccount, name: agent}]
"""


def test_the_sidecar_works_with_a_service_account_token_and_the_documented_rbac(
    fleet: Fleet, tmp_path: Path
) -> None:
    import subprocess

    import yaml

    subprocess.run(
        [fleet.kubectl_path, "-n", fleet.namespace, "apply", "-f", "-"],
        input=SIDECAR_ROLE,
        text=True,
        check=True,
        capture_output=True,
        env={**os.environ, "KUBECONFIG": fleet.kubeconfig},
    )
    token = fleet.kubectl("create", "token", "agent", "--duration=1h").strip()
    admin = yaml.safe_load(Path(fleet.kubeconfig).read_text())
    cluster = admin["clusters"][0]
    kubeconfig = tmp_path / "agent-kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [cluster],
                "users": [{"name": "agent", "user": {"token": token}}],
                "contexts": [
                    {"name": "agent", "context": {"cluster": cluster["name"], "user": "agent"}}
                ],
                "current-context": "agent",
            }
        )
    )
    pair = fleet.agent(
        "sa", "complete", kubeconfig=str(kubeconfig), capabilities="llm", work_seconds=0.1
    )
    fleet.operator()
    fleet.wait_all(lambda _: _worker_spec(fleet, "sa") is not None, timeout=30)
    fleet.add_task(task("job").requires("llm"))
    done = fleet.wait_phase("job", "Succeeded", timeout=40)["status"]
    assert done["worker"] == "sa" and done["result"] == {"by": "sa"}
    # A refusal as the sidecar logs one ("403: ... is forbidden", "401: Unauthorized"),
    # not any "403": a timestamp's milliseconds or a resourceVersion may read so.
    refusal = re.compile(r"\b40[13]: |forbidden|unauthorized", re.IGNORECASE)
    refused = [line for line in _said(pair.sidecar) if refusal.search(line)]
    assert not refused, refused


def _said(process: Process) -> list[str]:
    """A process's log lines without their timestamps."""
    lines = []
    for line in process.text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            lines.append(line)  # a traceback, say
            continue
        record.pop("time", None)
        lines.append(json.dumps(record))
    return lines
