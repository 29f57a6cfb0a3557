"""Where the e2e scenario (test_scenario.py) runs: a cluster and a way into its runtime.

- By default (``make e2e``): a local node, ``agentq cluster up --node`` in a
  temporary state directory, with the image archive of ``make image`` imported
  into its containerd; stopped at the end, and the host checked to be as it was.
- ``AGENTQ_E2E_KUBECONFIG`` set (``e2e/kind/run.sh``): that cluster, with
  ``AGENTQ_E2E_CTR`` the command that runs ``ctr`` against its node's containerd
  (for kind: ``docker exec <node> ctr``) and ``AGENTQ_E2E_IMAGE`` loaded there.
"""

from __future__ import annotations

import os
import shlex
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

import hostcheck
from agentq.controlplane import binaries, imagebuild, node
from agentq.controlplane.cluster import Cluster
from nodetools import Platform, unavailable


@pytest.fixture(scope="session")
def platform(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Platform]:
    external = os.environ.get("AGENTQ_E2E_KUBECONFIG")
    if external:
        yield Platform(
            kubeconfig=external,
            kubectl=os.environ.get("AGENTQ_E2E_KUBECTL") or shutil.which("kubectl") or "kubectl",
            ctr=tuple(shlex.split(os.environ["AGENTQ_E2E_CTR"])),
            image=os.environ.get("AGENTQ_E2E_IMAGE", imagebuild.DEFAULT_TAG),
            pull_policy="IfNotPresent",
        )
        return
    try:
        node.check_host()
        binaries.resolve(build=False, binary_set=binaries.NODE)
    except (node.NodeError, binaries.BinaryError) as err:
        unavailable(str(err))
    archive = imagebuild.archive_path(imagebuild.DEFAULT_TAG)
    if not archive.exists():
        unavailable(f"no image archive {archive} (run 'make image')")
    before = hostcheck.snapshot()
    cluster = Cluster(tmp_path_factory.mktemp("e2e") / "cluster")
    state = cluster.up(with_node=True, tie_to_parent=True, say=lambda line: print(line, flush=True))
    try:
        assert state.node is not None
        local = node.LocalNode(Path(state.state_dir))
        local.import_image(node.NodeState(**state.node), archive)
        yield Platform(
            kubeconfig=state.kubeconfig,
            kubectl=state.binaries["kubectl"],
            ctr=("ctr", "--address", state.node["containerd_socket"]),
            image=imagebuild.DEFAULT_TAG,
            pull_policy="Never",
        )
    finally:
        cluster.down(say=lambda line: print(line, flush=True))
        changed = hostcheck.differences(before, hostcheck.snapshot())
        assert not changed, "the host was left changed:\n" + "\n".join(changed)
