"""Builds the agentq image on a machine with no Docker engine running and no registry.

``make image`` runs ``agentq cluster image``:

1. A local base image from Debian packages (``debootstrap --variant=minbase
   bookworm`` with Python 3.11 and its venv module), made once and cached as a
   tarball. It trusts what the host trusts: the host's CA bundle replaces
   Debian's, so ``pip`` inside the build reaches PyPI through whatever TLS
   interception the host's network does.
2. Debian's ``dockerd`` started for the build only, with its own data root (kept
   as a layer cache), exec root, socket and pidfile; no bridge, no iptables, no
   IP forwarding (the build uses the host's network), and containers under
   cgroup ``/agentq-docker``. Stopped by pid afterwards; the directories it
   creates elsewhere (``/etc/docker/key.json``, ``/opt/containerd``,
   ``/run/docker``) are journaled and removed, like the local node's changes.
3. ``docker build --build-arg BASE=<local base>`` of the repository's Dockerfile
   (which builds FROM python:3.11-slim by default elsewhere), a smoke run as an
   unknown non-root uid with a read-only root, and ``docker save`` to a tarball
   that ``agentq cluster load`` imports into the local node's containerd.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from agentq.controlplane import binaries, host, procs

Say = Callable[[str], None]

SUITE = "bookworm"
BASE_PACKAGES = ("python3", "python3-venv", "ca-certificates")
# Bump to rebuild every cached base (its tag carries a hash of this and the list).
_BASE_RECIPE = "1"
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
DEFAULT_TAG = "agentq:dev"
DEBIAN_MIRROR = os.environ.get("AGENTQ_DEBIAN_MIRROR", "http://deb.debian.org/debian")


class ImageError(RuntimeError):
    """The image could not be built; says why."""


def images_dir() -> Path:
    return binaries.cache_root() / "images"


def base_tag() -> str:
    recipe = f"{_BASE_RECIPE}:{SUITE}:{','.join(BASE_PACKAGES)}"
    if HOST_CA_BUNDLE.exists():
        recipe += ":" + hashlib.sha256(HOST_CA_BUNDLE.read_bytes()).hexdigest()
    return f"agentq-base:{SUITE}-{hashlib.sha256(recipe.encode()).hexdigest()[:12]}"


def archive_path(tag: str) -> Path:
    return images_dir() / (tag.replace("/", "_").replace(":", "-") + ".tar")


def check_host() -> None:
    if os.geteuid() != 0:
        raise ImageError("building the image with a private dockerd needs root")
    missing = [t for t in ("dockerd", "docker", "debootstrap") if shutil.which(t) is None]
    if missing:
        raise ImageError(
            f"missing on this host: {', '.join(missing)}; install them with 'make node-deps' "
            "(Debian: apt-get install docker.io debootstrap)"
        )


# -- the local base --------------------------------------------------------------------------


def build_base_rootfs(say: Say) -> Path:
    """debootstrap a minimal Debian with Python into a tarball in the cache; return it."""
    tarball = images_dir() / f"{base_tag().replace(':', '-')}.rootfs.tar"
    if tarball.exists():
        return tarball
    images_dir().mkdir(parents=True, exist_ok=True)
    journal = host.Journal("image-base")
    with journal.locked():
        if tarball.exists():
            return tarball
        with tempfile.TemporaryDirectory(prefix="agentq-base-", dir=images_dir()) as tmp:
            rootfs = Path(tmp) / "rootfs"
            log = images_dir() / "debootstrap.log"
            say(f"building the local base image with debootstrap ({SUITE}; log {log})")
            started = time.monotonic()
            journal.begin(str(images_dir()))
            # debootstrap mounts /proc and /sys inside the target while it works.
            journal.watch_mounts(rootfs)
            try:
                with open(log, "w") as out:
                    done = subprocess.run(
                        [
                            "debootstrap",
                            "--variant=minbase",
                            f"--include={','.join(BASE_PACKAGES)}",
                            SUITE,
                            str(rootfs),
                            DEBIAN_MIRROR,
                        ],
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        check=False,
                    )
            finally:
                journal.undo(say)
            if done.returncode != 0:
                raise ImageError(
                    f"debootstrap failed (exit {done.returncode}); last lines of {log}:\n"
                    + procs.log_tail(log)
                )
            # Trust what the host trusts (a TLS-intercepting proxy's CA, say).
            if HOST_CA_BUNDLE.exists():
                shutil.copyfile(HOST_CA_BUNDLE, rootfs / "etc/ssl/certs/ca-certificates.crt")
            for junk in (
                "var/cache/apt/archives",
                "var/lib/apt/lists",
                "usr/share/doc",
                "usr/share/man",
                "usr/share/info",
                "usr/share/locale",
            ):
                for child in (rootfs / junk).glob("*"):
                    if child.is_dir() and not child.is_symlink():
                        shutil.rmtree(child)
                    elif child.name != "lock":
                        child.unlink()
            partial = tarball.with_suffix(".partial")
            host.run(["tar", "-C", str(rootfs), "-cf", str(partial), "."], timeout=600)
            partial.replace(tarball)
            say(f"built the local base in {time.monotonic() - started:.0f} s: {tarball}")
    return tarball


# -- a private dockerd ---------------------------------------------------------------------------


@dataclass
class Docker:
    socket: Path

    def run(
        self,
        *args: str,
        timeout: float = 1800,
        env: dict[str, str] | None = None,
        log: Path | None = None,
    ) -> subprocess.CompletedProcess[str]:
        argv = ["docker", "--host", f"unix://{self.socket}", *args]
        full_env = {**os.environ, "DOCKER_BUILDKIT": "0", **(env or {})}
        if log is not None:
            with open(log, "a") as out:
                done = subprocess.run(
                    argv,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    text=True,
                    timeout=timeout,
                    env=full_env,
                    check=False,
                )
            if done.returncode != 0:
                raise ImageError(
                    f"docker {args[0]} failed (exit {done.returncode}); last lines of {log}:\n"
                    + procs.log_tail(log, 40)
                )
            return done
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout, env=full_env, check=False
        )
        if done.returncode != 0:
            raise ImageError(f"docker {' '.join(args[:2])} failed: {done.stderr.strip()}")
        return done


@contextlib.contextmanager
def private_dockerd(say: Say) -> Iterator[Docker]:
    """Run Debian's dockerd with its own directories for the duration; undo it all after."""
    journal = host.Journal("image")
    cache = binaries.cache_root() / "docker"
    with journal.locked():
        if journal.load():
            if journal.processes_alive():
                raise ImageError(
                    f"another image build runs ({', '.join(journal.processes_alive())})"
                )
            say("cleaning up after an image build that did not finish")
            journal.undo(say)
        journal.begin(str(cache))
        run_dir = journal.directory / "docker"
        journal.make_dir(run_dir)
        data_root = cache / "data"
        data_root.mkdir(parents=True, exist_ok=True)
        journal.watch_mounts(data_root)
        journal.watch_mounts(run_dir)
        for path, mode in (
            ("/etc/docker/key.json", "tree"),
            ("/etc/docker", "empty"),
            ("/opt/containerd", "empty"),
            ("/run/docker", "tree"),
            ("/run/containerd", "empty"),
            ("/var/lib/docker", "empty"),
        ):
            journal.watch_path(path, mode=mode)
        journal.cgroup("agentq-docker")
        config = run_dir / "daemon.json"
        config.write_text("{}\n")
        socket_path = run_dir / "docker.sock"
        log = cache / "dockerd.log"
        dockerd = shutil.which("dockerd") or "dockerd"
        args = [
            f"--data-root={data_root}",
            f"--exec-root={run_dir / 'exec'}",
            f"--host=unix://{socket_path}",
            f"--pidfile={run_dir / 'docker.pid'}",
            f"--config-file={config}",
            "--bridge=none",
            "--iptables=false",
            "--ip6tables=false",
            "--ip-forward=false",
            "--ip-masq=false",
            "--cgroup-parent=/agentq-docker",
            "--exec-opt=native.cgroupdriver=cgroupfs",
            "--storage-driver=overlay2",
        ]
        cache.mkdir(parents=True, exist_ok=True)
        proc = procs.start("dockerd", dockerd, args, cwd=cache, log=log, tie_to_parent=True)
        journal.process("dockerd", proc.pid, dockerd, grace=20.0)
        docker = Docker(socket_path)
        try:
            deadline = time.monotonic() + 60
            while subprocess.run(
                ["docker", "--host", f"unix://{socket_path}", "version"],
                capture_output=True,
                check=False,
            ).returncode:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise ImageError(
                        f"dockerd did not start; last lines of {log}:\n" + procs.log_tail(log)
                    )
                time.sleep(0.3)
            # dockerd runs its own containerd; stop it after dockerd if dockerd dies.
            with contextlib.suppress(OSError, ValueError):
                child = int((run_dir / "exec" / "containerd" / "containerd.pid").read_text())
                exe = os.readlink(f"/proc/{child}/exe")
                journal.process("dockerd-containerd", child, exe, stop_after="dockerd")
            say(f"dockerd (pid {proc.pid}) ready; data root {data_root}")
            yield docker
        finally:
            journal.undo(say)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)


# -- the build -----------------------------------------------------------------------------------


def build(context: Path, *, tag: str = DEFAULT_TAG, say: Say) -> Path:
    """Build ``tag`` from ``context``'s Dockerfile on the local base; return its archive."""
    check_host()
    started = time.monotonic()
    rootfs = build_base_rootfs(say)
    base = base_tag()
    log = images_dir() / "build.log"
    log.write_text("")
    with private_dockerd(say) as docker:
        if docker.run("image", "ls", "-q", base).stdout.strip() == "":
            say(f"importing the local base as {base}")
            docker.run(
                "import",
                "--change",
                "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                "--change",
                "ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt",
                str(rootfs),
                base,
            )
        before = docker.run("image", "ls", "-q", tag).stdout.strip()
        say(f"building {tag} FROM {base} (log {log})")
        docker.run(
            "build",
            "--network=host",
            "--build-arg",
            f"BASE={base}",
            "-t",
            tag,
            str(context),
            log=log,
        )
        smoke_test(docker, tag, say)
        archive = archive_path(tag)
        partial = archive.with_suffix(".partial")
        docker.run("save", "-o", str(partial), tag)
        partial.replace(archive)
        # Drop the previous build of the tag (the build stage's layers stay: they are
        # the cache that makes the next build fast).
        if before and before != docker.run("image", "ls", "-q", tag).stdout.strip():
            with contextlib.suppress(ImageError):
                docker.run("rmi", before)
    say(f"built {tag} in {time.monotonic() - started:.0f} s: {archive}")
    return archive


def smoke_test(docker: Docker, tag: str, say: Say) -> None:
    """The image must start as a uid with no passwd entry, on a read-only root."""
    probe = (
        "import getpass; from kopf._core.engines import peering; "
        "print(getpass.getuser(), peering.detect_own_id(manual=False))"
    )
    for user in ("65532:65532", "12345:12345"):
        docker.run(
            "run",
            "--rm",
            "--network=none",
            "--read-only",
            "--tmpfs=/tmp",
            f"--user={user}",
            "--entrypoint=python3",
            tag,
            "-c",
            probe,
            timeout=120,
        )
    say(f"{tag} starts as uid 65532 and as an unknown uid on a read-only root")
