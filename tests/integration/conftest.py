"""Integration fixtures: one real control plane (etcd + kube-apiserver +
kube-controller-manager as local processes) for the whole test session.

The control plane is started once per session in a temporary state directory,
tied to the test process (it dies with it, even on SIGKILL) and stopped by pid
at the end. Set ``AGENTQ_TEST_KUBECONFIG`` to run against an already running
cluster instead (for example one from ``agentq cluster up``).
"""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from kubernetes import client, config

from agentq.controlplane import Cluster
from agentq.controlplane.binaries import resolve


@dataclass
class ControlPlane:
    """A running API server and the tools to talk to it."""

    kubeconfig: str
    bin_dir: str
    server: str
    kubectl_path: str

    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "KUBECONFIG": self.kubeconfig,
            "PATH": f"{self.bin_dir}:{os.environ.get('PATH', '')}",
        }

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        """Run kubectl (the pinned version) against this control plane."""
        done = subprocess.run(
            [self.kubectl_path, *args],
            input=input,
            capture_output=True,
            text=True,
            env=self.env(),
            timeout=timeout,
            check=False,
        )
        if check and done.returncode != 0:
            raise AssertionError(
                f"kubectl {' '.join(args)} exited {done.returncode}:\n{done.stdout}{done.stderr}"
            )
        return done

    def api_client(self) -> client.ApiClient:
        """A fresh synchronous Kubernetes API client for this control plane."""
        return config.new_client_from_config(config_file=self.kubeconfig)


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    external = os.environ.get("AGENTQ_TEST_KUBECONFIG")
    if external:
        kubectl = str(resolve(build=True)["kubectl"])
        yield ControlPlane(
            kubeconfig=external,
            bin_dir=str(Path(kubectl).parent),
            server="",
            kubectl_path=kubectl,
        )
        return
    cluster = Cluster(tmp_path_factory.mktemp("controlplane"))
    state = cluster.up(build=True, tie_to_parent=True)
    try:
        yield ControlPlane(
            kubeconfig=state.kubeconfig,
            bin_dir=state.bin_dir,
            server=state.server,
            kubectl_path=state.binaries["kubectl"],
        )
    finally:
        cluster.down()


@pytest.fixture
def namespace(control_plane: ControlPlane) -> Iterator[str]:
    """A fresh namespace for one test, deleted (without waiting) afterwards."""
    name = f"t-{uuid.uuid4().hex[:10]}"
    control_plane.kubectl("create", "namespace", name)
    yield name
    control_plane.kubectl("delete", "namespace", name, "--wait=false", check=False)
