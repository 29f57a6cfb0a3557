"""Finds the control-plane binaries, or builds them once per machine.

Resolution, per binary: ``$KUBEBUILDER_ASSETS/<name>`` if it exists (the user
chose it); else the one on ``PATH`` if it reports the pinned version; else the
per-version cache directory, which ``e2e/controlplane/build.sh`` fills from the
Go module proxy with the machine's Go toolchain. The cache lives outside the
repository (``$AGENTQ_CACHE_DIR``, default ``$XDG_CACHE_HOME/agentq`` or
``~/.cache/agentq``) so a fresh clone reuses a build made by an earlier one.

Three sets are built apart, each into its own cache directory: the control plane
(always needed), the local node's kubelet, scheduler and pause program
(only for ``agentq cluster up --node``), so the tests never wait for a kubelet, and
helm (charts/agentq's tests and ``make e2e``; ``<cache>/helm/<version>/helm``), and
KEDA (``make keda``; ``<cache>/keda/<version>/bin/``, its Go build cache beside it in
``<cache>/keda/<version>/gocache`` so a rebuild takes minutes, not a quarter of an hour).
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from agentq.controlplane.versions import (
    BINARIES,
    ETCD_VERSION,
    HELM_BINARIES,
    HELM_VERSION,
    KEDA_BINARIES,
    KEDA_VERSION,
    KUBERNETES_VERSION,
    NODE_BINARIES,
    expected_version,
)


class BinaryError(RuntimeError):
    """A binary could not be found or built; the message says why and what to do."""


def cache_root() -> Path:
    """Where agentq caches things that outlive a checkout."""
    explicit = os.environ.get("AGENTQ_CACHE_DIR")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "agentq"


@dataclass(frozen=True)
class BinarySet:
    """Binaries built together by one ``build.sh DEST SET`` into one cache directory."""

    name: str  # build.sh's SET argument
    what: str  # for messages: "control-plane binaries", "the control plane"
    title: str
    binaries: dict[str, tuple[str, ...]]
    directory: str  # the cache directory's name (versions included)
    parent: str = "controlplane"  # the cache directory's parent, under cache_root()
    search_path: bool = True  # a binary of the pinned version on PATH is taken

    def cache_dir(self) -> Path:
        return cache_root() / self.parent / self.directory


CONTROL_PLANE = BinarySet(
    name="controlplane",
    what="control-plane binaries",
    title="the control plane",
    binaries=BINARIES,
    directory=f"{KUBERNETES_VERSION}-etcd-{ETCD_VERSION}",
)
NODE = BinarySet(
    name="node",
    what="node binaries",
    title="the local node (kubelet, kube-scheduler, pause)",
    binaries=NODE_BINARIES,
    directory=f"{KUBERNETES_VERSION}-node",
)
HELM = BinarySet(
    name="helm",
    what="helm",
    title=f"helm {HELM_VERSION}",
    binaries=HELM_BINARIES,
    directory=HELM_VERSION,
    parent="helm",
)
KEDA = BinarySet(
    name="keda",
    what="KEDA binaries",
    title=f"KEDA {KEDA_VERSION} (operator, metrics adapter)",
    binaries=KEDA_BINARIES,
    directory=f"{KEDA_VERSION}/bin",
    parent="keda",
    search_path=False,
)


def cache_dir() -> Path:
    """The directory holding the control-plane binaries of the pinned versions."""
    return CONTROL_PLANE.cache_dir()


def source_dir() -> Path:
    """The Go wrapper modules and build script (``e2e/controlplane`` of the repo)."""
    explicit = os.environ.get("AGENTQ_CONTROLPLANE_SRC")
    if explicit:
        return Path(explicit)
    # tools/src/agentq/controlplane/binaries.py -> the repository root is four levels up.
    return Path(__file__).resolve().parents[4] / "e2e" / "controlplane"


def reported_version(path: Path, binary: str) -> str:
    """What ``path`` says its version is ('' if it cannot say)."""
    try:
        done = subprocess.run(
            [str(path), *{**BINARIES, **NODE_BINARIES, **HELM_BINARIES}[binary]],
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout + done.stderr


def _found_elsewhere(binary: str, search_path: bool = True) -> Path | None:
    if not search_path:
        return None
    assets = os.environ.get("KUBEBUILDER_ASSETS")
    if assets:
        candidate = Path(assets) / binary
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    on_path = shutil.which(binary)
    if on_path and expected_version(binary) in reported_version(Path(on_path), binary):
        return Path(on_path)
    return None


def resolve(
    *,
    build: bool = True,
    say: Callable[[str], None] | None = None,
    binary_set: BinarySet = CONTROL_PLANE,
) -> dict[str, Path]:
    """Map every binary of ``binary_set`` to an executable of the pinned version.

    Builds into the cache when something is missing and ``build`` is true (this
    takes a long while the first time on a small machine); otherwise raises
    ``BinaryError`` naming what is missing.
    """
    found = {name: _found_elsewhere(name, binary_set.search_path) for name in binary_set.binaries}
    cached = binary_set.cache_dir()
    missing = [n for n, p in found.items() if p is None and not (cached / n).is_file()]
    if missing:
        if not build:
            flag = {NODE.name: " --node", HELM.name: " --helm", KEDA.name: " --keda"}.get(
                binary_set.name, ""
            )
            raise BinaryError(
                f"missing {binary_set.what} {', '.join(missing)} "
                f"(looked in $KUBEBUILDER_ASSETS, PATH and {cached}); "
                f"run 'agentq cluster build{flag}'"
            )
        build_into(cached, say=say, binary_set=binary_set)
    return {name: path if path is not None else cached / name for name, path in found.items()}


def build_into(
    dest: Path,
    *,
    say: Callable[[str], None] | None = None,
    binary_set: BinarySet = CONTROL_PLANE,
) -> None:
    """Run ``build.sh`` into ``dest`` under a lock, so two builds never race."""
    say = say or (lambda line: print(line, file=sys.stderr))
    if shutil.which("go") is None:
        raise BinaryError(
            "the control plane is built from source and needs Go >= 1.26 on PATH; "
            "'go' was not found (install Go, or set KUBEBUILDER_ASSETS to prebuilt binaries)"
        )
    script = source_dir() / "build.sh"
    if not script.is_file():
        raise BinaryError(
            f"build script {script} not found; set AGENTQ_CONTROLPLANE_SRC to the "
            "repository's e2e/controlplane directory"
        )
    dest.parent.mkdir(parents=True, exist_ok=True)
    log = dest.parent / f"build-{dest.name}.log"
    with open(dest.parent / f".{dest.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a concurrent build finishes first; then we reuse it
        if all((dest / name).is_file() for name in binary_set.binaries):
            return
        if binary_set is CONTROL_PLANE:
            versions = f"etcd {ETCD_VERSION} and Kubernetes {KUBERNETES_VERSION}"
        elif binary_set in (HELM, KEDA):
            versions = binary_set.title
        else:
            versions = f"{', '.join(binary_set.binaries)} (Kubernetes {KUBERNETES_VERSION})"
        say(
            f"building {versions} from the Go module proxy into {dest} "
            f"(once per machine; log: {log})"
        )
        with open(log, "w") as out:
            done = subprocess.run(
                ["bash", str(script), str(dest), binary_set.name],
                stdout=out,
                stderr=subprocess.STDOUT,
                check=False,
            )
        if done.returncode != 0:
            tail = "".join(log.read_text(errors="replace").splitlines(keepends=True)[-30:])
            raise BinaryError(
                f"building {binary_set.title} failed (exit {done.returncode}); "
                f"last lines of {log}:\n{tail}"
            )
        say(f"built {binary_set.title} into {dest}")
