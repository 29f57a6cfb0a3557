"""A leader stopped (SIGSTOP) with decisions queued must not send them after a standby
took over: the split brain the chaos run found (a worker over maxInFlight).

Replica A talks to the API server through a relay the test controls, with one write
slot (WRITE_CONCURRENCY=1): while the relay holds A's requests, A grants a decoy
task (its request stays on the wire) and decides a grant of ``new`` to worker ``w``
(queued behind it). A is then stopped; the standby B takes over, and since ``w`` was
given the capability an older task ``old`` waited for, B grants ``old`` to ``w``
(maxInFlight 1), so ``new`` waits. When A resumes, the grant it decided before the
stop must not go out.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from builders import task, worker
from fleet import Fleet, Process
from relay import (
    only_old_on_w,
    relayed_kubeconfig,
    standby_and_an_older_task,
    takeover_grants_old_to_w,
    wait_for,
)

pytestmark = pytest.mark.integration

FLAGS = ("--leader-election", "--leader-lease-seconds", "4")


@pytest.mark.timeout(240)
def test_a_stopped_leader_does_not_send_decisions_queued_before_a_standby_took_over(
    fleet: Fleet, tmp_path: Path
) -> None:
    fleet.add_worker(worker("w").capabilities("llm").max_in_flight(1))
    fleet.add_worker(worker("dw").capabilities("decoy").max_in_flight(5))
    for name in ("w", "dw"):
        fleet.agent(name, "hold").wait_serving()
    relay, kubeconfig = relayed_kubeconfig(fleet.kubeconfig, tmp_path)
    a: Process | None = None
    try:
        a = fleet.operator(*FLAGS, env={"KUBECONFIG": kubeconfig, "AGENTQ_WRITE_CONCURRENCY": "1"})
        replica_a = a
        wait_for("A leads", lambda: str(replica_a.pid) in fleet.leader(), fleet)
        b = standby_and_an_older_task(fleet, *FLAGS)

        relay.hold()
        fleet.add_task(task("decoy").requires("decoy").lease(120))
        fleet.add_task(task("new").requires("llm").lease(120))
        time.sleep(1.5)  # A decides both: the decoy's grant on the wire, new's queued
        a.signal(signal.SIGSTOP)
        assert (fleet.task("new").get("status") or {}).get("phase") in (None, "Pending")
        relay.flow()
        takeover_grants_old_to_w(fleet, b)  # while A is stopped

        a.signal(signal.SIGCONT)
        # A resumes: whatever it would send, it sends now.
        only_old_on_w(fleet, 8, "two deciders put w over maxInFlight 1")
        assert str(b.pid) in fleet.leader()
        assert (fleet.task("new").get("status") or {}).get("phase") == "Pending"
    finally:
        if a is not None:
            a.signal(signal.SIGCONT)
        relay.close()
