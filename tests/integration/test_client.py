"""``agentq.client`` on the real API server, with the operator and real agents (sidecar +
agent-sim processes): submit and wait for a result, a failure's error raised, a cancel
of a running task, waiting on a selector, a task deleted while waited on, timeouts, the
API server's refusals as they are; and a wait costs requests, not time (it watches)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from test_task_verbs import task_watches

from agentq import kube
from agentq.client import (
    ApiError,
    AsyncClient,
    Client,
    End,
    Outcome,
    TaskCancelled,
    TaskDeadLettered,
    TaskDeleted,
    TaskFailed,
    TaskNotFound,
    WaitTimeout,
)
from builders import task, worker
from fleet import Fleet


class CountingKube(kube.Client):
    """agentq.kube.Client, counting the requests it sends (a WATCH counts once)."""

    def __init__(self, config: kube.KubeConfig) -> None:
        super().__init__(config)
        self.sent: list[tuple[str, dict[str, str]]] = []
        # Requests the API server did not answer (a transport error, 429, 5xx): retried by
        # the client, so a loaded machine's run may show one more; kept apart.
        self.unanswered: list[tuple[str, str]] = []

    async def request(self, method: str, path: str, **kwargs: Any) -> kube.Response:
        try:
            rsp = await super().request(method, path, **kwargs)
        except Exception as err:
            self.unanswered.append((method, repr(err)))
            raise
        if rsp.status == 429 or rsp.status >= 500:
            self.unanswered.append((method, str(rsp.status)))
        else:
            self.sent.append((method, dict(kwargs.get("params") or {})))
        return rsp

    def stream(self, path: str, *, params: Any, read_timeout: float) -> Any:
        self.sent.append(("WATCH", dict(params)))
        return super().stream(path, params=params, read_timeout=read_timeout)


def client(fleet: Fleet, **kwargs: Any) -> Client:
    return Client(kubeconfig=fleet.kubeconfig, namespace=fleet.namespace, **kwargs)


class Background:
    """A call run in a thread: its value or error once it returns."""

    def __init__(self, call: Callable[[], Any]) -> None:
        self.value: Any = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(call,), daemon=True)
        self.thread.start()

    def _run(self, call: Callable[[], Any]) -> None:
        try:
            self.value = call()
        except BaseException as err:
            self.error = err

    def join(self, timeout: float) -> Background:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), f"still waiting after {timeout}s"
        return self


def test_submit_and_wait_returns_the_result(fleet: Fleet) -> None:
    fleet.add_worker(worker("w", "llm").max_in_flight(4))
    fleet.agent("w", "complete", work_seconds=0.2)
    fleet.operator("--no-leader-election")
    with client(fleet) as q:
        named = q.submit(name="named", required_capabilities=["llm"], payload={"doc": 42})
        generated = q.submit(generate_name="gen-", labels={"team": "nlp"}, cost=2)
        from_manifest = q.submit(task("manifested").requires("llm").obj())
        assert named.name == "named" and generated.name.startswith("gen-")
        assert named.wait(timeout=30) == {"by": "w"}
        assert generated.wait(timeout=30) == {"by": "w"}
        outcome = from_manifest.outcome(timeout=30)
        assert outcome.end is End.SUCCEEDED and outcome.result == {"by": "w"}
        assert named.status()["phase"] == "Succeeded"
        assert [t.name for t in q.tasks("team=nlp")] == [generated.name]
        assert q.task("named").wait(timeout=5) == {"by": "w"}  # a finished task: at once
        with pytest.raises(TaskNotFound, match="not found"):
            q.task("ghost").wait(timeout=5)


def test_the_async_client_submits_and_waits(fleet: Fleet) -> None:
    fleet.add_worker(worker("w", "llm"))
    fleet.agent("w", "complete", work_seconds=0.1)
    fleet.operator("--no-leader-election")

    async def main() -> Any:
        async with AsyncClient(kubeconfig=fleet.kubeconfig, namespace=fleet.namespace) as q:
            handle = await q.submit(name="a", required_capabilities=["llm"])
            return await handle.wait(timeout=30)

    assert asyncio.run(main()) == {"by": "w"}


def test_a_failing_task_raises_its_error(fleet: Fleet) -> None:
    fleet.add_worker(worker("fatal", "fatal"))
    fleet.add_worker(worker("flaky", "flaky"))
    fleet.agent("fatal", "fatal", work_seconds=0.1)
    fleet.agent("flaky", "fail", work_seconds=0.1)
    fleet.operator("--no-leader-election")
    with client(fleet) as q:
        failed = q.submit(name="failed", required_capabilities=["fatal"])
        poison = q.submit(
            name="poison",
            required_capabilities=["flaky"],
            max_reclaims=1,
            retry_backoff={"initialSeconds": 0.2, "maxSeconds": 1},
        )
        with pytest.raises(TaskFailed) as raised:
            failed.wait(timeout=30)
        assert not isinstance(raised.value, TaskDeadLettered)
        assert raised.value.error is not None and raised.value.error["reason"] == "AgentError"
        assert raised.value.phase == "Failed"
        assert "Failed: AgentError: simulated failure" in str(raised.value)
        with pytest.raises(TaskDeadLettered) as dead:
            poison.wait(timeout=30)
        assert dead.value.status["reclaims"] == 2
        assert "DeadLettered after 2 failed attempts" in str(dead.value)


def test_a_cancel_of_a_running_task_ends_it_cancelled_and_the_wait_says_so(
    fleet: Fleet,
) -> None:
    fleet.add_worker(worker("w", "llm"))
    pair = fleet.agent("w", "hold")
    fleet.operator("--no-leader-election")
    with client(fleet) as q:
        job = q.submit(
            name="job", required_capabilities=["llm"], lease_duration_seconds=9,
            heartbeat_interval_seconds=3,
        )  # fmt: skip
        waiter = Background(lambda: job.wait(timeout=60))
        fleet.wait_phase("job", "Running", timeout=30)
        assert job.cancel() is True
        cancelled_at = time.monotonic()
        waiter.join(20)
        assert isinstance(waiter.error, TaskCancelled), waiter.error
        assert waiter.error.error is not None and waiter.error.error["reason"] == "Cancelled"
        # The agent was told within a heartbeat; the task ended within a lease after.
        assert time.monotonic() - cancelled_at < 9 + 3
        told = time.monotonic() + 5
        while not any(e.get("event") == "revoked" for e in pair.agent.events()):
            assert time.monotonic() < told, "the agent was not told"
            time.sleep(0.1)
        assert job.cancel() is True  # idempotent
        with pytest.raises(TaskCancelled):
            job.wait(timeout=5)


def test_a_cancel_of_a_finished_task_changes_nothing(fleet: Fleet) -> None:
    fleet.add_worker(worker("w", "llm"))
    fleet.agent("w", "complete", work_seconds=0.1)
    fleet.operator("--no-leader-election")
    with client(fleet) as q:
        done = q.submit(name="done", required_capabilities=["llm"])
        assert done.wait(timeout=30) == {"by": "w"}
        assert done.cancel() is False
        fleet.wait_task(
            "done",
            lambda b: any(
                c["type"] == "Cancelled" and c["reason"] == "AlreadyFinished"
                for c in (b.get("status") or {}).get("conditions") or []
            ),
            what="the late cancel noted",
        )
        assert done.wait(timeout=5) == {"by": "w"}
        with pytest.raises(TaskNotFound):
            q.task("ghost").cancel()


def test_wait_all_over_a_selector_reports_each_outcome(fleet: Fleet) -> None:
    fleet.add_worker(worker("w", "llm").max_in_flight(4))
    fleet.add_worker(worker("fatal", "fatal"))
    fleet.agent("w", "complete", work_seconds=0.3)
    fleet.agent("fatal", "fatal", work_seconds=0.1)
    fleet.operator("--no-leader-election")
    with client(fleet) as q:
        for i in range(3):
            q.submit(name=f"ok-{i}", required_capabilities=["llm"], labels={"batch": "7"})
        q.submit(name="bad", required_capabilities=["fatal"], labels={"batch": "7"})
        q.submit(name="stuck", required_capabilities=["gpu"], labels={"batch": "7"})
        q.submit(name="other", required_capabilities=["llm"], labels={"batch": "8"})
        started = time.monotonic()
        seen = [o.name for o in q.as_completed(selector="batch=7", timeout=8)]
        outcomes = q.wait_all(selector="batch=7", timeout=2)
    assert time.monotonic() - started < 8 + 2 + 5
    assert seen[-1] == "stuck"  # the timeouts come last
    assert sorted(seen) == ["bad", "ok-0", "ok-1", "ok-2", "stuck"]
    by_name = {o.name: o for o in outcomes}
    assert [o.name for o in outcomes] == ["bad", "ok-0", "ok-1", "ok-2", "stuck"]
    assert {n: o.end for n, o in by_name.items()} == {
        "bad": End.FAILED,
        "ok-0": End.SUCCEEDED,
        "ok-1": End.SUCCEEDED,
        "ok-2": End.SUCCEEDED,
        "stuck": End.TIMEOUT,
    }
    assert "gpu" in by_name["stuck"].describe()  # why it is still Pending


def test_a_task_deleted_while_waited_on(fleet: Fleet) -> None:
    fleet.operator("--no-leader-election")
    with client(fleet) as q:
        stuck = q.submit(name="stuck", required_capabilities=["gpu"])
        before = task_watches(fleet)
        waiter = Background(lambda: stuck.wait(timeout=60))
        deadline = time.monotonic() + 30
        while task_watches(fleet) <= before:  # until it watches (it has listed the task)
            assert time.monotonic() < deadline and waiter.thread.is_alive(), waiter.error
            time.sleep(0.1)
        fleet.kubectl("delete", "agenttask", "stuck")
        waiter.join(15)
        assert isinstance(waiter.error, TaskDeleted), waiter.error


def test_a_wait_watches_its_requests_do_not_grow_with_the_time_waited(fleet: Fleet) -> None:
    """A running task changed four times a second (an annotation): a wait of 2 s and
    one of 8 s each make one LIST and one WATCH (resumed once at most), never a poll."""
    fleet.add_worker(worker("w", "llm"))
    fleet.agent("w", "hold")
    fleet.operator("--no-leader-election")
    config = kube.from_kubeconfig(fleet.kubeconfig)
    with client(fleet) as q:
        q.submit(name="held", required_capabilities=["llm"])
    fleet.wait_phase("held", "Running", timeout=30)
    stop = threading.Event()

    def tick() -> None:
        n = 0
        while not stop.wait(0.25):
            n += 1
            fleet.annotate_task("held", "example.com/tick", str(n))

    ticker = threading.Thread(target=tick, daemon=True)
    ticker.start()
    counts = {}
    try:
        for seconds in (2.0, 8.0):
            api = CountingKube(config)
            with Client(api=api, namespace=fleet.namespace) as q:
                started = time.monotonic()
                outcome = q.task("held").outcome(timeout=seconds)
                assert seconds <= time.monotonic() - started < seconds + 5
            assert outcome.end is End.TIMEOUT and outcome.phase == "Running"
            counts[seconds] = [verb for verb, _ in api.sent]
            assert len(api.unanswered) <= 1, api.unanswered  # one transient failure at most
    finally:
        stop.set()
        ticker.join()
    # One LIST and one WATCH each, however long the wait: no polling. A watch the
    # server or the transport ended mid-wait is resumed from its last resourceVersion
    # (one more WATCH, no LIST): seen once under load, so one resumption is allowed.
    for seconds, sent in counts.items():
        assert sent[:2] == ["GET", "WATCH"], (seconds, sent)
        assert sent[2:] in ([], ["WATCH"]), (seconds, sent)
    ticks = int(fleet.task("held")["metadata"]["annotations"]["example.com/tick"])
    assert ticks > 25  # the task did change, all the time


def test_timeouts(fleet: Fleet) -> None:
    fleet.operator("--no-leader-election")
    with client(fleet) as q:
        stuck = q.submit(name="stuck", required_capabilities=["gpu"])
        started = time.monotonic()
        with pytest.raises(WaitTimeout, match="not finished within 1s: it is Pending") as raised:
            stuck.wait(timeout=1)
        assert 1 <= time.monotonic() - started < 6
        assert isinstance(raised.value, TimeoutError)
        once: Outcome = stuck.outcome(timeout=0)  # one look, no watch
        assert once.end is End.TIMEOUT


def test_the_api_servers_refusals_are_raised_as_they_are(fleet: Fleet) -> None:
    with client(fleet) as q:
        with pytest.raises(ApiError, match=r"spec.cost: Invalid value: -1") as bad:
            q.submit(name="bad", cost=-1)
        assert bad.value.status == 422
        with pytest.raises(ApiError, match=r'strict decoding error: unknown field "spec.leaseDur'):
            q.submit(name="typo", spec={"leaseDuration": 3})
        with pytest.raises(ApiError, match="already exists"):
            q.submit(name="twice")
            q.submit(name="twice")
        q.submit(name="dry", dry_run=True)
        with pytest.raises(TaskNotFound):
            q.task("dry").status()
        with pytest.raises(TypeError, match="unknown AgentTask field"):
            q.submit(name="x", lease_seconds=3)
