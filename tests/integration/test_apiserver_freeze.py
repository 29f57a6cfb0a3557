"""An API server that stops answering for longer than a lease (SIGSTOP, as a starved or
paused control plane does) reclaims no healthy claim: the holders could not renew
while it was stopped either. On a control plane of its own, so the freeze disturbs
no other test.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from pathlib import Path

import pytest

from agentq.controlplane import Cluster
from agentq.controlplane.cluster import ClusterState
from builders import task, worker
from fleet import Fleet

# A control plane of its own: one such module at a time (see tests/conftest.py).
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("own-cluster")]


@pytest.mark.parametrize(
    ("freeze", "flags"),
    [
        pytest.param(6.5, (), id="longer-than-the-lease"),
        pytest.param(14.0, (), id="longer-than-the-leader-renew-deadline"),
        pytest.param(6.5, ("--no-leader-election",), id="no-leader-election"),
    ],
)
def test_a_frozen_api_server_reclaims_no_healthy_claim_and_still_the_dead_ones(
    own_cluster: tuple[Cluster, ClusterState],
    tmp_path: Path,
    freeze: float,
    flags: tuple[str, ...],
) -> None:
    _, state = own_cluster
    namespace = f"freeze-{uuid.uuid4().hex[:6]}"
    fleet = Fleet(
        kubeconfig=state.kubeconfig,
        namespace=namespace,
        workdir=tmp_path,
        kubectl=state.binaries["kubectl"],
    )
    fleet.kubectl("create", "namespace", namespace)
    try:
        pairs = {}
        for name in ("alive", "dead"):
            fleet.add_worker(worker(name).capabilities("llm").max_in_flight(3))
            pairs[name] = fleet.agent(name, "hold")
        fleet.operator(*flags)
        names = [f"job-{i}" for i in range(6)]
        for name in names:
            fleet.add_task(task(name).requires("llm").lease(5))
        held = {name: fleet.wait_phase(name, "Running", timeout=60)["status"] for name in names}
        holders = {name: status["worker"] for name, status in held.items()}
        assert sorted(holders.values()) == ["alive"] * 3 + ["dead"] * 3, holders
        time.sleep(3)  # renewed a few times
        pairs["dead"].signal(signal.SIGKILL)  # its claims must still be reclaimed
        pid = state.pids["kube-apiserver"]
        os.kill(pid, signal.SIGSTOP)
        try:
            time.sleep(freeze)  # the 5 s leases end on the operator's clock meanwhile
        finally:
            os.kill(pid, signal.SIGCONT)
        resumed = time.monotonic()
        for name, holder in holders.items():
            if holder == "dead":
                fleet.wait_task(
                    name,
                    lambda t: (t.get("status") or {}).get("reclaims") == 1,
                    timeout=30,
                    what="the dead holder's claim reclaimed",
                )
        took = time.monotonic() - resumed
        time.sleep(8)  # more than a lease: a wrong reclaim of a live claim would show now
        for name, holder in holders.items():
            if holder == "alive":
                status = fleet.task(name)["status"]
                assert status.get("phase") == "Running" and not status.get("reclaims"), (
                    f"{name}, held by a live agent through a {freeze}s silence of the API "
                    f"server, was reclaimed: {status}\n{fleet.logs()}"
                )
        # The dead holder's claims: a lease (and a little) after the API server answered.
        assert took < 5 + 10, f"the dead holder's claims took {took:.1f}s to be reclaimed"
    finally:
        fleet.close()
