"""Worker status publishing, on the in-memory API server: what ends up in the status, and
how few writes it costs."""

from __future__ import annotations

import asyncio

import pytest

from agentq import protocol
from agentq.claims import Readiness
from agentq.operator import metrics
from agentq.operator.config import OperatorConfig
from agentq.operator.fake import Hang, Held
from agentq.operator.port import KubeError, Status
from builders import task
from harness import NS, Harness, run


def ready_reason(h: Harness, name: str) -> str | None:
    conditions = h.worker_status(name).get("conditions") or []
    return next((c["reason"] for c in conditions if c["type"] == "Ready"), None)


@run
async def test_an_older_status_write_landing_last_is_written_over() -> None:
    """The flaky LeaseMissing of test_a_workers_ready_condition_says_what_is_missing: the
    first status write (LeaseMissing) was slow, the diagnosis found the Lease without its
    label, and the second write (LeaseNotLabelled) overtook the first at the API server.
    Last write wins, so the status said LeaseMissing for good."""
    h = Harness()
    gate = asyncio.Event()
    h.kube.inject("patch_status", Held(gate), when=lambda a: a[0] == "agentworkers")
    h.worker("u", "llm", lease=False)
    h.worker_lease("u", labelled=False)  # invisible to the watch (no agentq label)
    await h.steps(20)
    assert h.readiness("u") is Readiness.LEASE_NOT_LABELLED
    gate.set()  # the slow first write lands now
    await h.settle()
    assert ready_reason(h, "u") == "LeaseNotLabelled"
    assert h.writing_status() == set()


@run
async def test_a_status_changed_by_someone_else_is_written_again() -> None:
    h = Harness()
    h.worker("w", "llm")
    await h.settle()
    assert ready_reason(h, "w") == "LeaseRenewed"

    def overwrite(body: dict) -> None:  # type: ignore[type-arg]
        for c in body["status"]["conditions"]:
            if c["type"] == "Ready":
                c["reason"], c["status"] = "LeaseMissing", "False"

    h.kube.edit("agentworkers", NS, "w", overwrite)
    await h.settle()
    assert ready_reason(h, "w") == "LeaseRenewed"


@run
async def test_a_status_write_with_an_unknown_outcome_is_made_again() -> None:
    h = Harness()
    h.kube.inject("patch_status", KubeError("timeout"), when=lambda a: a[0] == "agentworkers")
    h.worker("w", "llm")
    await h.settle()
    assert ready_reason(h, "w") is None, "the first write was lost"
    await h.advance(1.5)
    assert ready_reason(h, "w") == "LeaseRenewed"


@run
async def test_counts_cost_no_write_during_a_burst_and_are_written_after_the_interval() -> None:
    h = Harness(worker_status_interval=30.0, worker_counts_qps=1.0)
    for i in range(5):
        h.worker(f"w{i}", "llm", max_in_flight=20, lease_seconds=1000)
    await h.settle()
    readiness_writes = h.kube.writes["agentworkers/status PATCH"]
    assert readiness_writes == 5  # each worker's Ready, once
    for i in range(100):
        h.task(task(f"t{i}").requires("llm").lease(1000))
    await h.advance(5)
    assert sum(1 for i in range(100) if h.status(f"t{i}").get("worker")) == 100
    assert h.kube.writes["agentworkers/status PATCH"] == readiness_writes, (
        "count changes during a burst cost no write"
    )
    await h.advance(26)  # the interval has passed: counts are due, at most 1 a second
    assert h.kube.writes["agentworkers/status PATCH"] - readiness_writes <= 2
    for _ in range(10):
        await h.advance(1)
    assert h.kube.writes["agentworkers/status PATCH"] - readiness_writes == 5
    assert sum(h.worker_status(f"w{i}")["inFlight"] for i in range(5)) == 100


def in_flight_gauge(name: str) -> float:
    return float(metrics.WORKER_IN_FLIGHT.labels(NS, name)._value.get())


@run
async def test_one_status_write_per_worker_is_in_flight() -> None:
    h = Harness()
    sent: list[str] = []
    h.kube.inject(  # counts every worker status write sent, answers none of them
        "patch_status",
        KubeError("never"),
        when=lambda a: a[0] == "agentworkers" and bool(sent.append(a[2])),
    )
    gate = asyncio.Event()
    h.kube.inject("patch_status", Held(gate), when=lambda a: a[0] == "agentworkers")
    h.worker("w", "llm")
    await h.steps(20)
    assert sent == ["w"]
    h.kube.remove("leases", NS, protocol.worker_lease_name("w"))  # readiness changes
    await h.steps(20)
    assert h.readiness("w") is Readiness.LEASE_MISSING
    assert sent == ["w"], "no second write while the first is in flight"
    gate.set()
    await h.settle()
    assert sent == ["w", "w"], "the change is written once the first write is done"
    assert ready_reason(h, "w") == "LeaseMissing"
    assert h.worker_status("w")["phase"] == "NotReady"


@run
async def test_a_readiness_change_is_written_at_once_while_counts_wait_for_their_budget() -> None:
    h = Harness(worker_status_interval=30.0, worker_counts_qps=1.0)
    for i in range(5):
        h.worker(f"w{i}", "llm", max_in_flight=20, lease_seconds=1000)
    await h.settle()
    for i in range(50):
        h.task(task(f"t{i}").requires("llm").lease(1000))
    await h.advance(31)  # every worker's counts are due; one a second may be written
    before = h.kube.writes["agentworkers/status PATCH"]
    assert before <= 5 + 2
    h.kube.remove("leases", NS, protocol.worker_lease_name("w4"))
    await h.settle()  # no time passes
    assert ready_reason(h, "w4") == "LeaseMissing"
    assert h.worker_status("w4")["phase"] == "NotReady"


@run
async def test_the_per_worker_metrics_follow_the_core_while_status_counts_wait() -> None:
    h = Harness(worker_status_interval=30.0)
    h.worker("m", "llm", max_in_flight=20, lease_seconds=1000)
    await h.settle()
    for i in range(7):
        h.task(task(f"m{i}").requires("llm").lease(1000))
    await h.advance(1.1)  # granted
    await h.advance(1.1)  # the gauges are refreshed once a second
    assert h.worker_status("m").get("inFlight", 0) == 0, "the counts wait their interval"
    assert in_flight_gauge("m") == 7


@run
async def test_a_refused_status_write_is_not_retried_in_a_loop() -> None:
    h = Harness()
    h.kube.inject("patch_status", Status.INVALID, when=lambda a: a[0] == "agentworkers")
    h.worker("w", "llm", lease_seconds=1000)
    await h.settle()
    for _ in range(5):
        await h.advance(2)
    assert h.kube.calls["patch_status"] == 1
    h.kube.remove("leases", NS, protocol.worker_lease_name("w"))  # a later change is written
    await h.settle()
    assert ready_reason(h, "w") == "LeaseMissing"


@run
async def test_a_new_leader_reads_again_an_unlabelled_lease_whose_diagnosis_was_cancelled() -> None:
    h = Harness()
    name = protocol.worker_lease_name("u")
    h.kube.inject("get_lease", Hang(), when=lambda a: a[1] == name)
    h.worker("u", "llm", lease=False)
    h.worker_lease("u", labelled=False)
    await h.steps(20)
    assert h.kube.calls["get_lease"] == 1, "the diagnosis hangs"
    h.controller.set_leading(False)  # cancels it
    await asyncio.sleep(0.01)
    h.controller.set_leading(True)  # within DIAGNOSE_SECONDS
    await h.settle()
    assert ready_reason(h, "u") == "LeaseNotLabelled"


def test_a_worker_status_rate_of_zero_is_refused() -> None:
    for setting in ("worker_status_qps", "worker_counts_qps"):
        with pytest.raises(ValueError, match=setting.upper()):
            OperatorConfig(**{setting: 0.0}).check()  # type: ignore[arg-type]


@run
async def test_a_status_write_cancelled_before_it_ran_does_not_silence_the_worker() -> None:
    """Leadership lost in the very step that spawned a worker's status write: the write is
    cancelled before it runs. Back in the lead, the worker's status is written again."""
    h = Harness()
    h.worker("w1", "llm")
    await h.settle()
    assert h.writing_status() == set()
    h.worker_lease("w1", labelled=False)  # its readiness changes: an urgent status write
    for _ in range(20):
        h.controller.step()
        if h.writing_status():
            break
        await asyncio.sleep(0)
    assert h.writing_status(), "the write is spawned, not yet run"
    h.controller.set_leading(False)  # cancels every write, this one before it ran
    await asyncio.sleep(0)
    h.controller.set_leading(True)
    await asyncio.wait_for(h.settle(), timeout=10)
    assert ready_reason(h, "w1") == "LeaseNotLabelled"
