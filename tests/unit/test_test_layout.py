"""Test modules are imported by their file name alone (rootdir-based, no packages): two
with one name in different folders break a whole run with "import file mismatch" --
only when both are collected, so the fast tier would never see it. Checked here."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]


def test_no_two_test_modules_share_a_name() -> None:
    where: defaultdict[str, list[str]] = defaultdict(list)
    for folder in ("tests", "e2e"):
        for path in sorted((ROOT / folder).rglob("test_*.py")):
            where[path.name].append(str(path.relative_to(ROOT)))
    assert {name: paths for name, paths in where.items() if len(paths) > 1} == {}
