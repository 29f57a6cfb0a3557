"""Credentials for the operator's aiohttp client, from a kubeconfig or the pod's account."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest

from agentq.controlplane import pki
from agentq.operator import connection


def test_a_kubeconfig_with_client_certificates(tmp_path: Path) -> None:
    certs = pki.generate(tmp_path / "pki")
    kubeconfig = tmp_path / "kubeconfig"
    pki.write_kubeconfig(kubeconfig, server="https://127.0.0.1:6443", pki=certs)
    conn = connection.from_kubeconfig(kubeconfig)
    assert conn.server == "https://127.0.0.1:6443"
    assert isinstance(conn.ssl_context, ssl.SSLContext)
    assert conn.headers() == {}


def test_a_kubeconfig_with_a_token_file_rereads_it(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("one\n")
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: k, cluster: {server: 'http://127.0.0.1:8080/'}}]\n"
        f"users: [{{name: u, user: {{tokenFile: {token}}}}}]\n"
        "contexts: [{name: c, context: {cluster: k, user: u}}]\n"
    )
    conn = connection.from_kubeconfig(kubeconfig)
    assert conn.server == "http://127.0.0.1:8080"
    assert conn.headers() == {"Authorization": "Bearer one"}
    token.write_text("two\n")
    conn._token_read_at -= connection.TOKEN_REREAD_SECONDS + 1
    assert conn.headers() == {"Authorization": "Bearer two"}


def test_in_cluster_uses_the_service_account(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    certs = pki.generate(tmp_path / "pki")
    (tmp_path / "sa").mkdir()
    (tmp_path / "sa" / "token").write_text("sa-token")
    (tmp_path / "sa" / "ca.crt").write_bytes(certs.ca_cert.read_bytes())
    monkeypatch.setattr(connection, "SERVICE_ACCOUNT_DIR", tmp_path / "sa")
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    conn = connection.load()
    assert conn.server == "https://10.0.0.1:443"
    assert conn.headers() == {"Authorization": "Bearer sa-token"}


def test_a_missing_context_is_a_clear_error(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("apiVersion: v1\nkind: Config\ncurrent-context: nope\n")
    with pytest.raises(connection.ConnectionError_, match="nope"):
        connection.from_kubeconfig(kubeconfig)
