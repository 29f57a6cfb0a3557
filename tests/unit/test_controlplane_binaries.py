"""The control plane's binaries: found where the user put them, else built, with clear errors."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from agentq.controlplane import binaries
from agentq.controlplane.versions import HELM_VERSION, KEDA_VERSION


@pytest.fixture
def empty_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("AGENTQ_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("KUBEBUILDER_ASSETS", raising=False)
    return tmp_path


def test_missing_go_is_named(empty_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(empty_cache / "no-bin"))
    with pytest.raises(
        binaries.BinaryError, match=re.escape("needs Go >= 1.26 on PATH; 'go' was not found")
    ):
        binaries.resolve(build=True, say=lambda _: None)


def test_no_build_names_what_is_missing(empty_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(empty_cache / "no-bin"))
    with pytest.raises(binaries.BinaryError, match="missing control-plane binaries etcd"):
        binaries.resolve(build=False)


def test_a_failed_build_shows_the_tail_of_its_log(
    empty_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = empty_cache / "src"
    source.mkdir()
    (source / "build.sh").write_text(
        "echo compiling k8s.io/kubernetes\necho 'link: out of memory' >&2\nexit 9\n"
    )
    monkeypatch.setenv("AGENTQ_CONTROLPLANE_SRC", str(source))
    go = empty_cache / "bin" / "go"
    go.parent.mkdir()
    go.write_text("#!/bin/sh\nexit 0\n")
    go.chmod(0o755)
    monkeypatch.setenv("PATH", f"{go.parent}:/usr/bin:/bin")
    with pytest.raises(binaries.BinaryError) as err:
        binaries.resolve(build=True, say=lambda _: None)
    assert "building the control plane failed (exit 9)" in str(err.value)
    assert "link: out of memory" in str(err.value)


def test_kubebuilder_assets_win(empty_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assets = empty_cache / "assets"
    assets.mkdir()
    for name in binaries.BINARIES:
        exe = assets / name
        exe.write_text("#!/bin/sh\n")
        exe.chmod(0o755)
    monkeypatch.setenv("KUBEBUILDER_ASSETS", str(assets))
    found = binaries.resolve(build=False)
    assert found == {name: assets / name for name in binaries.BINARIES}


def test_node_binaries_are_a_set_of_their_own(
    empty_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(empty_cache / "no-bin"))
    assert binaries.NODE.cache_dir() != binaries.CONTROL_PLANE.cache_dir()
    with pytest.raises(binaries.BinaryError) as err:
        binaries.resolve(build=False, binary_set=binaries.NODE)
    assert "missing node binaries kubelet, kube-scheduler, pause" in str(err.value)
    assert "agentq cluster build --node" in str(err.value)


def test_build_script_knows_the_node_set() -> None:
    script = (binaries.source_dir() / "build.sh").read_text()
    assert 'node) k8s_cmds="kubelet kube-scheduler"' in script
    go_mod = (binaries.source_dir() / "kubernetes" / "go.mod").read_text()
    for cmd in ("kubelet", "kube-scheduler"):
        assert f"k8s.io/kubernetes/cmd/{cmd}\n" in go_mod


def test_helm_is_a_set_of_its_own_cached_by_version(
    empty_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(empty_cache / "no-bin"))
    assert binaries.HELM.cache_dir() == empty_cache / "cache" / "helm" / HELM_VERSION
    with pytest.raises(binaries.BinaryError) as err:
        binaries.resolve(build=False, binary_set=binaries.HELM)
    assert "missing helm helm" in str(err.value)
    assert "agentq cluster build --helm" in str(err.value)
    script = (binaries.source_dir() / "build.sh").read_text()
    assert "helm.sh/helm/v4/cmd/helm" in script


def test_a_helm_on_path_of_another_version_is_not_taken(
    empty_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bin_dir = empty_cache / "bin"
    bin_dir.mkdir()
    helm = bin_dir / "helm"
    helm.write_text("#!/bin/sh\necho 'version.BuildInfo{Version:\"v3.18.4\"}'\n")
    helm.chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))
    with pytest.raises(binaries.BinaryError, match="missing helm"):
        binaries.resolve(build=False, binary_set=binaries.HELM)
    helm.write_text(f"#!/bin/sh\necho 'version.BuildInfo{{Version:\"{HELM_VERSION}\"}}'\n")
    assert binaries.resolve(build=False, binary_set=binaries.HELM) == {"helm": helm}


def test_keda_is_a_set_of_its_own_never_taken_from_path(
    empty_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bin_dir = empty_cache / "bin"
    bin_dir.mkdir()
    for name in ("keda-operator", "keda-adapter"):
        (bin_dir / name).write_text("#!/bin/sh\n")
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))
    cached = binaries.KEDA.cache_dir()
    assert cached == empty_cache / "cache" / "keda" / KEDA_VERSION / "bin"
    with pytest.raises(binaries.BinaryError) as err:
        binaries.resolve(build=False, binary_set=binaries.KEDA)
    assert "agentq cluster build --keda" in str(err.value)
    cached.mkdir(parents=True)
    for name in ("keda-operator", "keda-adapter"):
        (cached / name).write_text("")
    assert binaries.resolve(build=False, binary_set=binaries.KEDA) == {
        "keda-operator": cached / "keda-operator",
        "keda-adapter": cached / "keda-adapter",
    }
    script = (binaries.source_dir() / "build.sh").read_text()
    assert 'GOCACHE="$(dirname "$dest")/gocache"' in script
