"""``agentq cluster up --node`` as a user runs it: real pods, logs and exec, in-cluster
access to the API server, the agentq image as non-root, and a host left as it was
by ``down`` -- also after a crash."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config

from agentq.controlplane import imagebuild, node
from agentq.controlplane.procs import pid_runs
from nodetools import agentq, unavailable


def up(state_dir: Path) -> dict[str, Any]:
    started = agentq("cluster", "up", "--node", "--state-dir", str(state_dir))
    assert started.returncode == 0, started.stderr
    status = agentq("cluster", "status", "--json", "--state-dir", str(state_dir))
    state: dict[str, Any] = json.loads(status.stdout)
    assert set(state["pids"]) >= {"containerd", "kubelet", "kube-scheduler", "kube-apiserver"}
    assert all(state["alive"].values()), state["alive"]
    return state


def down(state_dir: Path) -> str:
    stopped = agentq("cluster", "down", "--state-dir", str(state_dir))
    assert stopped.returncode == 0, stopped.stderr
    return stopped.stderr


def api(state: dict[str, Any]) -> client.CoreV1Api:
    return client.CoreV1Api(config.new_client_from_config(config_file=state["kubeconfig"]))


def run_pod(core: client.CoreV1Api, body: dict[str, Any], timeout: float = 90) -> str:
    """Create a pod, wait until it ends (or runs, with restartPolicy Always); its phase."""
    namespace = body["metadata"].get("namespace", "default")
    core.create_namespaced_pod(namespace, body)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        phase = str(core.read_namespaced_pod(body["metadata"]["name"], namespace).status.phase)
        if phase in ("Succeeded", "Failed") or (
            phase == "Running" and body["spec"].get("restartPolicy", "Always") == "Always"
        ):
            return phase
        time.sleep(0.5)
    raise AssertionError(f"pod {body['metadata']['name']} did not finish in {timeout}s")


def pause_pod(name: str, *args: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": node.PAUSE_IMAGE,
                    "imagePullPolicy": "Never",
                    "args": list(args),
                }
            ]
        },
    }


def test_up_node_runs_pods_with_logs_and_exec_and_down_restores_the_host(
    tmp_path: Path, host_unchanged: None
) -> None:
    state_dir = tmp_path / "cluster"
    state = up(state_dir)
    try:
        core = api(state)
        (ready,) = core.list_node().items
        assert any(c.type == "Ready" and c.status == "True" for c in ready.status.conditions)
        assert run_pod(core, pause_pod("hello", "-say", "hello from a pod")) == "Running"
        kubectl = [state["binaries"]["kubectl"], "--kubeconfig", state["kubeconfig"]]
        logs = agentq_kubectl(kubectl, "logs", "hello")
        assert logs.strip() == "hello from a pod"
        # Through the API server to the kubelet, with its client certificate.
        assert agentq_kubectl(kubectl, "exec", "hello", "--", "/pause", "-version").strip() == (
            "agentq-pause 1"
        )
        # One node per machine: a second one is refused, naming the first.
        other = agentq("cluster", "up", "--node", "--state-dir", str(tmp_path / "other"))
        assert other.returncode != 0
        assert "already running on this machine" in other.stderr
        assert str(state_dir) in other.stderr
    finally:
        said = down(state_dir)
    for step in (
        "stopped kubelet",
        "stopped containerd",
        "deleted network interface agentq0",
        "deleted iptables rule",
        "removed cgroup /agentq",
    ):
        assert step in said, said
    for name, pid in state["pids"].items():
        assert not pid_runs(pid, state["binaries"][name]), f"{name} (pid {pid}) still runs"
    assert not state_dir.exists()


def agentq_kubectl(kubectl: list[str], *args: str) -> str:
    import subprocess

    done = subprocess.run(
        [*kubectl, *args], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


PROBE = (
    "import getpass; from kopf._core.engines import peering; "
    "from agentq.kube.config import in_cluster; from agentq.kube.sync import SyncClient; "
    "review = SyncClient(in_cluster()).request('POST', "
    "'/apis/authentication.k8s.io/v1/selfsubjectreviews', "
    "body={'apiVersion': 'authentication.k8s.io/v1', 'kind': 'SelfSubjectReview'}).json(); "
    "print(getpass.getuser(), peering.detect_own_id(manual=False), "
    "review['status']['userInfo']['username'])"
)


@pytest.mark.parametrize("uid", [65532, 12345])
def test_the_agentq_image_runs_as_non_root_on_a_read_only_root(
    uid: int, tmp_path: Path, host_unchanged: None
) -> None:
    """A uid with a passwd entry (the image's) and one without (a cluster's choice)."""
    archive = imagebuild.archive_path(imagebuild.DEFAULT_TAG)
    if not archive.exists():
        unavailable(f"no image archive {archive} (run 'make image')")
    state_dir = tmp_path / "cluster"
    state = up(state_dir)
    try:
        loaded = agentq("cluster", "load", str(archive), "--state-dir", str(state_dir))
        assert loaded.returncode == 0, loaded.stderr
        core = api(state)
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "probe"},
            "spec": {
                "restartPolicy": "Never",
                "securityContext": {"runAsUser": uid, "runAsGroup": uid, "runAsNonRoot": True},
                "containers": [
                    {
                        "name": "main",
                        "image": imagebuild.DEFAULT_TAG,
                        "imagePullPolicy": "Never",
                        "command": ["python3", "-c", PROBE],
                        "securityContext": {
                            "readOnlyRootFilesystem": True,
                            "allowPrivilegeEscalation": False,
                            "capabilities": {"drop": ["ALL"]},
                        },
                        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
                    }
                ],
                "volumes": [{"name": "tmp", "emptyDir": {"medium": "Memory"}}],
            },
        }
        phase = run_pod(core, pod)
        logs = core.read_namespaced_pod_log("probe", "default")
        assert phase == "Succeeded", logs
        # In-cluster configuration (Service address, token, CA) reached the API server.
        assert "system:serviceaccount:default:default" in logs, logs
        assert "KeyError" not in logs
    finally:
        down(state_dir)


def test_up_after_a_crash_cleans_up_first(tmp_path: Path, host_unchanged: None) -> None:
    state_dir = tmp_path / "cluster"
    state = up(state_dir)
    try:
        assert run_pod(api(state), pause_pod("survivor")) == "Running"
        # Every process the cluster started dies at once; the pod's processes (under
        # their shims) live on, and so does every change to the host.
        for pid in state["pids"].values():
            os.kill(pid, signal.SIGKILL)
        again = agentq("cluster", "up", "--node", "--state-dir", str(state_dir))
        assert again.returncode == 0, again.stderr
        assert "cleaning up after a cluster that was not stopped" in again.stderr
        assert "killed containerd shim" in again.stderr
        assert "deleted network interface agentq0" in again.stderr
        state = json.loads(
            agentq("cluster", "status", "--json", "--state-dir", str(state_dir)).stdout
        )
        assert all(state["alive"].values())
        assert api(state).list_namespaced_pod("default").items == []
    finally:
        down(state_dir)
