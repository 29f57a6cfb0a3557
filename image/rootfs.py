"""The runtime image's root filesystem, minus the venv: the Python interpreter, its
standard library and the shared libraries it and the venv's extension modules load,
the CA bundle, and passwd/group entries -- no shell, no coreutils, no package manager,
no pip (a distroless-like final stage made from the build stage's own Debian files).

Run in the Dockerfile's build stage (standard library only):
    python3 image/rootfs.py DEST VENV
DEST receives the files at their paths; VENV (the runtime venv, /opt/agentq) is
scanned for extension modules but not copied (the Dockerfile copies it on its own).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

# Not needed to run agentq, and what a runtime image should not carry: pip (ensurepip's
# bundled wheels), the GUI and IDE, the test suite, build files.
STDLIB_SKIP = {
    "ensurepip",
    "idlelib",
    "tkinter",
    "turtledemo",
    "test",
    "lib2to3",
    "site-packages",
    "dist-packages",
    "__phello__",
}
# Loaded with dlopen, so ldd does not name it: glibc's thread cancellation needs it.
DLOPENED = ("libgcc_s.so.1",)
ETC = (
    "etc/ld.so.cache",
    "etc/ssl/certs/ca-certificates.crt",
    "etc/ssl/openssl.cnf",
    "etc/nsswitch.conf",
    "etc/host.conf",
)
PASSWD = (
    "root:x:0:0:root:/root:/usr/sbin/nologin\n"
    "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
    "agentq:x:65532:65532:agentq:/tmp:/usr/sbin/nologin\n"
)
GROUP = "root:x:0:\nnogroup:x:65534:\nagentq:x:65532:\n"
# A container runtime mounts its own; this one serves a run without (docker run).
HOSTS = "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"


def copy(path: str, dest: Path) -> None:
    """Copy ``path`` (a symlink as a symlink, then its target, as far as the chain goes)
    to the same place under ``dest``, its directories resolved (merged /usr)."""
    seen = set()
    while path not in seen and os.path.lexists(path):
        seen.add(path)
        parent = os.path.realpath(os.path.dirname(path))
        target = dest / parent.lstrip("/") / os.path.basename(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        if os.path.islink(path):
            link = os.readlink(path)
            if not os.path.lexists(target):
                os.symlink(link, target)
            path = os.path.join(parent, link)
        elif os.path.isdir(path):
            target.mkdir(parents=True, exist_ok=True)
            return
        else:
            if not target.exists():
                shutil.copy2(path, target)
            return


def copy_tree(src: str, dest: Path, skip: set[str]) -> None:
    for root, dirs, files in os.walk(src):
        rel = os.path.relpath(root, src)
        dirs[:] = [d for d in dirs if not (rel == "." and d in skip) and d != "__pycache__"]
        for name in files:
            copy(os.path.join(root, name), dest)
        for name in dirs:  # a symlinked directory is a file to os.walk's listing
            if os.path.islink(os.path.join(root, name)):
                copy(os.path.join(root, name), dest)


def elf_files(*roots: str) -> list[str]:
    found = []
    for root in roots:
        for folder, _, files in os.walk(root):
            for name in files:
                path = os.path.join(folder, name)
                if name.endswith(".so") or ".so." in name or os.access(path, os.X_OK):
                    with open(path, "rb") as f:
                        if f.read(4) == b"\x7fELF":
                            found.append(path)
    return found


def libraries(elf: str) -> set[str]:
    """What ``elf`` loads, by ldd (the loader itself included)."""
    done = subprocess.run(["ldd", elf], capture_output=True, text=True, check=False)
    found = set()
    for line in done.stdout.splitlines():
        match = re.search(r"(?:=>\s*)?(/\S+)\s+\(0x", line)
        if match:
            found.add(match.group(1))
    return found


def libdir_of(name: str, near: set[str]) -> str | None:
    for lib in near:
        candidate = os.path.join(os.path.dirname(lib), name)
        if os.path.exists(candidate):
            return candidate
    return None


def main(dest: Path, venv: str) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    # Merged /usr: /lib, /bin ... are symlinks into /usr; keep them so.
    for top in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        if os.path.islink(f"/{top}"):
            copy(f"/{top}", dest)
    interpreter = os.path.join(venv, "bin", "python")
    copy(interpreter, dest)  # the venv's link, then the base's chain to the binary
    shutil.rmtree(dest / venv.lstrip("/"))  # the venv is copied on its own
    paths = sysconfig.get_paths()
    copy_tree(paths["stdlib"], dest, STDLIB_SKIP)
    if paths["platstdlib"] != paths["stdlib"]:
        copy_tree(paths["platstdlib"], dest, STDLIB_SKIP)
    # Debian's python3 keeps its extension modules apart from the rest of the stdlib.
    dynload = os.path.join(paths["stdlib"], "lib-dynload")
    binary = os.path.realpath(interpreter)
    libs: set[str] = set()
    for elf in [binary, *elf_files(dynload, venv)]:
        libs |= libraries(elf)
    for name in DLOPENED:
        found = libdir_of(name, libs)
        if found:
            libs.add(found)
    for lib in sorted(libs):
        copy(lib, dest)
    for path in ETC:
        if os.path.lexists(f"/{path}"):
            copy(f"/{path}", dest)
    # OpenSSL's directory (certs, cert.pem: links into /etc/ssl) where Debian keeps it.
    if os.path.isdir("/usr/lib/ssl"):
        copy_tree("/usr/lib/ssl", dest, set())
    etc = dest / "etc"
    etc.mkdir(exist_ok=True)
    (etc / "passwd").write_text(PASSWD)
    (etc / "group").write_text(GROUP)
    (etc / "hosts").write_text(HOSTS)
    tmp = dest / "tmp"
    tmp.mkdir(exist_ok=True)
    tmp.chmod(0o1777)
    print(f"{dest}: {len(libs)} shared libraries, {binary}, {paths['stdlib']}")


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
