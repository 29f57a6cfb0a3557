"""The sidecar's API client sends the credentials the kubernetes config loaders found."""

from __future__ import annotations

from pathlib import Path

import yaml

from agentq.sidecar.kubeapi import KubeApi, load_configuration


def test_a_bearer_token_from_a_kubeconfig_is_sent(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:6443"}}],
                "users": [{"name": "u", "user": {"token": "s3cret"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    api = KubeApi(load_configuration(str(kubeconfig)))
    assert api._headers()["authorization"].lower() == "bearer s3cret"


def test_the_in_cluster_token_is_read_and_refreshed(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from kubernetes import client
    from kubernetes.config.incluster_config import InClusterConfigLoader

    token = tmp_path / "token"
    ca = tmp_path / "ca.crt"
    token.write_text("first")
    ca.write_text("not really a certificate")
    cfg = client.Configuration()
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    InClusterConfigLoader(
        token_filename=str(token), cert_filename=str(ca), try_refresh_token=True
    ).load_and_set(cfg)
    api = KubeApi(cfg)
    assert api._headers()["authorization"].lower() == "bearer first"  # the scheme is case-blind


def test_a_credential_refresh_that_fails_is_an_api_error_callers_retry() -> None:
    """The refresh hook of the kubernetes config loaders (in-cluster token rotation,
    exec plugins) runs before each request, outside the request's error handling: its
    exception (an unreadable or empty token file: ConfigException, OSError) escaped as
    itself. The agent's report was then answered 500 Internal, which the agent client
    does not retry (503 ApiUnavailable it does), and a renewal's task died with the
    exception unobserved. It is an ApiError with status 0, like an unreachable server."""
    import asyncio

    import pytest
    from kubernetes import client
    from kubernetes.config.config_exception import ConfigException

    from agentq.sidecar.kubeapi import ApiError

    def refresh(cfg: client.Configuration) -> None:
        raise ConfigException("Token file exists but empty.")

    cfg = client.Configuration()
    cfg.host = "http://127.0.0.1:9"
    cfg.api_key["BearerToken"] = "bearer old"
    cfg.refresh_api_key_hook = refresh
    api = KubeApi(cfg)

    async def request() -> None:
        try:
            with pytest.raises(ApiError) as failed:
                await api.request("GET", "/api", resource="leases")
            assert failed.value.status == 0 and "Token file" in failed.value.message
            with pytest.raises(ApiError) as watch:
                async for _ in api.watch("/api", resource="leases", params={}, timeout_seconds=1):
                    pass
            assert watch.value.status == 0
        finally:
            await api.close()

    asyncio.run(request())
