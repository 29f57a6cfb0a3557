"""The lock files (requirements/*.lock, `make lock`) against the pins of the pyproject
files: every direct pin is in its lock at the same version, every locked package carries
hashes, and what installs packages (the Dockerfile, `make venv`) installs from a lock
with --require-hashes. A pin changed without `make lock` fails here."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def _lock_module():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("lock", ROOT / "requirements" / "lock.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def locked(path: Path) -> dict[str, tuple[str, int]]:
    """name -> (version, number of hashes) of each package a lock file pins."""
    entries: dict[str, tuple[str, int]] = {}
    current = ""
    for line in path.read_text().splitlines():
        match = re.match(r"([A-Za-z0-9_.-]+)==([^\s;\\]+)", line)
        if match:
            current = _normal(match.group(1))
            entries[current] = (match.group(2), 0)
        elif line.strip().startswith("--hash=sha256:") and current:
            version, hashes = entries[current]
            entries[current] = (version, hashes + 1)
    return entries


def test_every_pin_is_locked_with_hashes() -> None:
    lock = _lock_module()
    for name, requirements in lock.inputs().items():
        entries = locked(ROOT / "requirements" / f"{name}.lock")
        assert entries, name
        for requirement in requirements:
            match = re.match(r"([A-Za-z0-9_.-]+)(?:\[[^\]]*\])?==(\S+)", requirement)
            assert match, f"{requirement}: pyproject pins every dependency exactly"
            package, version = _normal(match.group(1)), match.group(2)
            assert entries.get(package, ("", 0))[0] == version, (
                f"{name}.lock has {package} {entries.get(package)}, pyproject pins {version}:"
                " run make lock"
            )
        unhashed = [p for p, (_, hashes) in entries.items() if hashes == 0]
        assert not unhashed, (name, unhashed)
    # The runtime lock holds no development tool.
    runtime = locked(ROOT / "requirements" / "runtime.lock")
    assert not {"pytest", "kubernetes", "mypy", "setuptools", "pip"} & set(runtime)


def test_the_image_and_the_venv_install_from_the_locks() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "--require-hashes -r requirements/runtime.lock" in dockerfile
    assert "--require-hashes -r requirements/build.lock" in dockerfile
    makefile = (ROOT / "Makefile").read_text()
    assert "--require-hashes -r requirements/dev.lock" in makefile
    # Nothing resolved around the locks: the local distributions add no dependency.
    assert re.search(r"--no-deps --no-build-isolation \\\n\s+-e ./sdk", makefile)
    ignored = (ROOT / ".dockerignore").read_text().splitlines()
    assert {"!requirements/runtime.lock", "!requirements/build.lock"} <= set(ignored)
