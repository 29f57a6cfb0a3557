"""Credentials kept fresh, and refusals known: exec plugins (run, cached until their
expiry, run again), a 401 answered by refreshing once, a 403 refused at once -- against
a local HTTP server that accepts one token at a time."""

from __future__ import annotations

import asyncio
import datetime
from pathlib import Path

import pytest
from aiohttp import web

from agentq import kube
from agentq.kube import Client, CredentialError, Credentials, KubeConfig
from agentq.operator.port import KubeError, Status
from agentq.operator.rest import RestKube
from agentq.sidecar.kubeapi import ApiError, KubeApi
from execplugin import ExecPlugin, token_status
from harness import run

V1 = "client.authentication.k8s.io/v1"


def later(seconds: float) -> str:
    stamp = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=seconds)
    return stamp.strftime("%Y-%m-%dT%H:%M:%SZ")


def plugin_credentials(plugin: ExecPlugin, **kwargs: object) -> Credentials:
    return Credentials(
        exec_plugin=kube.ExecPlugin.parse(plugin.user()["exec"], plugin.dir),
        cluster_info={"server": "https://api.example:6443", "ca": b"CA", "insecure": False},
        **kwargs,  # type: ignore[arg-type]
    )


@run
async def test_an_exec_plugin_is_run_per_the_protocol_and_cached_until_it_expires(
    tmp_path: Path,
) -> None:
    plugin = ExecPlugin(tmp_path / "plugin")
    plugin.set([token_status("one", expires=later(3600)), token_status("two", expires=later(7200))])
    now = [datetime.datetime.now(datetime.UTC)]
    credentials = plugin_credentials(plugin, now=lambda: now[0])
    first = await credentials.current()
    assert first.headers == {"Authorization": "Bearer one"}
    assert first.expires is not None
    assert (await credentials.current()).headers == {"Authorization": "Bearer one"}  # cached
    assert len(plugin.runs) == 1
    now[0] += datetime.timedelta(seconds=3601)  # past its expirationTimestamp: run again
    assert (await credentials.current()).headers == {"Authorization": "Bearer two"}
    runs = plugin.runs
    assert len(runs) == 2
    assert runs[0]["args"] == ["--flag", "value"] and runs[0]["env"] == "from-kubeconfig"
    info = runs[0]["info"]
    assert info["apiVersion"] == V1 and info["kind"] == "ExecCredential"
    assert info["spec"]["interactive"] is False
    assert info["spec"]["cluster"]["server"] == "https://api.example:6443"


@run
async def test_an_exec_plugin_may_hand_out_a_client_certificate(tmp_path: Path) -> None:
    plugin = ExecPlugin(tmp_path / "plugin")
    plugin.set([{"clientCertificateData": "CERT", "clientKeyData": "KEY"}])
    auth = await plugin_credentials(plugin).current()
    assert (auth.headers, auth.cert, auth.expires) == ({}, (b"CERT", b"KEY"), None)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("exit 3", "exited 3: plugin failed on purpose"),
        ('{"apiVersion": "client.authentication.k8s.io/v1beta1", "token": "x"}', "apiVersion"),
        ("{}", "neither a token nor a client certificate"),
    ],
)
def test_a_plugin_that_gives_no_credential_is_a_credential_error(
    tmp_path: Path, line: str, message: str
) -> None:
    plugin = ExecPlugin(tmp_path / "plugin")
    plugin.set([line])
    with pytest.raises(CredentialError, match=message):
        asyncio.run(plugin_credentials(plugin).current())


class Server:
    """Answers 200 to the one token it accepts, 403 to ``forbidden`` paths, else 401."""

    def __init__(self) -> None:
        self.accepted = ""
        self.seen: list[str] = []

    async def handle(self, request: web.Request) -> web.Response:
        self.seen.append(request.headers.get("Authorization", ""))
        if request.headers.get("Authorization") != f"Bearer {self.accepted}":
            return web.json_response({"kind": "Status", "message": "Unauthorized"}, status=401)
        if "forbidden" in request.path:
            return web.json_response({"kind": "Status", "message": "forbidden by RBAC"}, status=403)
        return web.json_response({"metadata": {"name": "x", "resourceVersion": "7"}})


async def serve(server: Server) -> tuple[web.AppRunner, str]:
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", server.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}"


@run
async def test_a_401_refreshes_the_credential_once_and_a_403_is_a_known_refusal(
    tmp_path: Path,
) -> None:
    server = Server()
    runner, url = await serve(server)
    plugin = ExecPlugin(tmp_path / "plugin")
    plugin.set([token_status("old"), token_status("new"), token_status("newer")])
    client = Client(KubeConfig(server=url, credentials=plugin_credentials(plugin)))
    port = RestKube(client)
    try:
        server.accepted = "new"  # the plugin's first token was revoked
        rsp = await client.request("GET", "/apis/coordination.k8s.io/v1/namespaces/n/leases/x")
        assert (rsp.status, rsp.attempts, len(plugin.runs)) == (200, 2, 2)
        reply = await port.get_lease("n", "x")  # the refreshed token is kept
        assert reply.status is Status.OK and len(plugin.runs) == 2

        server.accepted = "nobody"  # refused even after a refresh: a known refusal
        reply = await port.get_lease("n", "x")
        assert reply.status is Status.FORBIDDEN and "401" in reply.message
        assert len(plugin.runs) == 3  # refreshed once, not forever

        server.accepted = "newer"
        reply = await port.create_event("forbidden", {"kind": "Event"})
        assert reply.status is Status.FORBIDDEN and "forbidden by RBAC" in reply.message
        assert len(plugin.runs) == 3  # a 403 is not cured by a new credential
    finally:
        await client.close()
        await runner.cleanup()


@run
async def test_a_static_token_refused_is_not_sent_twice_and_no_answer_is_unknown(
    tmp_path: Path,
) -> None:
    server = Server()
    runner, url = await serve(server)
    client = Client(KubeConfig(server=url, credentials=Credentials(token="static")))
    try:
        rsp = await client.request("GET", "/api")
        assert (rsp.status, rsp.attempts, server.seen) == (401, 1, ["Bearer static"])
    finally:
        await client.close()
        await runner.cleanup()
    with pytest.raises(KubeError):  # the server is gone: the outcome is unknown
        await RestKube(client).get_lease("n", "x")
    await client.close()


@run
async def test_no_credential_is_forbidden_for_the_operator_and_unreachable_for_the_sidecar(
    tmp_path: Path,
) -> None:
    """Nothing was sent: the operator has a known outcome (FORBIDDEN), the sidecar an
    ApiError(0) it retries like an unreachable server (an unreadable token file may be
    a rotation in progress)."""
    empty = tmp_path / "token"
    empty.write_text("")
    config = KubeConfig(server="http://127.0.0.1:9", credentials=Credentials(token_file=empty))
    reply = await RestKube(Client(config)).get_lease("n", "x")
    assert reply.status is Status.FORBIDDEN and "empty" in reply.message
    api = KubeApi(Client(config))
    with pytest.raises(ApiError) as failed:
        await api.request("GET", "/api", resource="leases")
    assert failed.value.status == 0 and "empty" in failed.value.message
    with pytest.raises(ApiError) as watch:
        async for _ in api.watch("/api", resource="leases", params={}, timeout_seconds=1):
            pass
    assert watch.value.status == 0
    await api.close()


@run
async def test_the_sidecar_counts_a_refreshed_401_as_the_two_requests_it_was(
    tmp_path: Path,
) -> None:
    server = Server()
    runner, url = await serve(server)
    plugin = ExecPlugin(tmp_path / "plugin")
    plugin.set([token_status("old"), token_status("new")])
    api = KubeApi(Client(KubeConfig(server=url, credentials=plugin_credentials(plugin))))
    try:
        server.accepted = "new"
        await api.request("GET", "/apis/x", resource="leases")
        assert api.requests[("GET", "leases")] == 2
        await api.request("GET", "/apis/x", resource="leases")
        assert api.requests[("GET", "leases")] == 3
        with pytest.raises(ApiError) as refused:
            await api.request("GET", "/apis/forbidden", resource="leases")
        assert refused.value.status == 403
    finally:
        await api.close()
        await runner.cleanup()
