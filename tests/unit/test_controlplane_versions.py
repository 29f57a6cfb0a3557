"""The Python side looks for exactly the versions the Go wrapper modules build."""

from __future__ import annotations

import re

from agentq.controlplane import binaries
from agentq.controlplane.versions import (
    ETCD_VERSION,
    HELM_VERSION,
    KEDA_VERSION,
    KUBERNETES_VERSION,
)


def _required(go_mod: str, module: str) -> str:
    text = (binaries.source_dir() / go_mod).read_text()
    match = re.search(rf"^require {re.escape(module)} (\S+)$", text, re.M)
    assert match, f"{go_mod} does not require {module} on one line"
    return match.group(1)


def test_kubernetes_version_matches_wrapper_module() -> None:
    assert _required("kubernetes/go.mod", "k8s.io/kubernetes") == KUBERNETES_VERSION


def test_every_staging_module_is_pinned_to_the_matching_release() -> None:
    text = (binaries.source_dir() / "kubernetes/go.mod").read_text()
    staging = dict(re.findall(r"^\s*(k8s\.io/\S+) => \S+ (v\S+)$", text, re.M))
    assert "k8s.io/streaming" in staging and "k8s.io/cri-streaming" in staging
    expected = "v0." + KUBERNETES_VERSION.removeprefix("v1.")
    assert set(staging.values()) == {expected}


def test_etcd_version_matches_wrapper_module() -> None:
    assert _required("etcd/go.mod", "go.etcd.io/etcd/server/v3") == ETCD_VERSION


def test_helm_version_matches_wrapper_module() -> None:
    assert _required("helm/go.mod", "helm.sh/helm/v4") == HELM_VERSION


def test_keda_version_matches_build_pin() -> None:
    pinned = (binaries.source_dir() / "keda" / "VERSION").read_text().strip()
    assert pinned == KEDA_VERSION
