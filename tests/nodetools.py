"""Helpers of the tests that need a local node (tests/node, e2e/)."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

AGENTQ = str(Path(sys.executable).with_name("agentq"))


def unavailable(reason: str) -> None:
    """Skip, saying why; fail instead under ``AGENTQ_REQUIRE_NODE`` (``make e2e``)."""
    if os.environ.get("AGENTQ_REQUIRE_NODE"):
        pytest.fail(f"AGENTQ_REQUIRE_NODE is set but {reason}")
    pytest.skip(reason)


def agentq(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """Run the agentq CLI as a user would (not tied to the test process)."""
    return subprocess.run(
        [AGENTQ, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env={k: v for k, v in os.environ.items() if k != "KUBECONFIG"},
    )


@dataclass(frozen=True)
class Platform:
    """A cluster with real pods, for the e2e scenario (e2e/conftest.py makes one)."""

    kubeconfig: str
    kubectl: str
    ctr: tuple[str, ...]  # runs ctr against the node's containerd ("-n k8s.io ..." follows)
    image: str
    pull_policy: str
