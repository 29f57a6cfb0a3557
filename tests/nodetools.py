"""Helpers of the tests that need a local node (tests/node, e2e/)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

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
    # Whether pods resolve Service names (a kind cluster's DNS). The local node has no
    # cluster DNS and no kube-proxy: a pod reaches another pod by its IP.
    cluster_dns: bool = True

    def run_kubectl(self, *args: str, input: str | None = None, check: bool = True) -> str:
        """kubectl against this cluster; its output (AssertionError on a failure when
        ``check``)."""
        done = subprocess.run(
            [self.kubectl, "--kubeconfig", self.kubeconfig, *args],
            input=input,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        if check and done.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)}: {done.stdout}{done.stderr}")
        return done.stdout


T = TypeVar("T")


def wait_for(what: str, probe: Callable[[], T | None], timeout: float, every: float = 1.0) -> T:
    """``probe()`` until it gives a true value (returned), else AssertionError after
    ``timeout`` seconds: the e2e tests' one way to wait on the cluster."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(every)
