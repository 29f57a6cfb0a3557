"""image/rootfs.py, the image's final stage without shell or pip: run on this machine's
own Python into a directory, that directory is a root in which the interpreter alone
runs what agentq needs of the standard library (TLS, sqlite, ctypes, the user lookup,
localhost), as an unknown uid, while there is no shell and no pip to run."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        os.geteuid() != 0 or shutil.which("chroot") is None or shutil.which("ldd") is None,
        reason="needs root, chroot and ldd",
    ),
]
PROBE = """
import ctypes, getpass, hashlib, json, socket, sqlite3, ssl, uuid, zlib
ssl.create_default_context()
sqlite3.connect(":memory:").execute("select 1")
print(getpass.getuser(), socket.getaddrinfo("localhost", 80)[0][4][0])
"""


def test_the_runtime_root_runs_python_without_shell_or_pip(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    root = tmp_path / "root"
    subprocess.run(
        [sys.executable, str(ROOT / "image" / "rootfs.py"), str(root), str(venv)],
        check=True,
        capture_output=True,
    )
    shutil.copytree(venv, root / str(venv).lstrip("/"), symlinks=True, dirs_exist_ok=True)
    env = {"PATH": f"{venv}/bin", "USER": "agentq", "HOME": "/tmp"}

    def run(*argv: str, user: str = "12345:12345") -> subprocess.CompletedProcess[str]:
        chroot = shutil.which("chroot") or "chroot"
        return subprocess.run(
            [chroot, f"--userspec={user}", str(root), *argv],
            capture_output=True,
            text=True,
            env=env,
            check=False,
        )

    done = run(f"{venv}/bin/python3", "-c", PROBE)
    assert done.returncode == 0, done.stderr
    # localhost is ::1 or 127.0.0.1, whichever the resolver gives: the user decides.
    assert done.stdout.split()[0] == "agentq", done.stdout
    assert (
        run(
            f"{venv}/bin/python3",
            "-c",
            "import getpass; print(getpass.getuser())",
            user="65532:65532",
        ).stdout.strip()
        == "agentq"
    )
    for absent in ("/bin/sh", "/bin/bash", "/usr/bin/env", "/usr/bin/pip3"):
        assert not os.path.lexists(root / absent.lstrip("/")), absent
        assert run(absent).returncode != 0
    for module in ("pip", "ensurepip"):
        done = run(f"{venv}/bin/python3", "-c", f"import {module}")
        assert "ModuleNotFoundError" in done.stderr, (module, done.stderr)
