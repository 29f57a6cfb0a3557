"""kopf's watcher mode held to the informer's guarantees: kopf's failed LISTs and
WATCHes of our resources mark them unhealthy until a watch is answered again, and
"synced" waits until kopf has fed the controller every object a LIST showed."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import pytest

from agentq.kube import Client, Credentials, KubeConfig
from agentq.operator import kopfwatch
from agentq.operator.health import WatchHealth
from harness import run

TASKS = "/apis/agentq.dev/v1alpha1/namespaces/ns/agenttasks"
PLURALS = ["agenttasks", "agentworkers", "leases"]


def test_the_pinned_kopf_has_the_request_function_the_hook_wraps() -> None:
    from kopf._cogs.clients import api

    original = api.request
    hook = kopfwatch.KopfWatchHealth(WatchHealth(PLURALS), PLURALS, ["ns"])
    with hook.installed():
        assert api.request is not original
    assert api.request is original


@run
async def test_a_failing_kopf_watch_is_unhealthy_until_it_is_answered_again() -> None:
    health = WatchHealth(PLURALS)
    hook = kopfwatch.KopfWatchHealth(health, PLURALS, ["ns"])
    for plural in ("agentworkers", "leases"):
        hook.report(plural, "ns", True)
    calls: list[dict[str, Any]] = []
    outcomes: list[Exception | None] = [None, aiohttp.ClientConnectionError("refused"), None]
    seen: list[bool] = []

    async def original(method: str, url: str, **kwargs: Any) -> str:
        calls.append({"url": url, **kwargs})
        seen.append(health.healthy)
        outcome = outcomes.pop(0)
        if outcome is not None:
            raise outcome
        return "response"

    request = hook.wrap(original)
    assert await request("get", f"{TASKS}?watch=true&resourceVersion=5") == "response"
    assert health.healthy
    assert await request("get", f"{TASKS}?watch=true&resourceVersion=9") == "response"
    # the failure was seen at once (kopf's own retries would hide it for ~54 s) ...
    assert seen == [False, True, False] and hook.failures == 1
    assert all(call["backoffs"] == () for call in calls)
    assert health.healthy  # ... and the answered retry made it healthy again
    # anything else kopf asks passes untouched
    assert await hook.wrap(lambda *a, **k: asyncio.sleep(0, "other"))("get", "/apis") == "other"


@pytest.mark.parametrize(
    ("method", "url", "expected"),
    [
        ("get", "/apis/agentq.dev/v1alpha1/agenttasks?watch=true", ("agenttasks", None, True)),
        ("get", f"{TASKS}?limit=500", ("agenttasks", "ns", False)),
        (
            "get",
            "https://h:6443/apis/coordination.k8s.io/v1/namespaces/a/leases?watch=true",
            ("leases", "a", True),
        ),
        ("patch", f"{TASKS}/t1", None),
        ("get", "/apis/agentq.dev/v1alpha1", None),
    ],
)
def test_which_requests_are_watched_collections(method: str, url: str, expected: Any) -> None:
    assert kopfwatch._target_of(method, url, PLURALS) == expected


class Lister:
    """Answers the metadata LIST of tasks with ``items`` (name -> resourceVersion)."""

    def __init__(self, items: dict[str, str]) -> None:
        self.items = items
        self.lists = 0

    async def request(self, method: str, path: str, **kwargs: Any) -> Any:
        from agentq.kube import Response

        self.lists += 1
        assert "PartialObjectMetadataList" in kwargs["accept"]
        body = {
            "metadata": {"resourceVersion": "100"},
            "items": [
                {"metadata": {"name": n, "namespace": "ns", "resourceVersion": v}}
                for n, v in self.items.items()
            ],
        }
        return Response(200, json.dumps(body).encode())


def fed(name: str, rv: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ns", "resourceVersion": rv}}


@run
async def test_synced_waits_for_every_listed_object_at_its_listed_version(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(kopfwatch, "RELIST_SECONDS", 0.2)
    lister = Lister({"a": "10", "b": "20", "gone": "30"})
    synced: list[int] = []
    signal = kopfwatch.SyncSignal(
        lister,  # type: ignore[arg-type]
        [kopfwatch.Target("agenttasks", "ns", TASKS)],
        lambda: synced.append(1),
    )
    signal.note("agenttasks", "MODIFIED", fed("a", "10"))  # fed before the LIST: counts
    running = asyncio.create_task(signal.run())
    await asyncio.sleep(0.05)
    signal.note("agenttasks", "MODIFIED", fed("b", "15"))  # older than listed: not enough
    await asyncio.sleep(0.05)
    assert not synced
    signal.note("agenttasks", "MODIFIED", fed("b", "21"))
    await asyncio.sleep(0.05)
    assert not synced  # "gone" was never fed ...
    lister.items.pop("gone")  # ... for it was deleted before kopf listed: a new LIST drops it
    await asyncio.wait_for(running, 2)
    assert synced == [1] and lister.lists >= 2
    signal.note("agenttasks", "MODIFIED", fed("c", "40"))  # after synced: nothing kept
    assert not signal.fed


@run
async def test_synced_lists_metadata_only_on_the_real_client_path() -> None:
    """The LIST goes through agentq.kube's Client; a refused one is retried, not synced."""
    client = Client(KubeConfig(server="http://127.0.0.1:9", credentials=Credentials()))
    synced: list[int] = []
    signal = kopfwatch.SyncSignal(
        client, [kopfwatch.Target("agenttasks", "ns", TASKS)], lambda: synced.append(1)
    )
    running = asyncio.create_task(signal.run())
    await asyncio.sleep(0.5)
    assert not synced and not running.done()
    running.cancel()
    await client.close()


def test_an_object_too_deep_for_kopf_goes_to_the_controller_and_kopf_sees_a_bookmark() -> None:
    """kopf's json.loads raises RecursionError at ~1000 levels and its deepcopy of a body
    at ~400: one such AgentTask stopped kopf's watch (or wedged its processing) and the
    task stayed Pending. It goes to the controller directly, in watch and LIST alike."""
    fed: list[tuple[str, str, str]] = []
    hook = kopfwatch.KopfWatchHealth(
        WatchHealth(PLURALS),
        PLURALS,
        ["ns"],
        feed=lambda p, k, b, s: fed.append((p, k, b["metadata"]["name"])),
    )
    deep = '{"a":' * 500 + "1" + "}" * 500  # json.loads reads it; kopf's deepcopy does not
    line = (
        '{"type":"MODIFIED","object":{"kind":"AgentTask","metadata":{"name":"deep",'
        f'"namespace":"ns","resourceVersion":"41"}},"spec":{{"payload":{deep}}}}}}}'
    )
    assert hook.loads(line) == {
        "type": "BOOKMARK",
        "object": {"metadata": {"resourceVersion": "41"}},
    }
    # Deeper than json.loads goes: decoded all the same, cut below MAX_JSON_DEPTH (a marker
    # the controller fails as PayloadTooDeep), shallow enough for kopf.
    deeper = '{"a":' * 3000 + "1" + "}" * 3000
    cut = hook.loads(line.replace(deep, deeper))
    assert cut["type"] == "MODIFIED" and cut["object"]["metadata"]["name"] == "deep"
    shallow = json.dumps({"type": "ADDED", "object": {"kind": "AgentTask", **fed_body("ok")}})
    assert hook.loads(shallow)["object"]["metadata"]["name"] == "ok"  # kopf's, as before
    page = (
        '{"metadata":{"resourceVersion":"50"},"items":['
        f'{{"metadata":{{"name":"deep2","namespace":"ns"}},"spec":{{"payload":{deep}}}}},'
        + json.dumps(fed_body("fine"))
        + "]}"
    )
    listed = hook.listed(page.encode(), "agenttasks")
    assert [i["metadata"]["name"] for i in listed["items"]] == ["fine"]
    assert fed == [("agenttasks", "MODIFIED", "deep"), ("agenttasks", "MODIFIED", "deep2")]


def fed_body(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ns", "resourceVersion": "1"}}


@run
async def test_kopf_logs_in_with_agentq_credentials_refreshed_when_it_asks_again(
    tmp_path: Any,
) -> None:
    from agentq.operator.handlers import connection_info

    token = tmp_path / "token"
    token.write_text("one")
    config = KubeConfig(
        server="https://h:6443", credentials=Credentials(token_file=token), ca=b"CA"
    )
    first = await connection_info(config)
    assert (first.server, first.token, first.scheme, first.ca_data) == (
        "https://h:6443", "one", "Bearer", b"CA"
    )  # fmt: skip
    token.write_text("two")
    given = config.credentials.generation
    again = await connection_info(config, refused=given)  # kopf got a 401 with "one"
    assert again.token == "two"
    await config.credentials.refresh()  # another client refreshed meanwhile ...
    third = await connection_info(config, refused=given)  # ... no second refresh for kopf
    assert third.token == "two" and config.credentials.runs == 3
    basic = KubeConfig(server="https://h:6443", credentials=Credentials(basic=("u", "p:w")))
    info = await connection_info(basic)
    assert (info.username, info.password, info.token) == ("u", "p:w", None)
