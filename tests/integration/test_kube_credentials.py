"""Operator, sidecar and CLI through a kubeconfig whose user is an exec plugin, on the
real API server: each runs the plugin, and when the API server stops taking the token
it handed out (a TokenRequest token bound to a Pod that is then deleted) each runs it
again once and carries on -- no 401 retried as an unknown outcome, no restart."""

from __future__ import annotations

import base64
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import urllib3
import yaml
from kubernetes import client

import accounts
from builders import task
from execplugin import ExecPlugin, token_status
from fleet import AGENTQ, ControlPlane, Fleet

ACCOUNT = "exec-user"


def exec_kubeconfig(admin: str, plugin: ExecPlugin, path: Path, namespace: str) -> str:
    """The admin kubeconfig's cluster, the plugin as its user."""
    config = yaml.safe_load(Path(admin).read_text())
    config["users"] = [{"name": "exec", "user": plugin.user()}]
    cluster = config["clusters"][0]["name"]
    config["contexts"] = [
        {"name": "exec", "context": {"cluster": cluster, "user": "exec", "namespace": namespace}}
    ]
    config["current-context"] = "exec"
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return str(path)


def refused(plane: ControlPlane, token: str) -> bool:
    """Whether the API server refuses ``token`` now (401)."""
    admin = yaml.safe_load(Path(plane.kubeconfig).read_text())
    cluster = admin["clusters"][0]["cluster"]
    ca = base64.b64decode(cluster["certificate-authority-data"]).decode()
    http = urllib3.PoolManager(cert_reqs="CERT_REQUIRED", ca_cert_data=ca)
    try:
        rsp = http.request(
            "GET", cluster["server"] + "/api", headers={"Authorization": f"Bearer {token}"}
        )
    finally:
        http.clear()
    return rsp.status == 401


@pytest.fixture
def account(control_plane: ControlPlane, fleet: Fleet) -> Any:
    """A ServiceAccount of the test's namespace that may do anything (the RBAC is not
    what is tested here), and a CoreV1Api to mint its tokens."""
    api = control_plane.api_client()
    core = client.CoreV1Api(api)
    accounts.create_account(core, fleet.namespace, ACCOUNT)
    binding = f"agentq-exec-{fleet.namespace}"
    control_plane.kubectl(
        "create", "clusterrolebinding", binding, "--clusterrole=cluster-admin",
        f"--serviceaccount={fleet.namespace}:{ACCOUNT}",
    )  # fmt: skip
    try:
        yield core
    finally:
        control_plane.kubectl("delete", "clusterrolebinding", binding, check=False)
        api.close()


def test_operator_sidecar_and_cli_refresh_an_exec_credential_the_api_server_stopped_taking(
    control_plane: ControlPlane, fleet: Fleet, account: client.CoreV1Api, tmp_path: Path
) -> None:
    ns = fleet.namespace
    plugins: dict[str, ExecPlugin] = {}
    kubeconfigs: dict[str, str] = {}
    firsts: list[str] = []
    for who in ("operator", "sidecar", "cli"):
        pod = accounts.bound_pod(account, ns, ACCOUNT, f"{who}-first")
        first = accounts.token(account, ns, ACCOUNT, pod=pod)
        second = accounts.token(account, ns, ACCOUNT)
        firsts.append(first)
        plugins[who] = ExecPlugin(tmp_path / f"plugin-{who}")
        plugins[who].set([token_status(first), token_status(second)])
        kubeconfigs[who] = exec_kubeconfig(
            control_plane.kubeconfig, plugins[who], tmp_path / f"{who}.kubeconfig", ns
        )

    fleet.agent("w", "complete", kubeconfig=kubeconfigs["sidecar"], capabilities="llm")
    operator = fleet.operator(env={"KUBECONFIG": kubeconfigs["operator"]})
    fleet.add_task(task("one").requires("llm"))
    fleet.wait_phase("one", "Succeeded", timeout=60)
    assert [len(plugins[w].runs) for w in ("operator", "sidecar")] == [1, 1]

    # The first tokens stop working: the Pods they are bound to are deleted (the API
    # server may go on taking a token it authenticated for up to its 10 s cache).
    for who in plugins:
        account.delete_namespaced_pod(f"{who}-first", ns, grace_period_seconds=0)
    deadline = time.monotonic() + 60
    while not all(refused(control_plane, t) for t in firsts):
        assert time.monotonic() < deadline, "the deleted pods' tokens are still accepted"
        time.sleep(1)

    fleet.add_task(task("two").requires("llm"))
    fleet.wait_phase("two", "Succeeded", timeout=60)
    assert [len(plugins[w].runs) for w in ("operator", "sidecar")] == [2, 2], fleet.logs()
    assert "forbidden" not in operator.text().lower(), operator.text()[-3000:]

    done = subprocess.run(
        [AGENTQ, "explain", "two"],
        env={**os.environ, "KUBECONFIG": kubeconfigs["cli"]},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "two" in done.stdout and "Succeeded" in done.stdout, done.stdout
    runs = plugins["cli"].runs
    assert len(runs) == 2  # the first token refused (401), the second taken
    info = runs[0]["info"]
    assert (
        info["spec"]["cluster"]["server"]
        == yaml.safe_load(Path(control_plane.kubeconfig).read_text())["clusters"][0]["cluster"][
            "server"
        ]
    )


def test_the_cli_presents_a_client_certificate_an_exec_plugin_hands_out(
    control_plane: ControlPlane, fleet: Fleet, tmp_path: Path
) -> None:
    """The certificate is TLS material, not a header: a new connection presents it."""
    admin = yaml.safe_load(Path(control_plane.kubeconfig).read_text())["users"][0]["user"]
    plugin = ExecPlugin(tmp_path / "plugin")
    plugin.set(
        [
            {
                "clientCertificateData": base64.b64decode(
                    admin["client-certificate-data"]
                ).decode(),
                "clientKeyData": base64.b64decode(admin["client-key-data"]).decode(),
            }
        ]
    )
    kubeconfig = exec_kubeconfig(
        control_plane.kubeconfig, plugin, tmp_path / "kubeconfig", fleet.namespace
    )
    done = subprocess.run(
        [AGENTQ, "top", "--once"],
        env={**os.environ, "KUBECONFIG": kubeconfig},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert len(plugin.runs) == 1
