"""Where the API server is and who we are: kubeconfigs (merged as kubectl merges them)
and the pod's account."""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path

import pytest
import yaml

from agentq import kube
from agentq.controlplane import pki
from agentq.kube import config


def write(path: Path, *, server: str, user: dict[str, object], current: str = "c") -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": current,
                "clusters": [{"name": "k", "cluster": {"server": server}}],
                "users": [{"name": "u", "user": user}],
                "contexts": [
                    {"name": "c", "context": {"cluster": "k", "user": "u", "namespace": "n1"}}
                ],
            }
        )
    )
    return path


def headers(conf: kube.KubeConfig) -> dict[str, str]:
    return dict(asyncio.run(conf.credentials.current()).headers)


def test_a_kubeconfig_with_client_certificates(tmp_path: Path) -> None:
    certs = pki.generate(tmp_path / "pki")
    kubeconfig = tmp_path / "kubeconfig"
    pki.write_kubeconfig(kubeconfig, server="https://127.0.0.1:6443", pki=certs)
    conf = kube.from_kubeconfig(kubeconfig)
    assert conf.server == "https://127.0.0.1:6443"
    assert conf.cert is not None
    assert isinstance(conf.ssl_context(), ssl.SSLContext)
    assert headers(conf) == {}


def test_a_kubeconfig_with_a_token_file_rereads_it(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("one\n")
    kubeconfig = write(
        tmp_path / "kubeconfig", server="http://127.0.0.1:8080/", user={"tokenFile": "token"}
    )
    conf = kube.from_kubeconfig(kubeconfig)  # tokenFile relative to the kubeconfig
    assert conf.server == "http://127.0.0.1:8080"
    assert conf.namespace == "n1"
    assert conf.ssl_context() is False
    clock = [0.0]
    conf.credentials._monotonic = lambda: clock[0]

    async def rotate() -> list[str]:
        seen = [(await conf.credentials.current()).headers["Authorization"]]
        token.write_text("two\n")
        seen.append((await conf.credentials.current()).headers["Authorization"])  # cached
        clock[0] += kube.credentials.TOKEN_REREAD_SECONDS + 1
        seen.append((await conf.credentials.current()).headers["Authorization"])
        token.write_text("three\n")
        await conf.credentials.refresh()  # a 401: read again at once
        seen.append((await conf.credentials.current()).headers["Authorization"])
        return seen

    assert asyncio.run(rotate()) == ["Bearer one", "Bearer one", "Bearer two", "Bearer three"]


def test_in_cluster_uses_the_service_account(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    certs = pki.generate(tmp_path / "pki")
    (tmp_path / "sa").mkdir()
    (tmp_path / "sa" / "token").write_text("sa-token")
    (tmp_path / "sa" / "namespace").write_text("agents")
    (tmp_path / "sa" / "ca.crt").write_bytes(certs.ca_cert.read_bytes())
    monkeypatch.setattr(config, "SERVICE_ACCOUNT_DIR", tmp_path / "sa")
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    conf = kube.load()
    assert conf.server == "https://10.0.0.1:443"
    assert conf.namespace == "agents"
    assert conf.credentials.refreshable  # the projected token rotates
    assert headers(conf) == {"Authorization": "Bearer sa-token"}


def test_in_a_pod_the_sidecar_never_falls_back_to_a_kubeconfig_someone_planted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The agent container could write a kubeconfig where the sidecar would look (a
    shared HOME): in a pod without its mounted account the sidecar refuses to start
    instead of taking that identity; outside a pod the kubeconfig is the way."""
    from agentq.sidecar.kubeapi import KubeApi

    home = tmp_path / "home"
    (home / ".kube").mkdir(parents=True)
    planted = write(
        home / ".kube" / "config", server="https://planted.example", user={"token": "planted"}
    )
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.setattr(config, "SERVICE_ACCOUNT_DIR", tmp_path / "no-account")
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    for variable in (None, str(planted)):
        if variable is not None:
            monkeypatch.setenv("KUBECONFIG", variable)
        with pytest.raises(kube.ConfigError, match="does not fall back"):
            KubeApi.from_kubeconfig(None)
    # Named explicitly (--kubeconfig), a kubeconfig is used in a pod too.
    named = KubeApi.from_kubeconfig(str(planted))
    assert named.client.config.server == "https://planted.example"
    asyncio.run(named.close())
    # Outside a pod (no Service address), ~/.kube/config is the default as for kubectl.
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST")
    monkeypatch.delenv("KUBECONFIG")
    local = KubeApi.from_kubeconfig(None)
    assert local.client.config.server == "https://planted.example"
    asyncio.run(local.close())


def test_kubeconfig_files_are_merged_as_kubectl_merges_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = write(tmp_path / "a", server="http://first:1", user={"token": "a"}, current="")
    second = write(tmp_path / "b", server="http://second:2", user={"token": "b"})
    monkeypatch.setenv("KUBECONFIG", f"{tmp_path / 'missing'}:{first}:{second}")
    conf = kube.from_kubeconfig()
    # the current-context comes from the second file, the entries from the first
    assert (conf.server, headers(conf)) == ("http://first:1", {"Authorization": "Bearer a"})


def test_a_missing_context_and_an_auth_provider_are_clear_errors(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("apiVersion: v1\nkind: Config\ncurrent-context: nope\n")
    with pytest.raises(kube.ConfigError, match="nope"):
        kube.from_kubeconfig(kubeconfig)
    provider = write(
        tmp_path / "provider", server="https://x:1", user={"auth-provider": {"name": "gcp"}}
    )
    with pytest.raises(kube.ConfigError, match="exec plugin"):
        kube.from_kubeconfig(provider)
    with pytest.raises(kube.ConfigError, match="no kubeconfig found"):
        kube.from_kubeconfig(tmp_path / "absent")
