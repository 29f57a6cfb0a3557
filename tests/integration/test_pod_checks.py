"""The scripts the e2e scenario runs inside agent pods (tests/podchecks.py), run here
against a real local sidecar and API server, so they are known to work and to tell a
refusal from an answer before they run on a node."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

from kubernetes import client

from accounts import token
from agentq.controlplane.cluster import free_port
from builders import task, worker
from fleet import ControlPlane, Fleet
from manifests import agent_objects, to_yaml
from podchecks import (
    FROM_ITS_AGENT,
    NO_CREDENTIALS,
    SIDECAR_CALLS,
    TASK_READS,
    judge_from_another_pod,
    judge_no_credentials,
    judge_task_reads,
)


def run(script: str, *args: str, env: dict[str, str]) -> dict[str, list[object]]:
    done = subprocess.run(
        [sys.executable, "-c", script, *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=True,
    )
    out: dict[str, list[object]] = json.loads(done.stdout.strip().splitlines()[-1])
    return out


def test_sidecar_calls_from_its_agent_and_from_another_pod(fleet: Fleet) -> None:
    fleet.add_worker(worker("w").capabilities("llm"))
    pair = fleet.agent("w", "hold")
    pair.wait_serving()
    env = {**os.environ, "AGENTQ_SIDECAR_TOKEN_FILE": str(pair.token_file)}
    assert run(SIDECAR_CALLS, pair.url, pair.metrics_url, env=env) == FROM_ITS_AGENT
    # Another pod dials the pod IP, where nothing listens on the API port.
    elsewhere = run(SIDECAR_CALLS, f"http://127.0.0.1:{free_port()}", pair.metrics_url, env=env)
    assert judge_from_another_pod(elsewhere) == [], elsewhere
    # The judge is not a rubber stamp: the reachable API is a problem from another pod.
    assert judge_from_another_pod(run(SIDECAR_CALLS, pair.url, pair.metrics_url, env=env))


def test_no_credentials_sees_an_anonymous_caller(
    control_plane: ControlPlane, fleet: Fleet, tmp_path: Path
) -> None:
    server = urlsplit(control_plane.server)
    home = tmp_path / "home"
    home.mkdir()
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in ("KUBECONFIG", "AGENTQ_SIDECAR_TOKEN_FILE")
    }
    env |= {
        "HOME": str(home),
        "KUBERNETES_SERVICE_HOST": str(server.hostname),
        "KUBERNETES_SERVICE_PORT": str(server.port),
        # A share that cannot be written (tests may run as root: a missing directory).
        "AGENTQ_SIDECAR_TOKEN_FILE": str(tmp_path / "absent" / "sidecar-token"),
    }
    out = run(NO_CREDENTIALS, fleet.namespace, env=env)
    assert judge_no_credentials(out) == [], out
    (home / ".kube").mkdir()
    (home / ".kube" / "config").write_text("planted")
    assert judge_no_credentials(run(NO_CREDENTIALS, fleet.namespace, env=env)) == [
        "a kubeconfig in HOME: True"
    ]


def test_task_reads_tell_a_refusal_from_a_leak(
    control_plane: ControlPlane,
    agentq_installed: None,
    fleet: Fleet,
    core_api: client.CoreV1Api,
    tmp_path: Path,
) -> None:
    """TASK_READS with an agent's own token: another namespace's task refused (403),
    no token at all anonymous; its own namespace's task, which the agent role may
    ``get``, is read -- and the judge says so."""
    namespace = f"{fleet.namespace}-b"
    core_api.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
    for ns, secret in ((fleet.namespace, "ours"), (namespace, "theirs")):
        body = task("t").namespace(ns).obj()
        body["spec"]["payload"] = {"secret": secret}
        fleet.custom.create_namespaced_custom_object(
            "agentq.dev", "v1alpha1", ns, "agenttasks", body
        )
    objects = agent_objects(control_plane.kubectl_path, worker="w", namespace=fleet.namespace)
    accounts = [o for o in objects if o["kind"] in ("ServiceAccount", "RoleBinding")]
    control_plane.kubectl("apply", "-f", "-", input=to_yaml(accounts))
    token_file = tmp_path / "token"
    token_file.write_text(token(core_api, fleet.namespace, "agentq-agent-w"))
    server = urlsplit(control_plane.server)
    env = {
        **os.environ,
        "KUBERNETES_SERVICE_HOST": str(server.hostname),
        "KUBERNETES_SERVICE_PORT": str(server.port),
    }
    theirs = [f"{namespace}/t", f"{namespace}/"]
    out = run(TASK_READS, str(token_file), "-", *theirs, env=env)
    assert out.pop("a token") is True
    assert judge_task_reads(out, "theirs") == [], out
    assert [answer[0] for answer in out.values()] == [403, 403], out
    out = run(TASK_READS, str(tmp_path / "absent"), "-", *theirs, env=env)
    assert out.pop("a token") is False
    assert judge_task_reads(out, "theirs") == [], out
    assert all("system:anonymous" in str(answer[1]) for answer in out.values()), out
    ours = run(TASK_READS, str(token_file), "-", f"{fleet.namespace}/t", env=env)
    assert ours[f"{fleet.namespace}/t"][0] == 200
    assert judge_task_reads(ours, "ours") == [
        f"{fleet.namespace}/t: 200 " + repr(str(ours[f"{fleet.namespace}/t"][1])[:200]),
        f"{fleet.namespace}/t: the answer holds the team's payload",
    ]
    core_api.delete_namespace(namespace)
