"""The agent SDK's own tests: pure, standard library and pytest only, so that they run
against the SDK installed alone (tests/unit/packaging does that in a clean virtualenv)
as well as in a checkout's virtualenv with everything (make test)."""

from __future__ import annotations

from pathlib import Path

import pytest

_HERE = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if Path(item.path).is_relative_to(_HERE):
            item.add_marker(pytest.mark.unit)
