"""Usage and throttles from an agent, through a real sidecar, onto the claim's Lease on
a real API server (docs/budgets.md, "Usage and throttles from agents").

The agent is this test (through the sidecar's HTTP API, with the pod's secret); the
agent-sim beside the sidecar never beats ("hang"), so every write to the task's Lease
is one this test caused. The operator grants the tasks and commits their reports.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client, watch

from agentq import protocol
from agentq.agent import AgentError, Assignment, SidecarClient, SidecarUnavailable
from builders import budget, task, worker
from fleet import AgentPair, ControlPlane, Fleet


class Setup:
    def __init__(self, fleet: Fleet, pair: AgentPair, budgets: tuple[str, str]) -> None:
        self.fleet = fleet
        self.pair = pair
        self.openai, self.search = budgets
        self.client: SidecarClient = pair.client()

    def assignment(self, name: str) -> Assignment:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                items = self.client.list(wait=5)[1]
            except SidecarUnavailable:  # starting, or not yet holding its worker Lease
                time.sleep(0.2)
                continue
            for item in items:
                if item.task == name:
                    return item
        raise AssertionError(f"{name} was never assigned:\n{self.fleet.logs()}")

    def lease(self, name: str) -> client.V1Lease:
        lease = self.fleet.task_lease(name)
        assert lease is not None
        return lease

    def notes(self, name: str) -> dict[str, str]:
        return dict(self.lease(name).metadata.annotations or {})

    def status(self) -> dict[str, Any]:
        return self.client.request("GET", "/v1/status")

    def post(self, name: str, verb: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        try:
            return 200, self.client.request("POST", f"/v1/assignments/{name}/{verb}", body)
        except AgentError as err:
            return err.status, err.body


@pytest.fixture(scope="module")
def setup(
    control_plane: ControlPlane, agentq_crds: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Setup]:
    suffix = uuid.uuid4().hex[:6]
    namespace = f"usage-{suffix}"
    names = (f"openai-{suffix}", f"search-{suffix}")
    control_plane.kubectl("create", "namespace", namespace)
    for name in names:  # budgets without limits: they gate nothing here
        control_plane.kubectl("apply", "-f", "-", input=budget(name).yaml())
    fleet = Fleet(
        kubeconfig=control_plane.kubeconfig,
        namespace=namespace,
        workdir=tmp_path_factory.mktemp("budget-usage"),
        kubectl=control_plane.kubectl_path,
    )
    try:
        fleet.add_worker(worker("w").capabilities("llm").max_in_flight(4))
        pair = fleet.agent("w", "hang")
        # agent-sim, reporting the usage and the throttle its tasks' payloads say.
        fleet.add_worker(worker("sim").capabilities("sim"))
        fleet.agent("sim", "complete", work_seconds=0.5)
        fleet.operator()
        pair.wait_serving()
        yield Setup(fleet, pair, names)
    finally:
        fleet.close()
        control_plane.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
        for name in names:
            control_plane.kubectl("delete", "agentbudget", name, "--wait=false", check=False)


def wait_until(what: str, condition: Any, timeout: float = 20) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"not in {timeout} s: {what}")


class LeaseEvents:
    """Every version of one task Lease from now on, until it is deleted (a watch)."""

    def __init__(self, fleet: Fleet, name: str) -> None:
        self.versions: list[dict[str, str]] = []
        self.done = threading.Event()
        lease = protocol.task_lease_name(name)
        self._thread = threading.Thread(target=self._run, args=(fleet, lease), daemon=True)
        self._thread.start()

    def _run(self, fleet: Fleet, lease: str) -> None:
        stream = watch.Watch().stream(
            fleet.leases.list_namespaced_lease,
            fleet.namespace,
            field_selector=f"metadata.name={lease}",
            timeout_seconds=90,
        )
        for event in stream:
            self.versions.append(dict(event["object"].metadata.annotations or {}))
            if event["type"] == "DELETED":
                break
        self.done.set()


def test_usage_and_throttles_reach_the_lease_and_bad_ones_change_nothing(setup: Setup) -> None:
    o, s = setup.openai, setup.search
    setup.fleet.add_task(task("job").requires("llm").lease(30).budget(o, tokens=1000).budget(s))
    got = setup.assignment("job")
    assert got.budgets == (o, s)
    token = got.token
    events = LeaseEvents(setup.fleet, "job")

    # Usage rides the renewal: here the first one, which the first beat makes.
    first = {o: {"requests": 2, "tokens": 700}}
    assert setup.post("job", "heartbeat", {"token": token, "usage": first})[0] == 200
    setup.fleet.wait_phase("job", "Running", timeout=30)
    notes = wait_until(
        "the usage on the Lease", lambda: setup.notes("job").get(protocol.ANNOTATION_USAGE)
    )
    assert protocol.decode_usage(notes) == {o: protocol.Usage(2, 700)}

    # Bad reports: 400, and the Lease is not written (renewals are 10 s apart).
    before = setup.lease("job")
    bad = [
        ("heartbeat", {"usage": {o: {"requests": 2, "tokens": 699}}}, "InvalidUsage"),
        ("heartbeat", {"usage": {o: {"tokens": -5}}}, "InvalidUsage"),
        ("heartbeat", {"usage": {o: {"tokens": 10**12 + 1}}}, "InvalidUsage"),
        ("heartbeat", {"usage": {"not-named": {"requests": 1}}}, "InvalidUsage"),
        ("heartbeat", {"throttled": {"budget": o, "retryAfterSeconds": 0}}, "InvalidThrottle"),
        (
            "heartbeat",
            {"throttled": {"budget": "not-named", "retryAfterSeconds": 5}},
            "InvalidThrottle",
        ),
        ("complete", {"usage": {o: {"requests": 1}}}, "InvalidUsage"),
        (
            "fail",
            {"reason": "r", "throttled": {"budget": o, "retryAfterSeconds": 3601}},
            "InvalidThrottle",
        ),
    ]
    for verb, body, code in bad:
        status, answer = setup.post("job", verb, {"token": token, **body})
        assert (status, answer.get("error")) == (400, code), (verb, body, answer)
    time.sleep(0.5)
    after = setup.lease("job")
    assert after.metadata.resource_version == before.metadata.resource_version
    assert after.metadata.annotations == before.metadata.annotations
    assert setup.fleet.task("job")["status"]["phase"] == "Running"

    # A throttle is written at once, with the usage so far.
    throttled = {"budget": o, "retryAfterSeconds": 10}
    second = {o: {"tokens": 1500}, s: {"requests": 1}}
    status, _ = setup.post(
        "job", "heartbeat", {"token": token, "usage": second, "throttled": throttled}
    )
    assert status == 200
    text = wait_until(
        "the throttle on the Lease", lambda: setup.notes("job").get(protocol.ANNOTATION_THROTTLED)
    )
    throttle = protocol.Throttle.decode(text)
    assert (throttle.budget, throttle.retry_after_seconds) == (o, 10)
    assert throttle.id.startswith(f"{token}-")
    assert protocol.decode_usage(setup.notes("job")[protocol.ANNOTATION_USAGE]) == {
        o: protocol.Usage(2, 1500),
        s: protocol.Usage(1, 0),
    }

    # The report carries the final usage; the operator commits it.
    status, _ = setup.post(
        "job", "complete", {"token": token, "result": 1, "usage": {o: {"requests": 3}}}
    )
    assert status == 200
    setup.fleet.wait_phase("job", "Succeeded", timeout=30)
    final = {o: {"requests": 3, "tokens": 1500}, s: {"requests": 1, "tokens": 0}}
    events.done.wait(30)
    reports = [
        v[protocol.ANNOTATION_REPORT] for v in events.versions if protocol.ANNOTATION_REPORT in v
    ]
    assert reports, events.versions
    assert json.loads(reports[-1])["usage"] == final
    assert protocol.Report.decode(reports[-1]).usage == protocol.parse_usage(final)
    # Every version the watch saw is one a sidecar writes: nothing invalid got through.
    for version in events.versions:
        if protocol.ANNOTATION_USAGE in version:
            assert protocol.lease_usage(version) is not None
        if protocol.ANNOTATION_THROTTLED in version:
            assert protocol.lease_throttle(version) is not None


def run_task(setup: Setup, name: str, *, with_usage: bool) -> int:
    """One task through the scripted agent (beats 1 s apart for 3 s, then complete),
    with or without usage on each call; returns the sidecar's writes to its Lease."""
    o = setup.openai
    setup.fleet.add_task(task(name).requires("llm").lease(30).budget(o, tokens=1000))
    got = setup.assignment(name)
    start = setup.status()
    for i in range(4):
        body: dict[str, Any] = {"token": got.token, "progress": f"step {i}"}
        if with_usage:
            body["usage"] = {o: {"requests": i + 1, "tokens": 100 * (i + 1)}}
        assert setup.post(name, "heartbeat", body)[0] == 200
        time.sleep(1)
    body = {"token": got.token, "result": 1}
    if with_usage:
        body["usage"] = {o: {"requests": 5, "tokens": 500}}
    assert setup.post(name, "complete", body)[0] == 200
    setup.fleet.wait_phase(name, "Succeeded", timeout=30)
    end = setup.status()
    return int(end["renewalRequests"]) - int(start["renewalRequests"]) + 1  # + the report


def test_usage_costs_no_api_write_of_its_own(setup: Setup) -> None:
    plain = run_task(setup, "plain", with_usage=False)
    used = run_task(setup, "used", with_usage=True)
    print(f"task Lease writes by the sidecar: without usage {plain}, with usage {used}")
    assert plain == used == 2  # the first renewal (Running) and the report


def test_agent_sim_reports_the_usage_and_throttle_its_payload_says(setup: Setup) -> None:
    o = setup.openai
    events = LeaseEvents(setup.fleet, "simmed")
    time.sleep(0.5)  # the watch is open before the Lease exists
    payload = {
        "usage": {o: {"requests": 2, "tokens": 3000}},
        "throttled": {"budget": o, "retryAfterSeconds": 5},
    }
    setup.fleet.add_task(
        task("simmed").requires("sim").lease(30).budget(o, tokens=1000).payload(payload)
    )
    setup.fleet.wait_phase("simmed", "Succeeded", timeout=60)
    assert events.done.wait(30), events.versions
    throttles = [protocol.lease_throttle(v) for v in events.versions]
    assert any(t is not None and (t.budget, t.retry_after_seconds) == (o, 5) for t in throttles)
    reports = [
        v[protocol.ANNOTATION_REPORT] for v in events.versions if protocol.ANNOTATION_REPORT in v
    ]
    assert reports, events.versions
    assert protocol.Report.decode(reports[-1]).usage == {o: protocol.Usage(2, 3000)}
