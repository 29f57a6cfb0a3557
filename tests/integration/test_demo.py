"""``make demo``'s scenario, non-interactive, against the session's real API server.

Checks what a user is told, from the API server itself: every task ends, the poison
task is DeadLettered after maxReclaims + 1 attempts, each worker's share of the
backlog's cost is within the DRR bound, and every process the demo started is gone
afterwards -- or, with --keep, still serving, so the newcomer's next steps (explain,
requeue) work, until --down stops them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentq.demo import MAX_RECLAIMS, WORKERS, shares
from fleet import AGENTQ, ControlPlane, Fleet


def demo(
    control_plane: ControlPlane, *args: str, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agentq.demo", "--kubeconfig", control_plane.kubeconfig, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env={**os.environ, "KUBECONFIG": control_plane.kubeconfig},
    )


def processes_naming(text: str) -> list[int]:
    """Pids of live processes whose command line contains ``text``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = (entry / "stat").read_text().rsplit(")", 1)[-1].split()[0]
        except OSError:
            continue
        if text in cmdline and state != "Z" and "pytest" not in cmdline:
            found.append(int(entry.name))
    return found


@pytest.fixture
def demo_namespace(
    control_plane: ControlPlane, agentq_crds: None, tmp_path: Path
) -> Iterator[Fleet]:
    name = f"demo-{uuid.uuid4().hex[:8]}"
    fleet = Fleet(
        kubeconfig=control_plane.kubeconfig,
        namespace=name,
        workdir=tmp_path,
        kubectl=control_plane.kubectl_path,
    )
    try:
        yield fleet
    finally:
        for pid in processes_naming(name):  # only if a test failed half-way
            os.kill(pid, 9)
        fleet.close()
        control_plane.kubectl("delete", "namespace", name, "--wait=false", check=False)


def check_outcome(fleet: Fleet) -> None:
    tasks = {t["metadata"]["name"]: t for t in fleet.tasks()}
    phases = {n: (t.get("status") or {}).get("phase") for n, t in tasks.items()}
    assert all(p in ("Succeeded", "DeadLettered") for p in phases.values()), phases
    assert [n for n, p in phases.items() if p == "DeadLettered"] == ["poison"]
    poison = tasks["poison"]["status"]
    assert poison["attempt"] == MAX_RECLAIMS + 1 and poison["reclaims"] == MAX_RECLAIMS + 1
    backlog = [t for n, t in tasks.items() if n.startswith("task-")]
    assert backlog and all(t["status"]["attempt"] == 1 for t in backlog)
    fair = shares(
        {name: float(w) for name, (_, w) in WORKERS.items()},
        [(t["status"]["worker"], float(t["spec"]["cost"])) for t in backlog],
    )
    assert all(s.within for s in fair), fair
    # The killed agent's claims were reclaimed and finished elsewhere.
    moved = [t for n, t in tasks.items() if n.startswith("late-") and t["status"]["reclaims"]]
    assert moved and all(t["status"]["history"][0]["worker"] == "large" for t in moved)
    assert all(t["status"]["worker"] != "large" for t in moved)
    # A report committed and read again before its Lease was deleted is no zombie's: no
    # StaleReportRefused for any normal success or retryable failure (the demo has no
    # zombie: its killed agent reports nothing).
    stale = [n for n in tasks if "StaleReportRefused" in fleet.reasons(n)]
    assert not stale, stale


def test_the_demo_runs_to_its_checks_and_leaves_nothing_behind(
    control_plane: ControlPlane, demo_namespace: Fleet, tmp_path: Path
) -> None:
    ns = demo_namespace.namespace
    done = demo(
        control_plane, "--namespace", ns, "--no-live", "--tasks", "21", "--workdir", str(tmp_path)
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    assert "all checks passed: every task terminal, poison DeadLettered" in out
    assert "dead-lettered: poison after 3 attempts on flaky (AgentError)" in out
    assert "large (LeaseExpired) ->" in out
    assert "event: DeadLettered poison" in out  # reclaims and dead letters as they happen
    check_outcome(demo_namespace)
    assert processes_naming(ns) == []
    assert not (tmp_path / "processes.json").exists()


def test_keep_leaves_a_working_fleet_for_explain_and_requeue_until_down(
    control_plane: ControlPlane, demo_namespace: Fleet, tmp_path: Path
) -> None:
    ns = demo_namespace.namespace
    env = {"KUBECONFIG": control_plane.kubeconfig, "PATH": f"{Path(AGENTQ).parent}:/usr/bin:/bin"}
    done = demo(
        control_plane,
        "--namespace", ns, "--no-live", "--tasks", "12", "--keep", "--workdir", str(tmp_path),
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert f"agentq requeue --all-dead-lettered -n {ns} --rate 5" in done.stdout
    assert f"agentq explain poison -n {ns}" in done.stdout
    check_outcome(demo_namespace)
    kept = json.loads((tmp_path / "processes.json").read_text())
    assert {p["name"] for p in kept} >= {"operator", "agent-small", "agent-flaky", "agent-large"}
    assert processes_naming(ns)

    explained = subprocess.run(
        [AGENTQ, "explain", "poison", "-n", ns],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert explained.returncode == 0, explained.stderr
    assert "DeadLettered: dead-lettered" in explained.stdout
    redriven = subprocess.run(
        [AGENTQ, "requeue", "--all-dead-lettered", "-n", ns, "--rate", "5"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert redriven.returncode == 0, redriven.stderr
    assert "agenttask/poison requeued (was DeadLettered" in redriven.stdout
    # The demo fixed the flaky worker's agent, so the redrive succeeds.
    final = demo_namespace.wait_phase("poison", "Succeeded", timeout=60)["status"]
    assert final["history"][-1]["outcome"] == "Succeeded"

    stopped = demo(control_plane, "--down", "--workdir", str(tmp_path), timeout=120)
    assert stopped.returncode == 0, stopped.stderr
    assert f"stopped {len(kept)} demo process(es)" in stopped.stdout
    deadline = time.monotonic() + 20
    while processes_naming(ns) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert processes_naming(ns) == []
