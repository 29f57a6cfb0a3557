"""``make release VERSION=x.y.z``: every artifact of one agentq release, in one directory.

``python -m agentq.release 0.1.0 --out dist/release`` writes ``dist/release/0.1.0/``:

- ``agentq-image-<v>.tar``: the operator image (``docker save`` of ``agentq:<v>``), built
  with ``agentq cluster image`` (a private dockerd, no registry), and
  ``agentq-image-<v>.digest``: its image ID (``sha256:`` of its config), which
  ``docker load`` / ``ctr images import`` report for it;
- ``agentq-manifests-<v>.yaml``: ``kubectl kustomize manifests/`` with the image pinned
  to ``agentq:<v>`` (the ``manifests/image`` component), and ``agentq-crds-<v>.yaml``:
  the CRDs alone (``kubectl kustomize crds/``);
- ``agentq-<v>.tgz``: ``helm package`` of ``charts/agentq`` with the chart's version and
  appVersion ``<v>`` and its default image tag ``<v>``;
- wheel and sdist of ``agentq`` (operator/) and of the agent SDK ``agentq-agent`` (sdk/),
  built by the pinned setuptools (the build backend of the lock files) through its
  PEP 517 hooks, the wheel from the sdist, as ``python -m build`` does;
- ``CHANGELOG.md``: the version's section of the repository's CHANGELOG.md;
- ``SHA256SUMS``: ``sha256sum -c SHA256SUMS`` checks every file above.

Refused before anything is built: a VERSION that is not semver, one with no section in
CHANGELOG.md, one that is not the version of the sources (pyproject.toml), with a
message saying which. Reproducible where cheap: timestamps come from the last commit
(``SOURCE_DATE_EPOCH``), so the wheels, sdists, chart and manifests of one commit are the
same bytes on every run; the image's layers are not (Docker's own timestamps).
``--image-archive`` takes an image already built (``make image``'s tarball) and retags
it instead of building one: for tests; ``make release`` builds everything.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import tomllib
from collections.abc import Callable
from pathlib import Path

import click

Say = Callable[[str], None]

ROOT = Path(__file__).resolve().parents[3]
IMAGE_NAME = "agentq"
# semver.org's regular expression (2.0.0), no leading "v".
SEMVER = re.compile(
    r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?"
    r"(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?$"
)
# The Python distributions released: name -> (project directory, what it needs of the tree).
DISTRIBUTIONS = {
    "agentq": (".", ("pyproject.toml", "README.md", "LICENSE", "operator/agentq")),
    "agentq-agent": ("sdk", ("sdk/pyproject.toml", "sdk/README.md", "sdk/src/agentq")),
}
_IGNORED = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build")


class ReleaseError(RuntimeError):
    """The release was refused or failed; the message says why."""


# -- what is refused ----------------------------------------------------------------------------


def check_version(version: str) -> None:
    if SEMVER.match(version):
        return
    hint = f" (without the v: {version[1:]})" if SEMVER.match(version[1:]) else ""
    raise ReleaseError(
        f"VERSION {version!r} is not a semantic version (MAJOR.MINOR.PATCH, "
        f"e.g. 0.1.0 or 1.0.0-rc.1; semver.org){hint}"
    )


def changelog_section(changelog: Path, version: str) -> str:
    """The ``## [version]`` section of a Keep a Changelog file, heading included."""
    if not changelog.exists():
        raise ReleaseError(f"{changelog} does not exist: a release needs its CHANGELOG section")
    lines = changelog.read_text().splitlines()
    heading = re.compile(rf"^## \[{re.escape(version)}\](?:\s+-\s+\d{{4}}-\d{{2}}-\d{{2}})?\s*$")
    start = next((i for i, line in enumerate(lines) if heading.match(line)), None)
    if start is None:
        raise ReleaseError(
            f"CHANGELOG.md has no section for {version}: add '## [{version}] - YYYY-MM-DD' "
            "with its changes (keepachangelog.com) before releasing it"
        )
    end = next(
        (i for i in range(start + 1, len(lines)) if re.match(r"^## |^\[[^\]]+\]:", lines[i])),
        len(lines),
    )
    body = [line for line in lines[start + 1 : end] if line.strip()]
    if not body:
        raise ReleaseError(f"CHANGELOG.md's section for {version} is empty: say what changed")
    return "\n".join(lines[start:end]).rstrip() + "\n"


def source_versions(root: Path) -> dict[str, str]:
    """Each released distribution's version, as its pyproject.toml says."""
    return {
        name: str(
            tomllib.loads((root / project / "pyproject.toml").read_text())["project"]["version"]
        )
        for name, (project, _) in DISTRIBUTIONS.items()
    }


def check_sources(root: Path, version: str) -> None:
    versions = source_versions(root)
    wrong = {name: v for name, v in versions.items() if v != version}
    if wrong:
        said = ", ".join(f"{name} {v}" for name, v in sorted(wrong.items()))
        raise ReleaseError(
            f"VERSION {version} is not the version of the sources ({said}): raise the "
            "version in pyproject.toml, sdk/pyproject.toml, tools/pyproject.toml and "
            "operator/agentq/__init__.py first, commit, then release"
        )


def source_date_epoch(root: Path) -> int:
    """SOURCE_DATE_EPOCH if set, else the last commit's time (now outside a checkout)."""
    explicit = os.environ.get("SOURCE_DATE_EPOCH")
    if explicit:
        return int(explicit)
    done = subprocess.run(
        ["git", "-C", str(root), "log", "-1", "--format=%ct"],
        capture_output=True,
        text=True,
        check=False,
    )
    return (
        int(done.stdout.strip())
        if done.returncode == 0 and done.stdout.strip()
        else int(time.time())
    )


# -- the image -------------------------------------------------------------------------------------


def _member_bytes(archive: tarfile.TarFile, name: str) -> bytes:
    extracted = archive.extractfile(name)
    if extracted is None:
        raise ReleaseError(f"the image archive has no file {name}")
    return extracted.read()


def retag_image(
    source: Path, dest: Path, tag: str, *, labels: dict[str, str] | None = None
) -> None:
    """Copy a ``docker save`` archive naming its one image ``tag`` (manifest.json's
    RepoTags, the legacy ``repositories`` file, and an OCI index's ref annotations).

    ``labels`` are added to the image's config: the same layers as another image
    (another image ID), as a second build of the same sources would be (Docker's
    archive layout only, not an OCI index's)."""
    repository, _, version = tag.rpartition(":")
    with tarfile.open(source) as src, tarfile.open(dest, "w", format=tarfile.PAX_FORMAT) as out:
        manifest = json.loads(_member_bytes(src, "manifest.json"))
        if len(manifest) != 1:
            raise ReleaseError(f"{source} holds {len(manifest)} images; one was expected")
        old_config = manifest[0]["Config"]
        new_config: tuple[str, bytes] | None = None
        if labels:
            if "index.json" in src.getnames():
                raise ReleaseError(f"{source}: labels are added to Docker's layout only")
            config = json.loads(_member_bytes(src, old_config))
            config.setdefault("config", {})
            config["config"]["Labels"] = {**(config["config"].get("Labels") or {}), **labels}
            blob = json.dumps(config, separators=(",", ":")).encode()
            new_config = (hashlib.sha256(blob).hexdigest() + ".json", blob)
            manifest[0]["Config"] = new_config[0]
        manifest[0]["RepoTags"] = [tag]
        for member in src:
            data: bytes | None = None
            if member.name == "manifest.json":
                data = json.dumps(manifest, separators=(",", ":")).encode()
            elif member.name == old_config and new_config is not None:
                member.name, data = new_config
            elif member.name == "repositories":
                old = json.loads(_member_bytes(src, member.name))
                top = next(iter(next(iter(old.values())).values()))
                data = json.dumps({repository: {version: top}}, separators=(",", ":")).encode()
            elif member.name == "index.json":
                index = json.loads(_member_bytes(src, member.name))
                for entry in index.get("manifests", []):
                    notes = entry.get("annotations", {})
                    if "io.containerd.image.name" in notes:
                        notes["io.containerd.image.name"] = f"docker.io/library/{tag}"
                    if "org.opencontainers.image.ref.name" in notes:
                        notes["org.opencontainers.image.ref.name"] = version
                data = json.dumps(index, separators=(",", ":")).encode()
            if data is None:
                out.addfile(member, src.extractfile(member) if member.isfile() else None)
            else:
                member.size = len(data)
                out.addfile(member, io.BytesIO(data))


def image_digest(archive: Path) -> str:
    """The image ID: sha256 of the image's config (what ``docker images --digests``
    lists as IMAGE ID and containerd as the config digest)."""
    with tarfile.open(archive) as tar:
        manifest = json.loads(_member_bytes(tar, "manifest.json"))
        config = _member_bytes(tar, manifest[0]["Config"])
    return "sha256:" + hashlib.sha256(config).hexdigest()


def image_tags(archive: Path) -> list[str]:
    with tarfile.open(archive) as tar:
        return list(json.loads(_member_bytes(tar, "manifest.json"))[0]["RepoTags"])


def build_image(root: Path, tag: str, say: Say) -> Path:
    """``agentq cluster image --tag`` (root, a private dockerd); its archive in the cache."""
    from agentq.controlplane import host, imagebuild

    try:
        return imagebuild.build(root, tag=tag, say=say)
    except (imagebuild.ImageError, host.HostError) as err:
        raise ReleaseError(f"building the image failed: {err}") from err


# -- manifests and chart -----------------------------------------------------------------------


def _tool(name: str) -> str:
    from agentq.controlplane import binaries

    binary_set = binaries.HELM if name == "helm" else binaries.CONTROL_PLANE
    try:
        return str(binaries.resolve(build=False, binary_set=binary_set)[name])
    except binaries.BinaryError as err:
        raise ReleaseError(f"{name} is needed: {err}") from err


def render_manifests(root: Path, version: str, work: Path) -> tuple[str, str]:
    """(install base, CRDs) rendered by kubectl kustomize, the image pinned to the version."""
    kubectl = _tool("kubectl")
    tree = work / "kustomize"
    for name in ("manifests", "crds"):
        shutil.copytree(root / name, tree / name, ignore=_IGNORED)
    (tree / "manifests" / "image" / "kustomization.yaml").write_text(
        f"# agentq {version}: the released image.\n"
        "apiVersion: kustomize.config.k8s.io/v1alpha1\n"
        "kind: Component\n"
        "images:\n"
        f"  - name: {IMAGE_NAME}\n"
        f"    newTag: {json.dumps(version)}\n"
    )

    def kustomize(directory: Path) -> str:
        done = subprocess.run(
            [kubectl, "kustomize", str(directory)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if done.returncode != 0:
            raise ReleaseError(f"kubectl kustomize {directory.name} failed: {done.stderr}")
        return done.stdout

    return kustomize(tree / "manifests"), kustomize(tree / "crds")


def package_chart(root: Path, version: str, work: Path, out: Path, epoch: int) -> Path:
    """helm package of charts/agentq, version and appVersion ``version``, its default
    image tag ``version``."""
    helm = _tool("helm")
    chart = work / "chart" / "agentq"
    shutil.copytree(root / "charts" / "agentq", chart, ignore=_IGNORED)
    values = chart / "values.yaml"
    text, count = re.subn(
        r"(?m)^(image:\n(?:  .*\n)*?  tag: ).*$", rf"\g<1>{json.dumps(version)}", values.read_text()
    )
    if count != 1:
        raise ReleaseError("charts/agentq/values.yaml: no image.tag to set")
    values.write_text(text)
    for path in chart.rglob("*"):
        os.utime(path, (epoch, epoch))
    home = work / "helm-home"
    env = {
        **os.environ,
        "HELM_CONFIG_HOME": str(home / "config"),
        "HELM_CACHE_HOME": str(home / "cache"),
        "HELM_DATA_HOME": str(home / "data"),
        "SOURCE_DATE_EPOCH": str(epoch),
    }
    done = subprocess.run(
        [helm, "package", str(chart), "--version", version, "--app-version", version,
         "--destination", str(out)],
        capture_output=True, text=True, timeout=120, env=env, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise ReleaseError(f"helm package failed: {done.stdout}{done.stderr}")
    package = out / f"agentq-{version}.tgz"
    if not package.exists():
        raise ReleaseError(f"helm package wrote no {package.name}: {done.stdout}")
    return package


# -- Python distributions ----------------------------------------------------------------------

_BUILD = """\
import sys, setuptools.build_meta as backend
print(backend.build_sdist(sys.argv[1]))
"""
_BUILD_WHEEL = """\
import sys, setuptools.build_meta as backend
print(backend.build_wheel(sys.argv[1]))
"""


def _normalize_sdist(path: Path, epoch: int) -> None:
    """The sdist again, with every timestamp and owner fixed: the same bytes each run."""
    with tarfile.open(path) as src:
        members = [(m, _member_bytes(src, m.name) if m.isfile() else None) for m in src]
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as out:
        for member, data in sorted(members, key=lambda m: m[0].name):
            member.mtime = min(int(member.mtime), epoch)
            member.uid = member.gid = 0
            member.uname = member.gname = ""
            member.pax_headers = {}
            out.addfile(member, io.BytesIO(data) if data is not None else None)
    with (
        open(path, "wb") as file,
        gzip.GzipFile(filename="", mode="wb", fileobj=file, mtime=epoch) as gz,
    ):
        gz.write(raw.getvalue())


def _pep517(name: str, script: str, cwd: Path, dest: Path, env: dict[str, str]) -> str:
    """Run a build hook of the backend in ``cwd``; the file name it returns."""
    done = subprocess.run(
        [sys.executable, "-c", script, str(dest)],
        cwd=cwd, capture_output=True, text=True, timeout=300, env=env, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise ReleaseError(f"building {name} failed:\n{done.stdout}{done.stderr}")
    return done.stdout.strip().splitlines()[-1]


def build_python(root: Path, work: Path, out: Path, epoch: int) -> list[Path]:
    """sdist then wheel (from the unpacked sdist) of each distribution, with the
    setuptools installed here (the lock's), offline."""
    built: list[Path] = []
    env = {**os.environ, "SOURCE_DATE_EPOCH": str(epoch), "PYTHONDONTWRITEBYTECODE": "1"}
    for name, (project, files) in DISTRIBUTIONS.items():
        src = work / "src" / name
        for rel in files:
            origin, copy = root / rel, src / rel
            if origin.is_dir():
                shutil.copytree(origin, copy, ignore=_IGNORED)
            else:
                copy.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(origin, copy)
        for path in [src, *src.rglob("*")]:
            os.utime(path, (epoch, epoch))

        sdist = out / _pep517(name, _BUILD, src / project, out, env)
        _normalize_sdist(sdist, epoch)
        unpacked = work / "unpacked" / name
        with tarfile.open(sdist) as tar:
            tar.extractall(unpacked, filter="data")
        (top,) = unpacked.iterdir()
        wheel = out / _pep517(name, _BUILD_WHEEL, top, out, env)
        built += [sdist, wheel]
    return built


# -- the release -------------------------------------------------------------------------------


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def check(root: Path, version: str) -> str:
    """Every refusal, before anything is built; the CHANGELOG section."""
    check_version(version)
    section = changelog_section(root / "CHANGELOG.md", version)
    check_sources(root, version)
    return section


def release(
    version: str,
    out: Path,
    *,
    root: Path = ROOT,
    image_archive: Path | None = None,
    say: Say = print,
) -> Path:
    """Write the release into ``out/<version>/`` (replaced whole); return that directory."""
    section = check(root, version)
    out = out.resolve()
    epoch = source_date_epoch(root)
    started = time.monotonic()
    tag = f"{IMAGE_NAME}:{version}"
    final = out / version
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{version}-", dir=out) as tmp:
        work, dest = Path(tmp) / "work", Path(tmp) / version
        work.mkdir()
        dest.mkdir()
        say(f"agentq {version}: sources at {epoch} (SOURCE_DATE_EPOCH)")

        built = image_archive or build_image(root, tag, say)
        image = dest / f"agentq-image-{version}.tar"
        say(f"image {tag} from {built}")
        retag_image(built, image, tag)
        os.utime(image, (epoch, epoch))
        (dest / f"agentq-image-{version}.digest").write_text(f"{tag} {image_digest(image)}\n")

        say("manifests and CRDs (kubectl kustomize)")
        manifests, crds = render_manifests(root, version, work)
        (dest / f"agentq-manifests-{version}.yaml").write_text(manifests)
        (dest / f"agentq-crds-{version}.yaml").write_text(crds)

        say("the Helm chart (helm package)")
        package_chart(root, version, work, dest, epoch)

        say("wheels and sdists (setuptools)")
        build_python(root, work, dest, epoch)

        (dest / "CHANGELOG.md").write_text(f"# agentq {version}\n\n{section}")
        files = sorted(p for p in dest.iterdir() if p.is_file())
        (dest / "SHA256SUMS").write_text("".join(f"{sha256(p)}  {p.name}\n" for p in files))
        if final.exists():
            shutil.rmtree(final)
        dest.replace(final)
    say(f"released agentq {version} into {final} in {time.monotonic() - started:.0f} s")
    return final


def listing(directory: Path) -> str:
    sums: dict[str, str] = {}
    for line in (directory / "SHA256SUMS").read_text().splitlines():
        digest, name = line.split("  ", 1)
        sums[name] = digest
    rows = []
    for path in sorted(directory.iterdir()):
        size = path.stat().st_size
        rows.append(f"{size:>12,}  {sums.get(path.name, '-'):<64}  {path.name}")
    return "\n".join(rows)


@click.command()
@click.argument("version")
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=ROOT / "dist" / "release",
    show_default=True,
    help="Where <version>/ is written.",
)
@click.option(
    "--image-archive",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    default=None,
    help="An image already built (docker save), retagged instead of building one.",
)
@click.option("--check-only", is_flag=True, help="Only the refusals: is VERSION releasable?")
def main(version: str, out: Path, image_archive: Path | None, check_only: bool) -> None:
    """Build agentq VERSION's release artifacts into OUT/VERSION/."""
    try:
        if check_only:
            check(ROOT, version)
            return
        directory = release(
            version, out, image_archive=image_archive, say=lambda s: click.echo(f"# {s}", err=True)
        )
    except ReleaseError as err:
        raise click.ClickException(str(err)) from err
    click.echo(listing(directory))


if __name__ == "__main__":
    main()
