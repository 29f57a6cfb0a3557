"""Shared pytest configuration: every test is marked by the directory it lives in, and a
parallel run (pytest-xdist, ``-n N --dist loadgroup``) is arranged here.

``tests/unit`` needs nothing but Python; ``tests/integration`` needs the embedded
control plane (see ``tests/integration/conftest.py``); ``tests/node`` needs a local
node, root and its packages (``make e2e`` runs them; see ``tests/node/conftest.py``).
``slow`` marks the tests that start a control plane of their own, the short chaos run
and the bad-input corpus (``make test`` runs them; ``make test-fast`` does not).

In a parallel run the xdist controller starts one control plane for all workers, and
hands out work in groups (``parallel.py``): a test that uses a module-scoped fixture (an
arena, a cluster of its own) runs on the same worker as the rest of its module, so the
fixture is made once; the tests marked ``xdist_group("own-cluster")`` run one after the
other, so one second control plane runs at a time; the slow groups go first, as they
are the longest.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from _pytest.nodeid import NodeId

import parallel

_HERE = Path(__file__).parent


def pytest_configure(config: pytest.Config) -> None:
    distributed = getattr(config.option, "numprocesses", None) and config.option.dist != "no"
    if distributed and not hasattr(config, "workerinput"):
        config.pluginmanager.register(parallel.Controller(), "agentq-parallel")


def _unique_node_ids(items: list[pytest.Item]) -> None:
    """schemathesis 4.32.5 under pytest 9.2 gives the item of each API operation the node
    id of the test (only its name has the operation): xdist schedules by node id, so under
    ``-n`` only the first operation ran, and reports counted the nine as one. Each such
    item gets the id its name says (a private attribute of pytest's: no public way)."""
    seen = Counter(item.nodeid for item in items)
    for item in items:
        if seen[item.nodeid] > 1 and item.parent is not None:
            item._id = NodeId.parse(f"{item.parent.nodeid}::{item.name}")  # type: ignore[attr-defined]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    _unique_node_ids(items)
    for item in items:
        if not Path(item.path).is_relative_to(_HERE):
            continue  # e2e/test_scenario.py, collected with tests/node by make e2e
        parts = Path(item.path).relative_to(_HERE).parts
        if parts and parts[0] in ("unit", "integration", "node"):
            item.add_marker(getattr(pytest.mark, parts[0]))

    # Slow tests first, then the other integration tests, then the rest (in collection
    # order within each): xdist hands out work in this order.
    def rank(item: pytest.Item) -> int:
        if item.get_closest_marker("slow"):
            return 0
        return 1 if item.get_closest_marker("integration") else 2

    items.sort(key=rank)
    parallel.record_groups(config, items)
