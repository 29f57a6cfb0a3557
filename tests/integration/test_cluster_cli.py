"""``agentq cluster up | status | env | down`` as a user runs them, from a shell.

Runs a second, separate control plane (its own state directory and ports) so
that stopping it cannot disturb the session's shared one.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from agentq.controlplane.cluster import pid_runs

AGENTQ = str(Path(sys.executable).with_name("agentq"))


def agentq(*args: str, state_dir: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [AGENTQ, "cluster", *args, "--state-dir", str(state_dir)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={k: v for k, v in os.environ.items() if k != "KUBECONFIG"},
    )


@pytest.mark.slow
@pytest.mark.xdist_group("own-cluster")
def test_up_status_env_down_lifecycle(tmp_path: Path) -> None:
    state_dir = tmp_path / "cluster"
    started = agentq("up", state_dir=state_dir)
    try:
        assert started.returncode == 0, started.stderr
        assert f"export KUBECONFIG={state_dir / 'kubeconfig'}" in started.stdout

        state = json.loads(agentq("status", "--json", state_dir=state_dir).stdout)
        assert set(state["pids"]) == {"etcd", "kube-apiserver", "kube-controller-manager"}
        assert all(state["alive"].values())
        assert state["server"].startswith("https://127.0.0.1:")

        again = agentq("up", state_dir=state_dir)
        assert again.returncode != 0
        assert "already running" in again.stderr

        exports = agentq("env", state_dir=state_dir).stdout
        kubectl = Path(state["binaries"]["kubectl"])
        shown = subprocess.run(
            ["bash", "-c", f"{exports}\n{kubectl} get namespace default -o name"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert shown.stdout.strip() == "namespace/default", shown.stderr
    finally:
        stopped = agentq("down", state_dir=state_dir)
    assert stopped.returncode == 0, stopped.stderr
    assert "control plane stopped" in stopped.stdout
    for name, pid in state["pids"].items():
        assert not pid_runs(pid, state["binaries"][name]), f"{name} (pid {pid}) still runs"
    assert not state_dir.exists()

    assert agentq("status", state_dir=state_dir).returncode == 1
    assert "no control plane was running" in agentq("down", state_dir=state_dir).stdout


def test_up_reports_a_port_in_use(tmp_path: Path) -> None:
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        refused = agentq("up", "--port", str(port), state_dir=tmp_path / "c")
    assert refused.returncode != 0
    assert f"port {port} on 127.0.0.1 is in use" in refused.stderr
    assert not (tmp_path / "c" / "state.json").exists()


def test_up_shows_the_log_of_a_component_that_dies_at_start(tmp_path: Path) -> None:
    # An etcd that exits at once: a stand-in binary placed first via KUBEBUILDER_ASSETS.
    assets = tmp_path / "assets"
    assets.mkdir()
    fake = assets / "etcd"
    fake.write_text("#!/bin/sh\necho 'etcd: cannot open data dir: disk on fire' >&2\nexit 7\n")
    fake.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    env["KUBEBUILDER_ASSETS"] = str(assets)
    done = subprocess.run(
        [AGENTQ, "cluster", "up", "--state-dir", str(tmp_path / "c")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=env,
    )
    assert done.returncode != 0
    assert "etcd exited with code 7 while starting" in done.stderr
    assert "disk on fire" in done.stderr
    assert shutil.which("true")  # the machine is sane; the failure above was etcd's
