"""How the client waits, against a scripted HTTP server standing in for the API server's
LIST and WATCH of agenttasks: one LIST then one WATCH, resumed from the last
resourceVersion (a bookmark's too) when the server ends it, a new LIST after 410 Gone,
a retry after a 5xx, a refusal raised. The real API server is in
tests/integration/test_client.py."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from click.testing import CliRunner, Result

from agentq import kube
from agentq.cli import main
from agentq.client import (
    ApiError,
    AsyncClient,
    Client,
    End,
    ListTimeout,
    TaskFailed,
    Unreachable,
    aio,
)
from agentq.controlplane.cluster import free_port
from agentq.ops import tasks as ops_tasks

pytestmark = pytest.mark.unit

HANG = "hang"  # a watch that stays open with nothing to say


def task(name: str, phase: str | None, rv: int, **status: Any) -> dict[str, Any]:
    meta = {"name": name, "namespace": "ns", "uid": f"uid-{name}", "resourceVersion": str(rv)}
    return {
        "apiVersion": "agentq.dev/v1alpha1",
        "kind": "AgentTask",
        "metadata": meta,
        "status": {**({"phase": phase} if phase else {}), **status},
    }


def listing(rv: int, *items: dict[str, Any]) -> dict[str, Any]:
    return {"kind": "AgentTaskList", "metadata": {"resourceVersion": str(rv)}, "items": list(items)}


def event(kind: str, obj: dict[str, Any]) -> dict[str, Any]:
    return {"type": kind, "object": obj}


def bookmark(rv: int) -> dict[str, Any]:
    return event("BOOKMARK", {"kind": "AgentTask", "metadata": {"resourceVersion": str(rv)}})


class FakeApi:
    """Answers LISTs, WATCHes and creates of agenttasks from scripts (the last answer of a
    script repeats); records every request as (verb, query)."""

    def __init__(
        self,
        *,
        lists: list[Any],
        watches: list[Any],
        creates: list[Any] = (),
        list_delay: float = 0.0,
    ) -> None:
        self.lists = list(lists)
        self.list_delay = list_delay
        self.watches = list(watches)
        self.creates = list(creates)
        self.requests: list[tuple[str, dict[str, str]]] = []

    @staticmethod
    def _next(script: list[Any]) -> Any:
        return script.pop(0) if len(script) > 1 else script[0]

    async def handle(self, request: web.Request) -> web.StreamResponse:
        query = dict(request.query)
        verb = "POST" if request.method == "POST" else "WATCH" if query.get("watch") else "LIST"
        self.requests.append((verb, query))
        script = {"POST": self.creates, "WATCH": self.watches, "LIST": self.lists}[verb]
        answer = self._next(script)
        if verb == "LIST":
            await asyncio.sleep(self.list_delay)
        if isinstance(answer, int):
            status = {"kind": "Status", "code": answer, "message": f"scripted {answer}"}
            return web.json_response(status, status=answer)
        if verb != "WATCH":
            return web.json_response(answer, status=201 if verb == "POST" else 200)
        rsp = web.StreamResponse()
        await rsp.prepare(request)
        for item in answer:
            if item == HANG:
                await asyncio.sleep(3600)
            await rsp.write(json.dumps(item).encode() + b"\n")
        return rsp


async def serve(api: FakeApi) -> TestServer:
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", api.handle)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    return server


def run(api: FakeApi, body: Callable[[AsyncClient], Any]) -> Any:
    async def main() -> Any:
        server = await serve(api)
        config = kube.KubeConfig(
            server=str(server.make_url("")).rstrip("/"), credentials=kube.Credentials()
        )
        client = AsyncClient(config, namespace="ns")
        try:
            return await body(client)
        finally:
            await client.close()
            await server.close()

    return asyncio.run(main())


def run_cli(api: FakeApi, args: list[str], monkeypatch: pytest.MonkeyPatch) -> Result:
    """``agentq ARGS`` against the fake API server (the CLI blocks: run in a thread)."""

    async def main_() -> Result:
        server = await serve(api)
        config = kube.KubeConfig(
            server=str(server.make_url("")).rstrip("/"),
            credentials=kube.Credentials(),
            namespace="ns",
            source="test",
        )
        monkeypatch.setattr(ops_tasks, "find_config", lambda *_: config)
        try:
            return await asyncio.to_thread(CliRunner().invoke, main, args)
        finally:
            await server.close()

    return asyncio.run(main_())


def verbs(api: FakeApi) -> list[tuple[str, str]]:
    return [(verb, q.get("resourceVersion", "")) for verb, q in api.requests]


def test_a_wait_is_one_list_and_one_watch_resumed_from_the_last_version() -> None:
    api = FakeApi(
        lists=[listing(10, task("a", "Running", 9))],
        watches=[
            [event("MODIFIED", task("a", "Running", 11)), bookmark(15)],  # then the server ends it
            [event("MODIFIED", task("a", "Succeeded", 16, result={"n": 1}))],
        ],
    )
    outcome = run(api, lambda c: c.task("a").outcome(timeout=10))
    assert outcome.end is End.SUCCEEDED and outcome.result == {"n": 1}
    assert verbs(api) == [("LIST", ""), ("WATCH", "10"), ("WATCH", "15")]
    assert all(q["fieldSelector"] == "metadata.name=a" for _, q in api.requests)
    assert api.requests[1][1]["allowWatchBookmarks"] == "true"


def test_a_wait_that_times_out_made_two_requests() -> None:
    api = FakeApi(lists=[listing(10, task("a", "Running", 9))], watches=[[HANG]])
    outcome = run(api, lambda c: c.task("a").outcome(timeout=1.0))
    assert outcome.end is End.TIMEOUT and outcome.phase == "Running"
    assert verbs(api) == [("LIST", ""), ("WATCH", "10")]


def test_a_list_slower_than_the_timeout_is_still_waited_for() -> None:
    """A loaded API server answering the first LIST after the timeout: the tasks are
    judged on what it says (Failed, not found), not reported as unfinished."""
    api = FakeApi(
        lists=[listing(10, task("a", "Failed", 9, reason="AgentError"))],
        watches=[[HANG]],
        list_delay=0.8,
    )
    outcomes = run(api, lambda c: c.wait_all(["a", "ghost"], timeout=0.1))
    assert [(o.name, o.end) for o in outcomes] == [("a", End.FAILED), ("ghost", End.NOT_FOUND)]


@pytest.mark.parametrize("gone", [410, [event("ERROR", {"kind": "Status", "code": 410})]])
def test_410_gone_lists_again(gone: Any) -> None:
    api = FakeApi(
        lists=[listing(10, task("a", "Running", 9)), listing(30, task("a", "Succeeded", 29))],
        watches=[gone, [HANG]],
    )

    async def wait(client: AsyncClient) -> Any:
        outcome = await client.task("a").outcome(timeout=10)
        return outcome, client.relists

    outcome, relists = run(api, wait)
    assert outcome.end is End.SUCCEEDED and relists == 1
    assert verbs(api) == [("LIST", ""), ("WATCH", "10"), ("LIST", "")]


def test_a_task_missing_from_the_new_list_was_deleted() -> None:
    api = FakeApi(lists=[listing(10, task("a", "Running", 9)), listing(30)], watches=[410])
    outcome = run(api, lambda c: c.task("a").outcome(timeout=10))
    assert outcome.end is End.DELETED and outcome.phase == "Running"


def test_a_failed_watch_is_asked_again_after_a_backoff() -> None:
    api = FakeApi(
        lists=[listing(10, task("a", "Running", 9))],
        watches=[500, [event("MODIFIED", task("a", "Failed", 12, error={"reason": "X"}))]],
    )
    outcome = run(api, lambda c: c.task("a").outcome(timeout=10))
    assert outcome.end is End.FAILED
    assert verbs(api) == [("LIST", ""), ("WATCH", "10"), ("WATCH", "10")]


def test_a_refusal_is_raised_not_retried() -> None:
    api = FakeApi(lists=[403], watches=[[HANG]])
    with pytest.raises(ApiError, match="scripted 403") as raised:
        run(api, lambda c: c.task("a").outcome(timeout=10))
    assert raised.value.status == 403
    assert len(api.requests) == 1


def test_no_api_server_is_said_at_once() -> None:
    async def main() -> None:
        config = kube.KubeConfig(
            server=f"http://127.0.0.1:{free_port()}", credentials=kube.Credentials()
        )
        async with AsyncClient(config, namespace="ns") as client:
            await client.task("a").outcome(timeout=30)

    with pytest.raises(Unreachable, match="cannot reach the API server"):
        asyncio.run(main())


def test_many_names_share_one_watch_of_the_namespace() -> None:
    names = [f"t{i}" for i in range(12)]
    api = FakeApi(
        lists=[listing(10, *(task(n, "Succeeded", 5) for n in names[1:]), task("t0", None, 5))],
        watches=[[event("MODIFIED", task("t0", "Cancelled", 11))]],
    )
    outcomes = run(api, lambda c: c.wait_all(names, timeout=10))
    assert [o.name for o in outcomes] == names  # in the order asked
    assert outcomes[0].end is End.CANCELLED
    assert verbs(api) == [("LIST", ""), ("WATCH", "10")]
    assert "fieldSelector" not in api.requests[0][1]


def test_a_selector_follows_its_matches_with_one_watch() -> None:
    api = FakeApi(
        lists=[listing(10, task("b", "Running", 9), task("a", "Succeeded", 8))],
        watches=[[event("ADDED", task("c", None, 11)), event("MODIFIED", task("b", "Failed", 12))]],
    )

    async def wait(client: AsyncClient) -> list[Any]:
        return [o async for o in client.as_completed(selector="batch=7", timeout=10)]

    outcomes = run(api, wait)
    assert [(o.name, o.end) for o in outcomes] == [("a", End.SUCCEEDED), ("b", End.FAILED)]
    assert [q.get("labelSelector") for _, q in api.requests] == ["batch=7", "batch=7"]


def test_a_submitted_task_is_watched_from_the_create_without_a_list() -> None:
    api = FakeApi(
        lists=[listing(1)],
        creates=[task("job-x1", None, 40)],
        watches=[[event("MODIFIED", task("job-x1", "Succeeded", 41, result="ok"))]],
    )

    async def submit_and_wait(client: AsyncClient) -> Any:
        handle = await client.submit(generate_name="job-", payload={"p": 1})
        return handle.name, await handle.wait(timeout=10)

    assert run(api, submit_and_wait) == ("job-x1", "ok")
    assert verbs(api) == [("POST", ""), ("WATCH", "40")]
    assert api.requests[0][1] == {"fieldValidation": "Strict"}


def test_the_blocking_client_waits_and_raises_the_tasks_error() -> None:
    api = FakeApi(
        lists=[listing(10, task("a", "Running", 9)), listing(10, task("b", "Running", 9))],
        watches=[
            [event("MODIFIED", task("a", "Succeeded", 11, result=[1]))],
            [event("MODIFIED", task("b", "DeadLettered", 12, error={"reason": "AgentError"}))],
        ],
    )

    async def main() -> None:
        server = await serve(api)
        config = kube.KubeConfig(
            server=str(server.make_url("")).rstrip("/"), credentials=kube.Credentials()
        )
        try:
            await asyncio.to_thread(blocking, config)
        finally:
            await server.close()

    def blocking(config: kube.KubeConfig) -> None:
        with Client(config, namespace="ns") as client:
            assert client.task("a").wait(timeout=10) == [1]
            with pytest.raises(TaskFailed, match="DeadLettered") as raised:
                client.task("b").wait(timeout=10)
            assert raised.value.error == {"reason": "AgentError"}

    asyncio.run(main())


def test_the_blocking_client_refuses_to_wait_on_its_own_thread() -> None:
    """(It would wait for itself for ever: a callback run on its loop, a generator
    collected there.)"""
    config = kube.KubeConfig(
        server=f"http://127.0.0.1:{free_port()}", credentials=kube.Credentials()
    )
    with Client(config, namespace="ns") as client:

        async def on_the_loop() -> None:
            client.task("a").status()

        with pytest.raises(RuntimeError, match="from its own event loop's thread"):
            client._run(on_the_loop())


def test_a_task_deleted_as_it_finishes_is_judged_by_its_last_state() -> None:
    """ttlSecondsAfterFinished: 0: the task is gone before any LIST could see it; a wait
    from the create's answer still sees it end (the DELETED event carries its status),
    for more names than get a watch each too."""
    names = [f"job-{i}" for i in range(10)]
    api = FakeApi(
        lists=[listing(1)],  # a LIST would find none of them
        creates=[task(n, None, 40 + i) for i, n in enumerate(names)],
        watches=[
            [event("MODIFIED", task(n, "Running", 60 + i)) for i, n in enumerate(names)]
            + [
                event("DELETED", task(n, "Succeeded", 80 + i, result=i))
                for i, n in enumerate(names)
            ]
        ],
    )

    async def submit_and_wait(client: AsyncClient) -> Any:
        handles = [await client.submit(name=n, payload={}) for n in names]
        return await client.wait_all(handles, timeout=10)

    outcomes = run(api, submit_and_wait)
    assert [(o.name, o.end, o.result) for o in outcomes] == [
        (n, End.SUCCEEDED, i) for i, n in enumerate(names)
    ]
    assert verbs(api)[len(names) :] == [("WATCH", "40")]  # from the oldest create, no LIST


def test_submit_wait_follows_the_create_not_a_later_list(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    manifest = tmp_path / "t.yaml"
    manifest.write_text(json.dumps(task("job-x1", None, 0)))
    api = FakeApi(
        lists=[listing(1)],
        creates=[task("job-x1", None, 40)],
        watches=[[event("DELETED", task("job-x1", "Succeeded", 42, result="ok"))]],
    )
    result = run_cli(api, ["submit", "-f", str(manifest), "--wait", "--timeout", "10"], monkeypatch)
    assert result.exit_code == 0, result.output
    assert 'agenttask/job-x1 Succeeded: "ok"' in result.output
    assert verbs(api) == [("POST", ""), ("WATCH", "40")]


def test_a_selector_list_that_never_answers_is_a_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    """Not "no task matches": which tasks match is not known."""
    monkeypatch.setattr(aio, "FIRST_LOOK_GRACE", 0.2)
    api = FakeApi(lists=[listing(10, task("a", "Running", 9))], watches=[[HANG]], list_delay=2.0)
    with pytest.raises(ListTimeout, match="no answer to the LIST of agenttasks matching 'b=7'"):
        run(api, lambda c: c.wait_all(selector="b=7", timeout=0.1))
    result = run_cli(api, ["wait", "-l", "b=7", "--timeout", "0.1"], monkeypatch)
    assert result.exit_code == 5, result.output
    assert "timed out: no answer to the LIST" in result.output


def test_a_watch_that_ends_at_once_is_asked_again_after_a_backoff() -> None:
    """A proxy answering 200 and closing at once: not a storm of WATCHes."""
    api = FakeApi(lists=[listing(10, task("a", "Running", 9))], watches=[[]])
    outcome = run(api, lambda c: c.task("a").outcome(timeout=1.0))
    assert outcome.end is End.TIMEOUT
    assert 2 <= len(api.requests) <= 7, verbs(api)
