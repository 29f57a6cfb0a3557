"""``make release`` (agentq.release): its artifacts, their checksums, the chart's version,
the image the manifests name, the same bytes on a second run, and its refusals.

The release's Python entry point runs into a temporary directory with
``image_archive``: the image ``make image`` built (``~/.cache/agentq/images/agentq-dev.tar``)
if there is one, else a small image archive made here, retagged ``agentq:<version>`` as a
built one would be tagged; ``make release`` itself builds the image. Needs the pinned
helm (``make helm``) and kubectl (``make controlplane``), like tests/unit/test_helm_chart.py.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from email.parser import HeaderParser
from pathlib import Path
from typing import Any

import pytest
import yaml

import agentq
import manifests
from agentq import release
from agentq.controlplane import binaries, imagebuild

ROOT = Path(__file__).resolve().parents[3]
VERSION = agentq.__version__
CRDS = sorted(p.stem for p in (ROOT / "crds").glob("*.yaml"))


def _fake_image(path: Path) -> Path:
    """A one-layer ``docker save`` archive (the layout Docker 28 writes), tagged agentq:dev."""
    layer = io.BytesIO()
    with tarfile.open(fileobj=layer, mode="w") as tar:
        data = b"agentq\n"
        info = tarfile.TarInfo("etc/agentq")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    layer_id = hashlib.sha256(layer.getvalue()).hexdigest()
    config = json.dumps(
        {"architecture": "amd64", "os": "linux", "config": {"Entrypoint": ["agentq"]},
         "rootfs": {"type": "layers", "diff_ids": [f"sha256:{layer_id}"]}}
    ).encode()  # fmt: skip
    config_name = hashlib.sha256(config).hexdigest() + ".json"
    files = {
        f"{layer_id}/layer.tar": layer.getvalue(),
        config_name: config,
        "manifest.json": json.dumps(
            [
                {
                    "Config": config_name,
                    "RepoTags": ["agentq:dev"],
                    "Layers": [f"{layer_id}/layer.tar"],
                }
            ]
        ).encode(),
        "repositories": json.dumps({"agentq": {"dev": layer_id}}).encode(),
    }
    with tarfile.open(path, "w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


@pytest.fixture(scope="module")
def tools() -> dict[str, str]:
    try:
        found = {
            "kubectl": str(binaries.resolve(build=False)["kubectl"]),
            "helm": str(binaries.resolve(build=False, binary_set=binaries.HELM)["helm"]),
        }
    except binaries.BinaryError as err:
        pytest.skip(f"helm or kubectl not built ({err}); make helm controlplane")
    return found


@pytest.fixture(scope="module")
def image_archive(tmp_path_factory: pytest.TempPathFactory) -> Path:
    built = imagebuild.archive_path(imagebuild.DEFAULT_TAG)
    if built.exists():
        return built
    return _fake_image(tmp_path_factory.mktemp("image") / "agentq-dev.tar")


def _release(out: Path, image_archive: Path) -> Path:
    return release.release(VERSION, out, image_archive=image_archive, say=lambda _: None)


@pytest.fixture(scope="module")
def released(
    tools: dict[str, str], image_archive: Path, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    return _release(tmp_path_factory.mktemp("dist") / "release", image_archive)


def _sums(directory: Path) -> dict[str, str]:
    return {
        name: digest
        for digest, name in (
            line.split("  ", 1) for line in (directory / "SHA256SUMS").read_text().splitlines()
        )
    }


def test_the_release_holds_every_artifact(released: Path) -> None:
    assert released.name == VERSION
    assert sorted(p.name for p in released.iterdir()) == sorted(
        [
            "CHANGELOG.md",
            "SHA256SUMS",
            f"agentq-image-{VERSION}.tar",
            f"agentq-image-{VERSION}.digest",
            f"agentq-manifests-{VERSION}.yaml",
            f"agentq-crds-{VERSION}.yaml",
            f"agentq-{VERSION}.tgz",
            f"agentq-{VERSION}-py3-none-any.whl",
            f"agentq-{VERSION}.tar.gz",
            f"agentq_agent-{VERSION}-py3-none-any.whl",
            f"agentq_agent-{VERSION}.tar.gz",
        ]
    )
    # Nothing left beside it (the work directory, a partial copy).
    assert [p.name for p in released.parent.iterdir()] == [VERSION]
    notes = (released / "CHANGELOG.md").read_text()
    assert f"\n## [{VERSION}]" in notes and "### " in notes and "## [Unreleased]" not in notes


def test_the_checksums_cover_every_other_file_and_match(released: Path) -> None:
    sums = _sums(released)
    assert set(sums) == {p.name for p in released.iterdir()} - {"SHA256SUMS"}
    for name, digest in sums.items():
        assert hashlib.sha256((released / name).read_bytes()).hexdigest() == digest, name
    if shutil.which("sha256sum"):
        done = subprocess.run(
            ["sha256sum", "--check", "--strict", "SHA256SUMS"],
            cwd=released, capture_output=True, text=True, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr


def test_the_image_is_tagged_with_the_version_and_its_digest_recorded(
    released: Path, image_archive: Path
) -> None:
    image = released / f"agentq-image-{VERSION}.tar"
    assert release.image_tags(image) == [f"agentq:{VERSION}"]
    with tarfile.open(image) as tar:
        config = json.loads(tar.extractfile("manifest.json").read())[0]["Config"]  # type: ignore[union-attr]
        repositories = json.loads(tar.extractfile("repositories").read())  # type: ignore[union-attr]
        digest = "sha256:" + hashlib.sha256(tar.extractfile(config).read()).hexdigest()  # type: ignore[union-attr]
    assert list(repositories) == ["agentq"] and list(repositories["agentq"]) == [VERSION]
    assert (released / f"agentq-image-{VERSION}.digest").read_text() == (
        f"agentq:{VERSION} {digest}\n"
    )
    # Only the names changed: the same image (config and layers) as the one built.
    assert release.image_digest(image_archive) == digest


def test_the_rendered_manifests_name_the_released_image(released: Path) -> None:
    objects = [
        d for d in yaml.safe_load_all((released / f"agentq-manifests-{VERSION}.yaml").read_text())
        if d
    ]  # fmt: skip
    images = {c["image"] for obj in objects for c in manifests.containers(obj)}
    assert images == {f"agentq:{VERSION}"}
    crds = [
        d for d in yaml.safe_load_all((released / f"agentq-crds-{VERSION}.yaml").read_text()) if d
    ]
    assert sorted(c["metadata"]["name"] for c in crds) == CRDS
    assert {c["kind"] for c in crds} == {"CustomResourceDefinition"}
    # The install base carries the same CRDs.
    in_base = {o["metadata"]["name"]: o for o in objects if o["kind"] == "CustomResourceDefinition"}
    assert sorted(in_base) == CRDS
    assert all(in_base[c["metadata"]["name"]]["spec"] == c["spec"] for c in crds)


def test_the_chart_is_the_version_and_installs_the_released_image(
    released: Path, tools: dict[str, str], tmp_path: Path
) -> None:
    package = released / f"agentq-{VERSION}.tgz"
    with tarfile.open(package) as tar:
        chart = yaml.safe_load(tar.extractfile("agentq/Chart.yaml").read())  # type: ignore[union-attr]
        values = yaml.safe_load(tar.extractfile("agentq/values.yaml").read())  # type: ignore[union-attr]
    assert chart["version"] == VERSION and chart["appVersion"] == VERSION
    assert values["image"]["tag"] == VERSION
    done = subprocess.run(
        [tools["helm"], "template", "agentq", str(package)],
        capture_output=True, text=True, timeout=120, check=True,
        env={"PATH": "/usr/bin:/bin", "HELM_CONFIG_HOME": str(tmp_path / "c"),
             "HELM_CACHE_HOME": str(tmp_path / "k"), "HELM_DATA_HOME": str(tmp_path / "d")},
    )  # fmt: skip
    objects = [d for d in yaml.safe_load_all(done.stdout) if d]
    assert {c["image"] for o in objects for c in manifests.containers(o)} == {f"agentq:{VERSION}"}


def _wheel_metadata(wheel: Path) -> Any:
    with zipfile.ZipFile(wheel) as zf:
        name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        return HeaderParser().parsestr(zf.read(name).decode())


def test_the_wheels_and_sdists_are_of_the_version(released: Path) -> None:
    for dist, module in (("agentq", "agentq/operator/main.py"), ("agentq_agent", "agentq/agent")):
        meta = _wheel_metadata(released / f"{dist}-{VERSION}-py3-none-any.whl")
        assert meta["Name"].replace("-", "_") == dist and meta["Version"] == VERSION
        with zipfile.ZipFile(released / f"{dist}-{VERSION}-py3-none-any.whl") as zf:
            assert any(n.startswith(module) for n in zf.namelist()), module
        with tarfile.open(released / f"{dist}-{VERSION}.tar.gz") as tar:
            names = tar.getnames()
            assert f"{dist}-{VERSION}/pyproject.toml" in names
            assert f"{dist}-{VERSION}/PKG-INFO" in names
            assert {m.mtime for m in tar.getmembers()} == {release.source_date_epoch(ROOT)}
    requires = _wheel_metadata(released / f"agentq-{VERSION}-py3-none-any.whl").get_all(
        "Requires-Dist"
    )
    assert f"agentq-agent=={VERSION}" in requires


def test_a_second_run_writes_the_same_bytes(
    released: Path, image_archive: Path, tmp_path: Path
) -> None:
    again = _release(tmp_path / "release", image_archive)
    assert _sums(again) == _sums(released)
    assert (again / "SHA256SUMS").read_bytes() == (released / "SHA256SUMS").read_bytes()


def test_a_label_makes_a_second_build_of_the_same_layers(
    image_archive: Path, tmp_path: Path
) -> None:
    """What e2e/test_helm.py upgrades to: another image ID, another tag, the same layers."""
    second = tmp_path / "second.tar"
    release.retag_image(
        image_archive, second, "agentq:e2e-second", labels={"dev.agentq.build": "second"}
    )
    assert release.image_tags(second) == ["agentq:e2e-second"]
    assert release.image_digest(second) != release.image_digest(image_archive)
    with tarfile.open(second) as tar, tarfile.open(image_archive) as original:
        manifest = json.loads(tar.extractfile("manifest.json").read())[0]  # type: ignore[union-attr]
        config = json.loads(tar.extractfile(manifest["Config"]).read())  # type: ignore[union-attr]
        before = json.loads(original.extractfile("manifest.json").read())[0]  # type: ignore[union-attr]
        assert manifest["Config"] not in original.getnames()
        assert manifest["Config"] in tar.getnames() and before["Config"] not in tar.getnames()
    assert config["config"]["Labels"]["dev.agentq.build"] == "second"
    assert manifest["Layers"] == before["Layers"]


# -- refusals ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("version", "said"),
    [
        ("v0.1.0", "without the v: 0.1.0"),
        ("0.1", "not a semantic version"),
        ("01.2.3", "not a semantic version"),
        ("1.2.3-", "not a semantic version"),
        ("latest", "not a semantic version"),
        ("", "not a semantic version"),
        ("9.99.999", "CHANGELOG.md has no section for 9.99.999"),
        ("9.99.999-rc.1+build.5", "CHANGELOG.md has no section for 9.99.999-rc.1+build.5"),
    ],
)
def test_a_version_not_semver_or_without_a_changelog_section_is_refused(
    version: str, said: str, tmp_path: Path
) -> None:
    with pytest.raises(release.ReleaseError, match=re.escape(said)):
        release.release(version, tmp_path / "out", say=lambda _: None)
    assert not (tmp_path / "out").exists()  # refused before anything was built


def _tree(tmp_path: Path, changelog: str, version: str = "0.2.0") -> Path:
    for project in (".", "sdk"):
        (tmp_path / project).mkdir(exist_ok=True)
        (tmp_path / project / "pyproject.toml").write_text(f'[project]\nversion = "{version}"\n')
    (tmp_path / "CHANGELOG.md").write_text(changelog)
    return tmp_path


def test_an_empty_section_or_a_version_the_sources_do_not_have_is_refused(
    tmp_path: Path,
) -> None:
    empty = _tree(tmp_path, "# Changelog\n\n## [0.2.0] - 2026-12-05\n\n## [0.1.0] - 2026-12-04\n")
    with pytest.raises(release.ReleaseError, match=r"section for 0\.2\.0 is empty"):
        release.release("0.2.0", tmp_path / "out", root=empty, say=lambda _: None)
    other = _tree(tmp_path, "# Changelog\n\n## [0.3.0] - 2026-12-06\n\n### Fixed\n\n- x\n")
    with pytest.raises(release.ReleaseError, match=r"not the version of the sources"):
        release.release("0.3.0", tmp_path / "out", root=other, say=lambda _: None)
    assert not (tmp_path / "out").exists()
    # The section is found between its heading and the next one.
    good = _tree(
        tmp_path,
        "# Changelog\n\n## [Unreleased]\n\n## [0.2.0] - 2026-12-05\n\n### Added\n\n- y\n\n"
        "## [0.1.0] - 2026-12-04\n\n### Added\n\n- x\n",
    )
    assert release.check(good, "0.2.0") == "## [0.2.0] - 2026-12-05\n\n### Added\n\n- y\n"


def test_the_command_says_why_it_refuses() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "agentq.release", "--check-only", "1.0"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode != 0
    assert "VERSION '1.0' is not a semantic version" in done.stderr
    ok = subprocess.run(
        [sys.executable, "-m", "agentq.release", "--check-only", VERSION],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert ok.returncode == 0, ok.stderr
