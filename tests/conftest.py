"""Shared pytest configuration: every test is marked by the directory it lives in.

``tests/unit`` needs nothing but Python; ``tests/integration`` needs the embedded
control plane (see ``tests/integration/conftest.py``); ``tests/node`` needs a local
node, root and its packages (``make e2e`` runs them; see ``tests/node/conftest.py``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

_HERE = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if not Path(item.path).is_relative_to(_HERE):
            continue  # e2e/test_scenario.py, collected with tests/node by make e2e
        parts = Path(item.path).relative_to(_HERE).parts
        if parts and parts[0] in ("unit", "integration", "node"):
            item.add_marker(getattr(pytest.mark, parts[0]))
