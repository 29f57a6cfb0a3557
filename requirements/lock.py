"""Writes the lock files of requirements/ from the pins of the three pyproject.toml files
(`make lock`; docs/install.md, "Lock files").

- runtime.lock: what the image's /opt/agentq holds besides agentq and agentq-agent
  (the agentq distribution's dependencies); the Dockerfile installs it.
- build.lock: the build backend ([build-system] requires), for building the wheels.
- dev.lock: everything `make venv` installs besides the three local distributions
  (runtime, the test, dev and plot extras, agentq-dev's dependencies).

Each pins every package, transitive ones included, with the sha256 of every file
PyPI has for that version, for Python 3.11 and later on any platform
(``uv pip compile --universal --generate-hashes``); pip installs them with
``--require-hashes``, so nothing floats and nothing unverified is installed.
tests/unit/packaging/test_locks.py checks that every pyproject pin is in its lock.

Run with uv on PATH: python requirements/lock.py
"""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HERE = ROOT / "requirements"
LOCAL = {"agentq", "agentq-agent", "agentq-dev"}


def _project(path: str) -> dict:  # type: ignore[type-arg]
    return tomllib.loads((ROOT / path / "pyproject.toml").read_text())


def _name(requirement: str) -> str:
    match = re.match(r"[A-Za-z0-9_.-]+", requirement)
    assert match, requirement
    return match.group(0).lower().replace("_", "-")


def _third_party(requirements: list[str]) -> list[str]:
    return [r for r in requirements if _name(r) not in LOCAL]


def inputs() -> dict[str, list[str]]:
    """Each lock file's direct requirements, as the pyproject files pin them."""
    agentq, sdk, tools = _project("."), _project("sdk"), _project("tools")
    runtime = _third_party(agentq["project"]["dependencies"])
    extras = agentq["project"]["optional-dependencies"]
    dev = [
        *runtime,
        *_third_party(extras["test"]),
        *_third_party(extras["dev"]),
        *_third_party(sdk["project"]["optional-dependencies"]["postgres"]),
        *_third_party(sdk["project"]["optional-dependencies"]["configmap"]),
        *_third_party(tools["project"]["dependencies"]),
        *_third_party(tools["project"]["optional-dependencies"]["plot"]),
    ]
    return {
        "runtime": runtime,
        "build": list(agentq["build-system"]["requires"]),
        "dev": sorted(set(dev)),
    }


def main() -> int:
    for lock, requirements in inputs().items():
        out = HERE / f"{lock}.lock"
        subprocess.run(
            [
                "uv",
                "pip",
                "compile",
                "-",
                "--universal",
                "--python-version",
                "3.11",
                "--generate-hashes",
                "--no-header",
                "--quiet",
                "--output-file",
                str(out),
            ],
            input="\n".join(requirements) + "\n",
            text=True,
            check=True,
        )
        header = (
            f"# {lock}.lock: written by `make lock` (requirements/lock.py) from the pins in\n"
            "# pyproject.toml; install with pip install --require-hashes -r <this file>.\n"
        )
        out.write_text(header + out.read_text())
        print(f"wrote {out.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
