"""A fleet on the real control plane: AgentWorkers, AgentTasks, scripted agents and
operator processes, created and read back through the API server.

Every process started here is a real process, stopped by its pid at teardown.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes import client, config
from kubernetes.client.rest import ApiException

from agentq import GROUP, VERSION, protocol, scripted_agent
from builders import TaskBuilder, WorkerBuilder

AGENTQ = str(Path(sys.executable).with_name("agentq"))


@dataclass
class ControlPlane:
    """A running API server and the tools to talk to it."""

    kubeconfig: str
    bin_dir: str
    server: str
    kubectl_path: str

    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "KUBECONFIG": self.kubeconfig,
            "PATH": f"{self.bin_dir}:{os.environ.get('PATH', '')}",
        }

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        """Run kubectl (the pinned version) against this control plane."""
        done = subprocess.run(
            [self.kubectl_path, *args],
            input=input,
            capture_output=True,
            text=True,
            env=self.env(),
            timeout=timeout,
            check=False,
        )
        if check and done.returncode != 0:
            raise AssertionError(
                f"kubectl {' '.join(args)} exited {done.returncode}:\n{done.stdout}{done.stderr}"
            )
        return done

    def api_client(self) -> client.ApiClient:
        """A fresh synchronous Kubernetes API client for this control plane."""
        return config.new_client_from_config(config_file=self.kubeconfig)


class Process:
    """A child process with its log file; stopped by pid."""

    def __init__(self, args: list[str], log: Path, env: dict[str, str]) -> None:
        self.args = args
        self.log = log
        self._out = open(log, "ab")  # noqa: SIM115 - closed in stop()
        self.popen = subprocess.Popen(
            args, stdout=self._out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env
        )
        self.pid = self.popen.pid

    def signal(self, sig: signal.Signals) -> None:
        if self.popen.poll() is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        """SIGKILL, as a node failure or OOM kill would."""
        self.signal(signal.SIGKILL)
        self.popen.wait(timeout=10)

    def stop(self) -> None:
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGCONT)  # a frozen process cannot handle SIGTERM
            self.signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()
        self._out.close()

    def text(self) -> str:
        return self.log.read_text(errors="replace")


class Fleet:
    """One namespace's AgentWorkers, AgentTasks, agents and operators."""

    def __init__(self, *, kubeconfig: str, namespace: str, workdir: Path, kubectl: str) -> None:
        self.kubeconfig = kubeconfig
        self.namespace = namespace
        self.workdir = workdir
        self.kubectl_path = kubectl
        self.api = config.new_client_from_config(config_file=kubeconfig)
        self.custom = client.CustomObjectsApi(self.api)
        self.leases = client.CoordinationV1Api(self.api)
        self.core = client.CoreV1Api(self.api)
        self.processes: list[Process] = []

    # -- objects -------------------------------------------------------------------------

    def add_worker(self, builder: WorkerBuilder) -> dict[str, Any]:
        body = builder.namespace(self.namespace).obj()
        created: dict[str, Any] = self.custom.create_namespaced_custom_object(
            GROUP, VERSION, self.namespace, "agentworkers", body
        )
        return created

    def add_task(self, builder: TaskBuilder) -> dict[str, Any]:
        body = builder.namespace(self.namespace).obj()
        created: dict[str, Any] = self.custom.create_namespaced_custom_object(
            GROUP, VERSION, self.namespace, "agenttasks", body
        )
        return created

    def task(self, name: str) -> dict[str, Any]:
        got: dict[str, Any] = self.custom.get_namespaced_custom_object(
            GROUP, VERSION, self.namespace, "agenttasks", name
        )
        return got

    def worker(self, name: str) -> dict[str, Any]:
        got: dict[str, Any] = self.custom.get_namespaced_custom_object(
            GROUP, VERSION, self.namespace, "agentworkers", name
        )
        return got

    def tasks(self) -> list[dict[str, Any]]:
        listed = self.custom.list_namespaced_custom_object(
            GROUP, VERSION, self.namespace, "agenttasks"
        )
        items: list[dict[str, Any]] = listed["items"]
        return items

    def task_lease(self, task: str) -> client.V1Lease | None:
        try:
            lease: client.V1Lease = self.leases.read_namespaced_lease(
                protocol.task_lease_name(task), self.namespace
            )
            return lease
        except ApiException as err:
            if err.status == 404:
                return None
            raise

    def events(self, name: str) -> list[client.CoreV1Event]:
        items: list[client.CoreV1Event] = self.core.list_namespaced_event(
            self.namespace, field_selector=f"involvedObject.name={name}"
        ).items
        return items

    def reasons(self, name: str) -> list[str]:
        events = sorted(self.events(name), key=lambda e: e.metadata.creation_timestamp)
        return [e.reason for e in events]

    def wait_reasons(
        self, name: str, expected: dict[str, int], *, timeout: float = 10
    ) -> list[str]:
        """Wait until the object's events include each reason at least ``count`` times.

        Events are recorded right after the status write they describe, so a test
        that saw the status may look a moment before the event exists.
        """
        deadline = time.monotonic() + timeout
        while True:
            reasons = self.reasons(name)
            if all(reasons.count(r) >= n for r, n in expected.items()):
                return reasons
            if time.monotonic() > deadline:
                raise AssertionError(f"events of {name}: {reasons}, expected {expected}")
            time.sleep(0.1)

    def annotate_task(self, name: str, key: str, value: str) -> None:
        self.custom.patch_namespaced_custom_object(
            GROUP,
            VERSION,
            self.namespace,
            "agenttasks",
            name,
            {"metadata": {"annotations": {key: value}}},
        )

    def kubectl(self, *args: str) -> str:
        done = subprocess.run(
            [self.kubectl_path, "-n", self.namespace, *args],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            env={**os.environ, "KUBECONFIG": self.kubeconfig},
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    # -- waiting -------------------------------------------------------------------------

    def wait_task(
        self,
        name: str,
        predicate: Callable[[dict[str, Any]], bool],
        *,
        timeout: float = 30,
        what: str = "condition",
    ) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        body = self.task(name)
        while not predicate(body):
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"task {name}: {what} not reached in {timeout}s; status={body.get('status')}\n"
                    f"{self.logs()}"
                )
            time.sleep(0.1)
            body = self.task(name)
        return body

    def wait_phase(self, name: str, *phases: str, timeout: float = 30) -> dict[str, Any]:
        return self.wait_task(
            name,
            lambda b: (b.get("status") or {}).get("phase") in phases,
            timeout=timeout,
            what=f"phase in {phases}",
        )

    def wait_all(
        self, predicate: Callable[[list[dict[str, Any]]], bool], *, timeout: float = 60
    ) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        items = self.tasks()
        while not predicate(items):
            if time.monotonic() > deadline:
                phases = [
                    (t["metadata"]["name"], (t.get("status") or {}).get("phase")) for t in items
                ]
                raise AssertionError(f"not reached in {timeout}s: {phases[:50]}\n{self.logs()}")
            time.sleep(0.2)
            items = self.tasks()
        return items

    # -- processes -----------------------------------------------------------------------

    def _env(self) -> dict[str, str]:
        return {**os.environ, "KUBECONFIG": self.kubeconfig, "PYTHONUNBUFFERED": "1"}

    def agent(self, worker: str, behaviour: str = "complete", **options: float) -> Process:
        args = scripted_agent.command(
            kubeconfig=self.kubeconfig,
            namespace=self.namespace,
            worker=worker,
            behaviour=behaviour,
            **options,
        )
        proc = Process(
            args, self.workdir / f"agent-{worker}-{len(self.processes)}.log", self._env()
        )
        self.processes.append(proc)
        return proc

    def operator(
        self, *flags: str, prefix: tuple[str, ...] = (), env: dict[str, str] | None = None
    ) -> Process:
        args = [
            *prefix,
            AGENTQ,
            "operator",
            "--namespace",
            self.namespace,
            "--metrics-port",
            "0",
            "--reconcile-interval",
            "0.5",
            "--leader-namespace",
            self.namespace,
            *flags,
        ]
        proc = Process(
            args,
            self.workdir / f"operator-{len(self.processes)}.log",
            {**self._env(), **(env or {})},
        )
        self.processes.append(proc)
        return proc

    def logs(self, tail: int = 40) -> str:
        out = []
        for proc in self.processes:
            if "operator" in proc.args:
                lines = proc.text().splitlines()[-tail:]
                out.append(f"--- {proc.log.name} (pid {proc.pid})\n" + "\n".join(lines))
        return "\n".join(out)

    def close(self) -> None:
        for proc in reversed(self.processes):
            proc.stop()
        self.api.close()
