"""The chaos suite's tests: the plan's unit tests need nothing; the short run needs the
control-plane binaries (it starts its own cluster, to restart its API server)."""

from __future__ import annotations

from pathlib import Path

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if Path(item.path).parent != here:
            continue
        pure = Path(item.path).name in ("test_plan.py", "test_verify.py")
        item.add_marker(pytest.mark.unit if pure else pytest.mark.integration)
