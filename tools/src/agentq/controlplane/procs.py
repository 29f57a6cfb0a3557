"""Processes of the local cluster: started with a log file, stopped by pid.

Shared by the control plane (``cluster``) and the local node (``node``). A pid
is signalled only after checking that it still runs the executable that was
started, so a recycled pid is never signalled.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import random
import signal
import socket
import subprocess
import time
from pathlib import Path

_PR_SET_PDEATHSIG = 1


class ProcessError(RuntimeError):
    """A process could not be started or stopped; says which and why."""


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now.

    Chosen below the kernel's ephemeral range: a port the kernel handed out for
    bind(0) may be handed out again at once to any outgoing connection, and then
    the server that was meant to listen on it fails with EADDRINUSE.
    """
    low = _ephemeral_low()
    for _ in range(50):
        port = random.randint(10000, max(10001, low - 1))
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def pid_runs(pid: int, executable: str) -> bool:
    """True if ``pid`` is alive and still runs ``executable`` (guards against pid reuse)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    # A zombie (state Z) has exited; only its parent has not reaped it yet.
    if stat.rsplit(")", 1)[-1].split()[0] == "Z":
        return False
    return bool(cmdline) and cmdline[0].decode(errors="replace") == executable


def log_tail(path: Path, lines: int = 25) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "".join(text.splitlines(keepends=True)[-lines:])


def _die_with_parent() -> None:
    # Runs in the child between fork and exec: if the process that started us dies
    # (a test session killed with SIGKILL), the kernel kills us too.
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def start(
    name: str,
    binary: str,
    args: list[str],
    *,
    cwd: Path,
    log: Path,
    tie_to_parent: bool,
    env: dict[str, str] | None = None,
) -> subprocess.Popen[bytes]:
    """Start ``binary`` in its own session with stdout and stderr appended to ``log``."""
    out = open(log, "ab")  # noqa: SIM115 - inherited by the child
    try:
        return subprocess.Popen(
            [binary, *args],
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            # Own session: a Ctrl-C at the terminal that ran 'up' must not stop it.
            start_new_session=True,
            preexec_fn=_die_with_parent if tie_to_parent else None,
        )
    except OSError as err:
        raise ProcessError(f"cannot start {name} ({binary}): {err}") from err
    finally:
        out.close()


def wait_gone(pid: int, executable: str, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        # Reap it if it is our own child (the test fixture case); harmless otherwise.
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        if not pid_runs(pid, executable):
            return True
        time.sleep(0.1)
    return False


def stop(pid: int, executable: str, *, name: str, grace: float = 10.0) -> bool:
    """SIGTERM ``pid`` if it still runs ``executable``, SIGKILL after ``grace`` seconds.

    Returns False if it was not running. Raises ``ProcessError`` if it outlives SIGKILL.
    """
    if not pid_runs(pid, executable):
        return False
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    if not wait_gone(pid, executable, grace):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        if not wait_gone(pid, executable, 5.0):
            raise ProcessError(f"{name} (pid {pid}) did not stop after SIGKILL")
    return True
