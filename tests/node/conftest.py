"""Tests that run real pods on a local node (``agentq cluster up --node``).

They need root, the Debian packages of ``make node-deps`` and the node binaries
(``make node``); the image tests also ``make image``. ``make e2e`` runs them with
``AGENTQ_REQUIRE_NODE=1``: there a host that cannot run a node fails them.
Elsewhere they are skipped, saying why. Only one node runs per machine, so these
tests run one after another, each with its own and each leaving the host as it
found it (``host_unchanged``).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import hostcheck
from agentq.controlplane import binaries, node
from nodetools import unavailable


@pytest.fixture(autouse=True)
def node_host() -> None:
    try:
        node.check_host()
        binaries.resolve(build=False, binary_set=binaries.NODE)
        binaries.resolve(build=False)
    except (node.NodeError, binaries.BinaryError) as err:
        unavailable(str(err))


@pytest.fixture
def host_unchanged() -> Iterator[None]:
    """The host after the test is as it was before (see tests/hostcheck.py)."""
    before = hostcheck.snapshot()
    yield
    changed = hostcheck.differences(before, hostcheck.snapshot())
    assert not changed, "the host was left changed:\n" + "\n".join(changed)
