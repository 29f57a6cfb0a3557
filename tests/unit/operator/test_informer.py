"""The informer against a scripted HTTP endpoint: a 410 relist reports what vanished as
deleted (no ghost tasks), and no watch line, however deep, stops it.

The endpoint is a few lines of aiohttp.web serving canned LIST and WATCH answers: it
tests the informer's protocol handling, not Kubernetes (the integration tests do that).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from aiohttp import web

from agentq.kube import Client, Credentials, KubeConfig
from agentq.operator.informer import Informer
from agentq.operator.main import unfinished
from harness import run

PATH = "/apis/agentq.dev/v1alpha1/namespaces/ns/agenttasks"


def obj(name: str, rv: str, **extra: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ns", "resourceVersion": rv}, **extra}


class Script:
    """Serves each LIST and each WATCH from a queue of canned answers."""

    def __init__(self) -> None:
        self.lists: list[dict[str, Any] | int] = []  # an int: that HTTP status
        self.watches: list[list[str] | int] = []
        self.requests: list[str] = []

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.requests.append(str(request.rel_url))
        if request.query.get("watch") != "1":
            listed = self.lists.pop(0)
            if isinstance(listed, int):
                return web.json_response({"code": listed}, status=listed)
            return web.json_response(listed)
        answer = self.watches.pop(0) if self.watches else []
        if isinstance(answer, int):
            return web.Response(status=answer)
        rsp = web.StreamResponse()
        await rsp.prepare(request)
        for line in answer:
            await rsp.write(line.encode() + b"\n")
        if not self.watches:
            await asyncio.sleep(3600)  # the last watch stays open
        return rsp


async def serve(script: Script) -> tuple[web.AppRunner, int]:
    app = web.Application()
    app.router.add_get(PATH, script.handle)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, port


@run
async def test_a_relist_after_410_reports_what_vanished_as_deleted() -> None:
    script = Script()
    script.lists = [
        {"metadata": {"resourceVersion": "10"}, "items": [obj("t1", "5"), obj("t2", "6")]},
        {"metadata": {"resourceVersion": "30"}, "items": [obj("t1", "25")]},
    ]
    deep = '{"a":' * 5000 + "1" + "}" * 5000
    script.watches = [
        [json.dumps({"type": "ERROR", "object": {"code": 410, "message": "too old"}})],
        [
            '{"type":"ADDED","object":{"metadata":{"name":"deep","namespace":"ns",'
            f'"resourceVersion":"31"}},"spec":{{"payload":{deep}}}}}}}',
            "not json at all",
            json.dumps({"type": "BOOKMARK", "object": obj("", "40")}),
        ],
    ]
    runner, port = await serve(script)
    events: list[tuple[str, str]] = []
    health: list[bool] = []
    synced: list[int] = []
    client = Client(KubeConfig(server=f"http://127.0.0.1:{port}", credentials=Credentials()))
    informer = Informer(
        client,
        path=PATH,
        plural="agenttasks",
        on_event=lambda plural, kind, body, size: events.append((kind, body["metadata"]["name"])),
        on_synced=lambda: synced.append(1),
        on_health=health.append,
    )
    stop = asyncio.Event()
    task = asyncio.create_task(informer.run(stop))
    for _ in range(100):
        await asyncio.sleep(0.05)
        if informer.resource_version == "40":
            break
    task.cancel()
    await client.close()
    await runner.cleanup()
    assert ("DELETED", "t2") in events, events
    assert events.index(("DELETED", "t2")) > events.index(("ADDED", "t2"))
    assert ("ADDED", "deep") in events
    assert informer.relists == 1 and informer.undecodable == 1
    assert informer.resource_version == "40"
    assert len(synced) == 2 and health[-1] is True
    watches = [r for r in script.requests if "watch=1" in r]
    assert "resourceVersion=10" in watches[0] and "allowWatchBookmarks=true" in watches[0]


@run
async def test_a_list_restarted_after_a_410_on_its_continue_token_watches_from_the_new_list() -> (
    None
):
    """The first page of a paginated LIST said version 10; its continue token then
    expired (410) and the list started over, at version 30. The watch must resume from
    30: from 10 it would replay (or, compacted, 410 again) what the second list holds."""
    script = Script()
    script.lists = [
        {"metadata": {"resourceVersion": "10", "continue": "c1"}, "items": [obj("t1", "5")]},
        410,
        {"metadata": {"resourceVersion": "30"}, "items": [obj("t1", "25"), obj("t2", "26")]},
    ]
    runner, port = await serve(script)
    client = Client(KubeConfig(server=f"http://127.0.0.1:{port}", credentials=Credentials()))
    informer = Informer(
        client,
        path=PATH,
        plural="agenttasks",
        on_event=lambda plural, kind, body, size: None,
        on_synced=lambda: None,
        on_health=lambda ok: None,
    )
    task = asyncio.create_task(informer.run(asyncio.Event()))
    for _ in range(100):
        await asyncio.sleep(0.05)
        if any("watch=1" in r for r in script.requests):
            break
    task.cancel()
    await client.close()
    await runner.cleanup()
    watches = [r for r in script.requests if "watch=1" in r]
    assert watches and "resourceVersion=30" in watches[0], script.requests


@run
async def test_finished_tasks_are_not_remembered_for_the_relist() -> None:
    """The controller keeps no record of a finished task, nor does the informer (its
    memory for finished tasks stays bounded); an unfinished one it does remember."""
    script = Script()
    done = obj("done", "5", status={"phase": "Succeeded"})
    script.lists = [{"metadata": {"resourceVersion": "10"}, "items": [obj("t1", "4"), done]}]
    script.watches = [
        [
            json.dumps({"type": "MODIFIED", "object": obj("t1", "11", status={"phase": "Failed"})}),
            json.dumps({"type": "BOOKMARK", "object": obj("", "12")}),
        ]
    ]
    runner, port = await serve(script)
    events: list[tuple[str, str]] = []
    client = Client(KubeConfig(server=f"http://127.0.0.1:{port}", credentials=Credentials()))
    informer = Informer(
        client,
        path=PATH,
        plural="agenttasks",
        on_event=lambda plural, kind, body, size: events.append((kind, body["metadata"]["name"])),
        on_synced=lambda: None,
        on_health=lambda ok: None,
        keep=unfinished,
    )
    stop = asyncio.Event()
    task = asyncio.create_task(informer.run(stop))
    for _ in range(100):
        await asyncio.sleep(0.05)
        if informer.resource_version == "12":
            break
    task.cancel()
    await client.close()
    await runner.cleanup()
    assert ("ADDED", "done") in events and ("MODIFIED", "t1") in events
    assert informer.known == {}, "neither the finished task nor the one that finished"
