"""The example agents in Go and TypeScript (examples/agents), built for the tests.

``make polyglot-deps`` installs their Go modules and npm packages (and builds each
once); here each is built again before use, which the Go build cache and tsc's
incremental build make a matter of a second or two when nothing changed. Builds
take a file lock: parallel test workers share the output files.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
AGENTS = ROOT / "examples" / "agents"
GO_DIR = AGENTS / "go"
TS_DIR = AGENTS / "ts"
LANGS = ("go", "ts")


def missing(lang: str) -> str | None:
    """Why the agent in ``lang`` cannot be built here (None: it can)."""
    tool = "go" if lang == "go" else "node"
    if shutil.which(tool) is None:
        return f"{tool} is not installed"
    if lang == "ts" and not (TS_DIR / "node_modules" / ".deps-stamp").exists():
        return "the npm packages are not installed: make polyglot-deps"
    return None


def require(lang: str) -> None:
    """Skip (fail in CI, where ``make test`` installs everything) without the toolchain."""
    why = missing(lang)
    if why is None:
        return
    if os.environ.get("CI"):
        pytest.fail(f"the {lang} example agent cannot be built: {why}")
    pytest.skip(f"the {lang} example agent cannot be built: {why}")


@contextlib.contextmanager
def _locked(directory: Path) -> Iterator[None]:
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def run(args: list[str], cwd: Path, *, timeout: float = 600) -> str:
    done = subprocess.run(
        args, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False
    )
    if done.returncode != 0:
        raise AssertionError(
            f"{' '.join(args)} (in {cwd}) exited {done.returncode}:\n{done.stdout}{done.stderr}"
        )
    return done.stdout + done.stderr


@functools.cache
def agent_argv(lang: str) -> tuple[str, ...]:
    """The argv of the built agent in ``lang`` (built now if it is not up to date)."""
    require(lang)
    if lang == "go":
        with _locked(GO_DIR / "bin"):
            run(["go", "build", "-o", "bin/agent", "./cmd/agent"], GO_DIR)
        return (str(GO_DIR / "bin" / "agent"),)
    with _locked(TS_DIR / "dist"):
        run([str(TS_DIR / "node_modules" / ".bin" / "tsc"), "-p", "."], TS_DIR)
    return (shutil.which("node") or "node", str(TS_DIR / "dist" / "src" / "main.js"))
