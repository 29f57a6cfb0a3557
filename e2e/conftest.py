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
import subprocess
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
    # AGENTQ_E2E_IMAGE_TAG: another build of `agentq cluster image --tag` (default the
    # agentq:dev of `make image`).
    tag = os.environ.get("AGENTQ_E2E_IMAGE_TAG") or imagebuild.DEFAULT_TAG
    archive = imagebuild.archive_path(tag)
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
            image=tag,
            pull_policy="Never",
            cluster_dns=False,
        )
    finally:
        cluster.down(say=lambda line: print(line, flush=True))
        changed = hostcheck.differences(before, hostcheck.snapshot())
        assert not changed, "the host was left changed:\n" + "\n".join(changed)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A failed e2e test shows what the cluster said: the operator pods' logs, every
    task's phase and worker, and the Warning events (the cluster is gone after it)."""
    outcome = yield
    report = outcome.get_result()
    platform = getattr(item, "funcargs", {}).get("platform")
    if report.failed and report.when == "call" and isinstance(platform, Platform):
        report.sections.append(("cluster at the failure", _diagnostics(platform)))


def _diagnostics(platform: Platform) -> str:
    def kubectl(*args: str) -> str:
        try:
            done = subprocess.run(
                [platform.kubectl, "--kubeconfig", platform.kubeconfig, *args],
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as err:
            return f"(kubectl {' '.join(args)}: {err})\n"
        return done.stdout + done.stderr

    columns = (
        "custom-columns=NS:.metadata.namespace,NAME:.metadata.name,PHASE:.status.phase,"
        "WORKER:.status.worker,TOKEN:.status.fencingToken"
    )
    parts = [
        ("pods", kubectl("get", "pods", "-A", "-o", "wide")),
        ("agenttasks", kubectl("get", "agenttasks", "-A", "-o", columns)),
        ("agentworkers", kubectl("get", "agentworkers", "-A")),
        ("leases", kubectl("get", "leases", "-A")),
        ("warning events", kubectl("get", "events", "-A", "--field-selector=type=Warning")),
    ]
    operators = ("-l", "app.kubernetes.io/name=agentq-operator", "--all-containers")
    logs = kubectl("-n", "agentq-system", "logs", *operators, "--prefix", "--tail=150")
    parts.append(("operator logs", logs))
    return "\n".join(f"--- {title}\n{text}" for title, text in parts)
