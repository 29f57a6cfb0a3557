"""The core stays pure: no Kubernetes, no I/O, no clock, no randomness.

import-linter forbids kopf and kubernetes (pyproject.toml); this test is
stricter and needs no tool: every import in ``agentq/scheduler`` must come from
a short list of computation-only modules.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import agentq.scheduler

pytestmark = pytest.mark.unit

PACKAGE = Path(agentq.scheduler.__file__).parent
ALLOWED = {
    "__future__",
    "abc",
    "collections",
    "collections.abc",
    "dataclasses",
    "fractions",
    "heapq",
    "math",
}


def imported_modules(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
    return found


@pytest.mark.parametrize("path", sorted(PACKAGE.glob("*.py")), ids=lambda p: p.name)
def test_the_core_imports_only_computation(path: Path) -> None:
    foreign = {
        name
        for name in imported_modules(path)
        if name not in ALLOWED and not name.startswith("agentq.scheduler")
    }
    assert not foreign, f"{path.name} imports {sorted(foreign)}"


def test_importing_the_core_loads_neither_kopf_nor_kubernetes() -> None:
    probe = (
        "import sys, agentq.scheduler;"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('kopf', 'kubernetes'));"
        "print(','.join(bad))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], check=True, capture_output=True, text=True
    ).stdout
    assert out.strip() == ""
