"""A real PostgreSQL server for the tests, from Debian's packages, as a process of its own.

``PostgresServer.start()`` runs ``initdb`` into a fresh directory under /tmp and
starts ``postgres`` on a free loopback port with its socket in that directory.
PostgreSQL refuses to run as root, so as root it runs as the ``postgres`` user
(created by the Debian package), else as ``nobody``. The server dies with the
test process (parent-death signal) and ``stop()`` ends it by its pid, then
removes the directory. ``make`` installs the package when it is missing.
"""

from __future__ import annotations

import contextlib
import ctypes
import glob
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from agentq.controlplane.cluster import free_port


def find_bin_dir() -> Path | None:
    """The newest installed PostgreSQL's bin directory (Debian layout), or PATH's."""
    candidates = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"),
        key=lambda p: int(Path(p).parts[-3]) if Path(p).parts[-3].isdigit() else 0,
    )
    if candidates:
        return Path(candidates[-1]).parent
    found = shutil.which("initdb")
    return Path(found).parent if found else None


def _run_as() -> pwd.struct_passwd | None:
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            return pwd.getpwnam(name)
    raise RuntimeError("running as root and neither a 'postgres' nor a 'nobody' user exists")


def _die_with_parent() -> None:
    # PR_SET_PDEATHSIG = 1: the kernel sends SIGKILL when the test process dies.
    # (Set after the change of user: a credential change clears it.)
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)


class PostgresServer:
    def __init__(self, bin_dir: Path) -> None:
        self.bin_dir = bin_dir
        self.user = _run_as()
        self.dir = Path(tempfile.mkdtemp(prefix="agentq-pg-"))
        self.data = self.dir / "data"
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = self.dir / "postgres.log"

    @property
    def dsn(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _as_user(self) -> dict[str, object]:
        if self.user is None:
            return {}
        return {"user": self.user.pw_uid, "group": self.user.pw_gid, "extra_groups": []}

    def start(self, timeout: float = 60) -> None:
        if self.user is not None:
            os.chown(self.dir, self.user.pw_uid, self.user.pw_gid)
        env = {"PATH": f"{self.bin_dir}:/usr/bin:/bin", "LC_ALL": "C.UTF-8", "LANG": "C.UTF-8"}
        done = subprocess.run(
            [
                str(self.bin_dir / "initdb"),
                "-D",
                str(self.data),
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--no-sync",
            ],
            capture_output=True,
            text=True,
            env=env,
            cwd=self.dir,
            timeout=120,
            check=False,
            **self._as_user(),  # type: ignore[arg-type]
        )
        if done.returncode != 0:
            raise RuntimeError(f"initdb failed ({done.returncode}):\n{done.stdout}{done.stderr}")
        log = open(self.log, "ab")  # noqa: SIM115 - the server keeps it
        if self.user is not None:
            os.chown(self.log, self.user.pw_uid, self.user.pw_gid)
        self.proc = subprocess.Popen(
            [
                str(self.bin_dir / "postgres"),
                "-D",
                str(self.data),
                "-p",
                str(self.port),
                "-k",
                str(self.dir),
                "-c",
                "listen_addresses=127.0.0.1",
                "-c",
                "fsync=off",
                "-c",
                "max_connections=200",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            cwd=self.dir,
            preexec_fn=_die_with_parent,
            **self._as_user(),  # type: ignore[arg-type]
        )
        log.close()
        self._wait_ready(timeout)

    def _wait_ready(self, timeout: float) -> None:
        import psycopg

        deadline = time.monotonic() + timeout
        while True:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"postgres exited {self.proc.returncode}:\n{self.log_tail()}")
            try:
                with psycopg.connect(self.dsn, connect_timeout=2) as conn:
                    conn.execute("SELECT 1")
                return
            except psycopg.OperationalError as err:
                if time.monotonic() > deadline:
                    tail = self.log_tail()
                    raise RuntimeError(f"postgres not ready in {timeout}s:\n{tail}") from err
                time.sleep(0.2)

    def log_tail(self) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-20:])
        return ""

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)  # "fast" shutdown
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        shutil.rmtree(self.dir, ignore_errors=True)
