"""The sidecar's API client is ``agentq.kube``'s, with the sidecar's counting and errors
(credentials and refusals: tests/unit/kube)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import yaml

from agentq.sidecar.kubeapi import KubeApi


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
    api = KubeApi.from_kubeconfig(str(kubeconfig))
    assert api.client.server == "https://127.0.0.1:6443"
    auth = asyncio.run(api.client.credentials.current())
    assert auth.headers == {"Authorization": "Bearer s3cret"}
