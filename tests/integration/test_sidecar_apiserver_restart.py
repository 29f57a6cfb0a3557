"""The sidecar rides out a restart of the API server: it keeps serving its agent, does
not exit, lists and watches again, and renews the claim it holds once the server
is back. On a control plane of its own, so the restart disturbs no other test.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from agentq.controlplane import Cluster
from agentq.controlplane.cluster import ClusterState
from builders import task, worker
from fleet import AgentPair, Fleet

# A control plane of its own: one such module at a time (see tests/conftest.py).
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("own-cluster")]


def restart_apiserver(cluster: Cluster, state: ClusterState, down_seconds: float) -> None:
    """Stop kube-apiserver (SIGTERM, by pid; SIGKILL after 10 s), wait ``down_seconds``,
    start it again with the same arguments, and record the new pid so ``cluster.down``
    stops it. (Uses the Cluster's private helpers: it has no restart of its own.)"""
    pid = state.pids["kube-apiserver"]
    args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[1:-1]
    os.kill(pid, signal.SIGTERM)
    old = cluster._children.pop(pid)
    try:
        old.wait(timeout=10)
    except subprocess.TimeoutExpired:  # it drains long-running watches first; do not wait
        old.kill()
        old.wait(timeout=10)
    time.sleep(down_seconds)
    binary = state.binaries["kube-apiserver"]
    new = cluster._start("kube-apiserver", binary, [a.decode() for a in args], True)
    cluster._children[new.pid] = new
    state.pids["kube-apiserver"] = new.pid
    cluster._save(state)


def status(pair: AgentPair) -> dict[str, Any]:
    return pair.client(timeout=5).request("GET", "/v1/status")


def kubectl(
    state: ClusterState, *args: str, check: bool = True
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [state.binaries["kubectl"], "--kubeconfig", state.kubeconfig, *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=check,
    )


def wait_apiserver(state: ClusterState, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while kubectl(state, "get", "--raw", "/readyz", check=False).stdout.strip() != "ok":
        assert time.monotonic() < deadline, "kube-apiserver did not come back"
        time.sleep(0.5)


def test_the_sidecar_rides_out_an_api_server_restart(
    own_cluster: tuple[Cluster, ClusterState], tmp_path: Path
) -> None:
    cluster, state = own_cluster
    namespace = f"restart-{uuid.uuid4().hex[:6]}"
    kubectl(state, "create", "namespace", namespace)
    fleet = Fleet(
        kubeconfig=state.kubeconfig,
        namespace=namespace,
        workdir=tmp_path,
        kubectl=state.binaries["kubectl"],
    )
    try:
        fleet.add_worker(worker("a").capabilities("llm"))
        # Leases long enough to outlast the outage: this test is about the sidecar.
        pair = fleet.agent("a", "hold", worker_lease_seconds=30)
        operator = fleet.operator()
        fleet.add_task(task("job").requires("llm").lease(30))
        held = fleet.wait_phase("job", "Running", timeout=60)["status"]
        operator.stop()  # the operator's own recovery is not under test here
        before = status(pair)
        assert before["workerLeaseHeld"] and before["watchSynced"]
        lease = fleet.task_lease("job")
        assert lease is not None
        renewed_before = lease.spec.renew_time

        restart_apiserver(cluster, state, down_seconds=5)
        # Meanwhile the sidecar goes on serving its agent (it answers from memory).
        assert status(pair)["assignments"] == 1
        wait_apiserver(state)
        fleet.api.close()
        fleet.api = fleet_api = __import__("kubernetes").config.new_client_from_config(
            config_file=state.kubeconfig
        )
        fleet.leases = __import__("kubernetes").client.CoordinationV1Api(fleet_api)

        deadline = time.monotonic() + 60
        while True:
            now = status(pair)
            lease = fleet.task_lease("job")
            if (
                now["watchSynced"]
                and now["watchListings"] > before["watchListings"]
                and now["renewals"] > before["renewals"]
                and lease is not None
                and lease.spec.renew_time != renewed_before
            ):
                break
            assert time.monotonic() < deadline, (now, pair.sidecar.text()[-3000:])
            time.sleep(0.5)
        # Still the same processes, and the same attempt: nothing was lost or re-granted.
        assert pair.sidecar.popen.poll() is None, pair.sidecar.text()
        assert pair.agent.popen.poll() is None, pair.agent.text()
        assert lease.spec.holder_identity == "a"
        assignment = pair.client(timeout=5).request("GET", "/v1/assignments/job")
        assert assignment["token"] == held["fencingToken"] and assignment["state"] == "active"
        assert now["workerLeaseHeld"]
    finally:
        fleet.close()
