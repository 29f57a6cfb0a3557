"""Liveness on the real API server: no object, report or Lease edit can crash the operator,
stop it serving other tasks, or leave a task without a terminal path (issue 10).

Each test also shows the operator still serving a good task afterwards. Decisions about
what a holder writes (reports and progress markers too long for status, stale reports)
are tests/unit/operator/test_report_limits.py's, with their real-process cases in the
bad-input corpus. Run with
``AGENTQ_TEST_OPERATOR_SRC=<a checkout of the old tree>`` to watch them fail before the fixes.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
import urllib.request
from typing import Any

import pytest
from kubernetes.client.rest import ApiException

from agentq import GROUP, VERSION, protocol
from agentq.controlplane.cluster import free_port
from builders import task, worker
from fleet import Fleet

LEASE = 3


def status(fleet: Fleet, name: str) -> dict[str, Any]:
    got: dict[str, Any] = fleet.task(name).get("status") or {}
    return got


def condition(fleet: Fleet, name: str, kind: str) -> dict[str, Any] | None:
    return next((c for c in status(fleet, name).get("conditions") or [] if c["type"] == kind), None)


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as rsp:
        text: str = rsp.read().decode()
    return text


def apply_json(fleet: Fleet, text: str) -> None:
    """kubectl apply of a JSON manifest (Python's json cannot even write one 3,000 deep)."""
    done = subprocess.run(
        [fleet.kubectl_path, "-n", fleet.namespace, "apply", "-f", "-"],
        input=text,
        capture_output=True,
        text=True,
        timeout=60,
        # HOME: kubectl keeps a cache there, which must not land in the working tree.
        env={"KUBECONFIG": fleet.kubeconfig, "PATH": "/usr/bin:/bin", "HOME": str(fleet.workdir)},
        check=False,
    )
    assert done.returncode == 0, done.stderr


def kubectl_status(fleet: Fleet, name: str) -> dict[str, Any]:
    out = fleet.kubectl("get", "agenttask", name, "-o", "jsonpath={.status}")
    got: dict[str, Any] = json.loads(out) if out.strip() else {}
    return got


def good_worker(fleet: Fleet) -> None:
    """A worker (and an agent that completes) for the good task each test ends with."""
    fleet.add_worker(worker("ok").capabilities("good").max_in_flight(4))
    fleet.agent("ok", "complete", work_seconds=0.2)


def serves_a_good_task(fleet: Fleet, name: str = "good") -> None:
    fleet.add_task(task(name).requires("good"))
    fleet.wait_phase(name, "Succeeded", timeout=30)


def lease_annotations(fleet: Fleet, name: str, values: dict[str, str | None]) -> None:
    """Write annotations on a task's Lease as a raw holder would (no library checks)."""
    fleet.leases.patch_namespaced_lease(
        protocol.task_lease_name(name), fleet.namespace, {"metadata": {"annotations": values}}
    )


@pytest.mark.parametrize("depth", [500, 3000])
def test_a_payload_nested_deeply_is_unprocessable_and_the_operator_goes_on(
    fleet: Fleet, depth: int
) -> None:
    fleet.add_worker(worker("a").capabilities("llm").max_in_flight(4))
    fleet.agent("a", "complete", work_seconds=0.2)
    port = free_port()
    good_worker(fleet)
    operator = fleet.operator("--metrics-port", str(port))
    payload = '{"a":' * depth + "1" + "}" * depth
    apply_json(
        fleet,
        '{"apiVersion":"agentq.dev/v1alpha1","kind":"AgentTask",'
        f'"metadata":{{"name":"deep"}},"spec":{{"requiredCapabilities":["llm"],'
        f'"payload":{payload}}}}}',
    )
    # Read through kubectl: this test process' own JSON decoder cannot read the object.
    deadline = time.monotonic() + 30
    while (failed := kubectl_status(fleet, "deep")).get("phase") != "Failed":
        assert time.monotonic() < deadline, (failed, fleet.logs())
        time.sleep(0.3)
    assert failed["error"]["reason"] == "PayloadTooDeep"
    unprocessable = next(c for c in failed["conditions"] if c["type"] == "Unprocessable")
    assert unprocessable["status"] == "True"
    fleet.wait_reasons("deep", {"Unprocessable": 1})
    serves_a_good_task(fleet)
    assert operator.popen.poll() is None, "the operator exited"
    assert 'agentq_unprocessable_total{kind="AgentTask",reason="PayloadTooDeep"} 1.0' in scrape(
        port
    )
    assert "RecursionError" not in operator.text()


@pytest.mark.parametrize(
    ("size", "reason"), [(300_000, "PayloadTooLarge"), (1_450_000, "ObjectTooLarge")]
)
def test_a_task_too_large_to_grant_is_unprocessable_not_pending_forever(
    fleet: Fleet, size: int, reason: str
) -> None:
    """A 1.45 MB payload is accepted by the API server, but no grant of it fits etcd."""
    fleet.add_worker(worker("a").capabilities("llm").max_in_flight(4))
    fleet.agent("a", "complete", work_seconds=0.2)
    good_worker(fleet)
    operator = fleet.operator()
    big = task("big").requires("llm").payload({"blob": "x" * size})
    fleet.add_task(big)
    failed = fleet.wait_phase("big", "Failed", timeout=30)["status"]
    assert failed["error"]["reason"] == reason
    serves_a_good_task(fleet)
    errors = [line for line in operator.text().splitlines() if '"level": "ERROR"' in line]
    assert len(errors) <= 2, errors


def near_the_limit(fleet: Fleet, name: str, size: int) -> dict[str, Any]:
    return task(name).requires("llm").namespace(fleet.namespace).payload({"blob": "x" * size}).obj()


def test_a_task_near_etcds_limit_ends_failed_and_one_at_it_says_so(fleet: Fleet) -> None:
    """etcd takes the object but not the ObjectTooLarge status beside it: within a few
    hundred bytes of its request limit the task stayed Pending for good, an event every
    10 minutes. It now ends Failed / ObjectTooLarge in a smaller write. At the limit itself
    no write of any kind fits (the API server already drops managedFields to make room): an
    event and a metric say so, once, and the others are served (docs/operator.md, "Known
    limits")."""
    fleet.add_worker(worker("a").capabilities("llm").max_in_flight(4))
    fleet.agent("a", "complete", work_seconds=0.2)
    good_worker(fleet)
    # Names of one length: etcd counts the key, so the same payload fits each or none.
    top = fleet.largest_creatable(lambda n: near_the_limit(fleet, "probe", n), 1_560_000, 1_580_000)
    port = free_port()
    operator = fleet.operator("--metrics-port", str(port))
    fleet.custom.create_namespaced_custom_object(
        GROUP, VERSION, fleet.namespace, "agenttasks", near_the_limit(fleet, "nearl", top - 300)
    )
    failed = fleet.wait_phase("nearl", "Failed", timeout=30)["status"]
    assert failed["error"]["reason"] == "ObjectTooLarge", failed
    fleet.wait_reasons("nearl", {"Unprocessable": 1})
    assert fleet.task_lease("nearl") is None

    fleet.custom.create_namespaced_custom_object(
        GROUP, VERSION, fleet.namespace, "agenttasks", near_the_limit(fleet, "atlim", top)
    )
    fleet.wait_reasons("atlim", {"Unprocessable": 1}, timeout=30)
    said = [e.message for e in fleet.events("atlim") if e.reason == "Unprocessable"]
    assert "cannot be processed" in said[0], said
    assert status(fleet, "atlim").get("phase", "Pending") == "Pending"
    serves_a_good_task(fleet)
    text = scrape(port)
    assert 'agentq_unprocessable_total{kind="AgentTask",reason="ObjectTooLarge"} 1.0' in text
    assert 'agentq_unprocessable_total{kind="AgentTask",reason="Unwritable"} 1.0' in text
    assert len(fleet.events("atlim")) == 1, "said again and again"
    assert operator.popen.poll() is None, "the operator exited"


def test_a_token_edited_by_hand_fails_the_attempt_once_instead_of_wedging(fleet: Fleet) -> None:
    """The Lease's token raised by hand. The other way to tamper (the task's token zeroed)
    is the corpus' and the harness' (test_bad_input_leases.py, test_stays_put.py)."""
    fleet.add_worker(worker("a").capabilities("llm"))
    fleet.agent("a", "hold")
    good_worker(fleet)
    operator = fleet.operator()
    fleet.add_task(task("job").requires("llm").lease(30).max_reclaims(0))
    st = fleet.wait_phase("job", "Running")["status"]
    lease_annotations(fleet, "job", {protocol.ANNOTATION_TOKEN: str(st["fencingToken"] + 10)})
    done = fleet.wait_phase("job", "DeadLettered", timeout=20)["status"]
    assert done["error"]["reason"] == "LeaseTampered"
    serves_a_good_task(fleet)  # passes go on meanwhile (and for minutes: test_stays_put.py)
    assert operator.text().count("LeaseTampered") <= 3, "decided again and again"


def test_a_task_no_worker_can_take_says_so_until_one_can(fleet: Fleet) -> None:
    port = free_port()
    fleet.add_worker(worker("a").capabilities("llm"))
    fleet.agent("a", "complete", work_seconds=0.2)
    fleet.operator("--metrics-port", str(port))
    fleet.add_task(task("quantum-job").requires("llm", "quantum"))
    fleet.wait_condition("quantum-job", "Unschedulable", timeout=20)
    unschedulable = condition(fleet, "quantum-job", "Unschedulable")
    assert unschedulable is not None and "quantum" in unschedulable["message"]
    assert status(fleet, "quantum-job")["phase"] == "Pending"
    fleet.wait_reasons("quantum-job", {"Unschedulable": 1})
    deadline = time.monotonic() + 10
    while f'agentq_unschedulable_tasks{{namespace="{fleet.namespace}"}} 1.0' not in scrape(port):
        assert time.monotonic() < deadline
        time.sleep(0.2)

    fleet.add_worker(worker("q").capabilities("llm", "quantum"))
    fleet.agent("q", "complete", work_seconds=0.2)
    done = fleet.wait_phase("quantum-job", "Succeeded", timeout=30)["status"]
    assert done["worker"] == "q"
    cleared = condition(fleet, "quantum-job", "Unschedulable")
    assert cleared is None or cleared["status"] == "False"


def test_extreme_weights_leave_the_workers_status_finite(fleet: Fleet) -> None:
    """A denormal weight made the deficit infinite and every status write fail; the API
    server now refuses it (the CRD's rule) and the smallest and largest weights it takes
    keep the status finite."""
    with pytest.raises(ApiException, match=r"weight must be at least 0\.001"):
        fleet.add_worker(worker("denormal").capabilities("llm").weight(5e-324))
    fleet.add_worker(worker("tiny").capabilities("llm").weight(0.001).max_in_flight(4))
    fleet.add_worker(worker("huge").capabilities("llm").weight(1000).max_in_flight(4))
    fleet.agent("tiny", "complete", work_seconds=0.2)
    fleet.agent("huge", "complete", work_seconds=0.2)
    fleet.operator()
    for i in range(6):
        fleet.add_task(task(f"t{i}").requires("llm").cost(1000 if i % 2 else 0.001))
    fleet.wait_all(
        lambda items: all((t.get("status") or {}).get("phase") == "Succeeded" for t in items)
    )
    for name in ("tiny", "huge"):
        fleet.wait_all(lambda _, n=name: fleet.worker(n).get("status", {}).get("inFlight") == 0)
        st = fleet.worker(name)["status"]
        assert st["phase"] == "Ready"
        for key in ("deficit", "servedCost", "inFlightCost"):
            assert abs(st[key]) < 1e301, (name, key, st[key])


def ready_condition(fleet: Fleet, name: str) -> dict[str, Any]:
    conditions = fleet.worker(name).get("status", {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == "Ready"), {})


def wait_ready_reason(fleet: Fleet, name: str, reason: str, timeout: float = 40) -> dict:
    deadline = time.monotonic() + timeout
    while (got := ready_condition(fleet, name)).get("reason") != reason:
        assert time.monotonic() < deadline, (name, got, fleet.logs())
        time.sleep(0.2)
    return got


def test_a_workers_ready_condition_says_what_is_missing(fleet: Fleet) -> None:
    fleet.add_worker(worker("nolease").capabilities("llm"))
    fleet.add_worker(worker("unlabelled").capabilities("llm"))
    fleet.add_worker(worker("released").capabilities("llm"))
    fleet.add_worker(worker("stale").capabilities("llm"))
    for name, labels, holder in (
        ("unlabelled", {}, "pod"),
        ("released", {protocol.LABEL_LEASE_KIND: "worker"}, None),
    ):
        fleet.leases.create_namespaced_lease(
            fleet.namespace,
            {
                "metadata": {"name": protocol.worker_lease_name(name), "labels": labels},
                "spec": {"holderIdentity": holder, "leaseDurationSeconds": 10},
            },
        )
    stale = fleet.agent("stale", "hold", worker_lease_seconds=3)
    fleet.operator()
    got = wait_ready_reason(fleet, "nolease", "LeaseMissing")
    assert "agentq-worker-nolease" in got["message"]
    got = wait_ready_reason(fleet, "unlabelled", "LeaseNotLabelled")
    assert "agentq-worker-unlabelled" in got["message"]
    assert "agentq.dev/lease=worker" in got["message"]
    wait_ready_reason(fleet, "released", "LeaseReleased")
    wait_ready_reason(fleet, "stale", "LeaseRenewed")
    stale.kill()
    got = wait_ready_reason(fleet, "stale", "LeaseStale")
    assert fleet.worker("stale")["status"]["phase"] == "NotReady"


def test_a_holder_that_lengthens_its_lease_is_still_reclaimed_by_the_tasks_duration(
    fleet: Fleet,
) -> None:
    fleet.add_worker(worker("a").capabilities("llm"))
    agent = fleet.agent("a", "hold")
    fleet.operator()
    fleet.add_task(task("job").requires("llm").lease(LEASE).backoff(initial=0))
    fleet.wait_phase("job", "Running")
    agent.signal(signal.SIGSTOP)
    fleet.leases.patch_namespaced_lease(
        protocol.task_lease_name("job"),
        fleet.namespace,
        {"spec": {"leaseDurationSeconds": 86400}},
    )
    moved = fleet.wait_task(
        "job", lambda b: (b.get("status") or {}).get("reclaims") == 1, timeout=LEASE + 10
    )["status"]
    assert moved["history"][-1]["reason"] == "LeaseExpired"
    agent.signal(signal.SIGCONT)


def test_tokens_are_never_reused_for_a_task_name_across_delete_and_recreate(
    fleet: Fleet,
) -> None:
    fleet.add_worker(worker("a").capabilities("llm"))
    fleet.add_worker(worker("b").capabilities("llm"))
    zombie = fleet.agent("a", "hold")
    fleet.operator()
    fleet.add_task(task("job").requires("llm").lease(30))
    old = fleet.wait_phase("job", "Running")["status"]
    old_lease = fleet.task_lease("job")
    assert old_lease is not None
    zombie.signal(signal.SIGSTOP)
    fleet.custom.delete_namespaced_custom_object(
        "agentq.dev", "v1alpha1", fleet.namespace, "agenttasks", "job"
    )
    deadline = time.monotonic() + 30
    while True:  # the object, not only its name, is gone
        try:
            fleet.task("job")
        except Exception:
            break
        assert time.monotonic() < deadline
        time.sleep(0.1)
    fleet.agent("b", "hold")
    fleet.custom.patch_namespaced_custom_object(  # no new work for the zombie's worker
        "agentq.dev", "v1alpha1", fleet.namespace, "agentworkers", "a", {"spec": {"paused": True}}
    )
    fleet.add_task(task("job").requires("llm").lease(30))
    new = fleet.wait_task("job", lambda b: (b.get("status") or {}).get("worker") == "b")["status"]
    assert new["fencingToken"] > old["fencingToken"]
    # A grant writes the task's status first, then creates its Lease: wait for the Lease.
    deadline = time.monotonic() + 30
    while (lease := fleet.task_lease("job")) is None or lease.spec.holder_identity != "b":
        assert time.monotonic() < deadline, fleet.logs()
        time.sleep(0.1)
    # The zombie wakes and writes its old attempt's report on whatever Lease is there.
    zombie_report = {"token": old["fencingToken"], "worker": "a", "outcome": "Succeeded"}
    lease_annotations(fleet, "job", {protocol.ANNOTATION_REPORT: json.dumps(zombie_report)})
    fleet.wait_reasons("job", {"StaleReportRefused": 1})
    assert status(fleet, "job")["phase"] in ("Assigned", "Running")
    assert "result" not in status(fleet, "job")
    zombie.signal(signal.SIGCONT)


def test_a_workers_lease_seen_before_the_worker_still_goes_stale(fleet: Fleet) -> None:
    """The operator's Lease and AgentWorker watches are separate: a worker Lease seen
    before its AgentWorker set no staleness timer, and a sidecar that died before its
    next renewal left the worker Ready for good (a CI run: 40 s, still LeaseRenewed)."""
    pod = fleet.agent("late", "hold", worker_lease_seconds=6)
    pod.wait_serving()
    fleet.operator()
    lease = protocol.worker_lease_name("late")
    deadline = time.monotonic() + 20
    while not fleet.leases.list_namespaced_lease(
        fleet.namespace, field_selector=f"metadata.name={lease}"
    ).items:
        assert time.monotonic() < deadline, fleet.logs()
        time.sleep(0.2)
    time.sleep(1.0)  # the operator has seen the Lease by now
    pod.signal(signal.SIGSTOP)  # no renewal after the AgentWorker appears
    fleet.add_worker(worker("late").capabilities("llm"))
    wait_ready_reason(fleet, "late", "LeaseRenewed", timeout=5)
    got = wait_ready_reason(fleet, "late", "LeaseStale", timeout=15)
    assert "agentq-worker-late" in got["message"]
    assert fleet.worker("late")["status"]["phase"] == "NotReady"
    pod.signal(signal.SIGCONT)
