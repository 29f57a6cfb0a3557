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

from agentq.controlplane.cluster import free_port
from builders import worker
from fleet import ControlPlane, Fleet
from podchecks import (
    FROM_ITS_AGENT,
    NO_CREDENTIALS,
    SIDECAR_CALLS,
    judge_from_another_pod,
    judge_no_credentials,
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
