"""A fleet on the real control plane: AgentWorkers, AgentTasks, agents (each a
sidecar + agent-sim pair of processes, like the two containers of an agent pod)
and operator processes, created and read back through the API server.

Every process started here is a real process, stopped by its pid at teardown.
"""

from __future__ import annotations

import contextlib
import json
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

from agentq import GROUP, VERSION, agentsim, protocol
from agentq.agent import SidecarClient
from agentq.controlplane.cluster import free_port
from builders import TaskBuilder, WorkerBuilder

AGENTQ = str(Path(sys.executable).with_name("agentq"))


@dataclass
class ControlPlane:
    """A running API server and the tools to talk to it."""

    kubeconfig: str
    bin_dir: str
    server: str
    kubectl_path: str
    # The embedded cluster's handle (None for an external cluster): fault tests restart
    # its API server with ``cluster.restart("kube-apiserver")``.
    cluster: Any = None

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


CRD_DIR = Path(__file__).resolve().parents[1] / "crds"


def install_crds(plane: ControlPlane) -> None:
    """The agentq CRDs, installed and Established."""
    plane.kubectl("apply", "-f", str(CRD_DIR))
    plane.kubectl(
        "wait",
        "--for=condition=Established",
        "--timeout=60s",
        "crd/agenttasks.agentq.dev",
        "crd/agentworkers.agentq.dev",
        "crd/agentqueues.agentq.dev",
        "crd/agentbudgets.agentq.dev",
    )


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

    def events(self) -> list[dict[str, Any]]:
        """The JSON lines of its output (agent-sim's events, the sidecar's start line)."""
        out = []
        for line in self.text().splitlines():
            if line.startswith("{"):
                with contextlib.suppress(ValueError):
                    out.append(json.loads(line))
        return out


# Options of Fleet.agent that belong to the sidecar; the rest go to agent-sim.
SIDECAR_OPTIONS = {"worker_lease_seconds", "shutdown_seconds", "capabilities", "weight"}
SIDECAR_OPTIONS |= {"max_in_flight", "log_level", "operator_url", "operator_token_file"}
SIDECAR_OPTIONS |= {"operator_ca_file", "operator_server_name", "owner_pod_uid"}


@dataclass
class AgentPair:
    """One agent pod as two processes: ``sidecar`` (agentq sidecar) and ``agent``
    (agentq agent-sim), talking over ``url``. Signals go to both, as to a whole pod;
    use ``.sidecar`` or ``.agent`` to hit one."""

    worker: str
    url: str
    sidecar: Process
    agent: Process
    token_file: Path

    def client(self, **options: Any) -> SidecarClient:
        """A client of this pod's agent API, with its secret (as the agent container)."""
        return SidecarClient(self.url, token_file=self.token_file, **options)

    def secret(self) -> str:
        return self.token_file.read_text().strip()

    @property
    def metrics_url(self) -> str:
        """The sidecar's metrics and health port (from its serving line)."""
        self.wait_serving()
        for event in self.sidecar.events():
            if event.get("event") == "serving":
                return str(event["metricsUrl"])
        raise AssertionError("unreachable")

    @property
    def pid(self) -> int:
        return self.agent.pid

    def signal(self, sig: signal.Signals) -> None:
        self.agent.signal(sig)
        self.sidecar.signal(sig)

    def kill(self) -> None:
        """SIGKILL both, as a node failure or an OOM kill of the pod would."""
        self.agent.kill()
        self.sidecar.kill()

    def stop(self) -> None:
        self.agent.stop()
        self.sidecar.stop()

    def wait_serving(self, timeout: float = 30) -> None:
        """Until the sidecar printed its serving line."""
        deadline = time.monotonic() + timeout
        while not any(e.get("event") == "serving" for e in self.sidecar.events()):
            if self.sidecar.popen.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(
                    f"sidecar of {self.worker} not serving:\n{self.sidecar.text()}"
                )
            time.sleep(0.05)


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
        self.pairs: list[AgentPair] = []

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

    def largest_creatable(self, body: Callable[[int], dict[str, Any]], lo: int, hi: int) -> int:
        """The largest ``n`` whose AgentTask ``body(n)`` the API server creates (etcd's
        request limit decides), found by creating and deleting it: ``body(lo)`` must fit,
        ``body(hi)`` not. Probe under a name of the length of the task to be made (etcd
        counts the key), not its name: the probes' events are not the task's."""
        while hi - lo > 1:
            mid = (lo + hi) // 2
            try:
                made = self.custom.create_namespaced_custom_object(
                    GROUP, VERSION, self.namespace, "agenttasks", body(mid)
                )
            except ApiException as err:
                assert "too large" in str(err.body), err.body
                hi = mid
                continue
            self.custom.delete_namespaced_custom_object(
                GROUP, VERSION, self.namespace, "agenttasks", made["metadata"]["name"]
            )
            lo = mid
        return lo

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

    def leader(self) -> str:
        """The holder of the operator's election Lease ("" while there is none)."""
        try:
            lease = self.leases.read_namespaced_lease("agentq-operator", self.namespace)
        except ApiException as err:
            if err.status == 404:
                return ""
            raise
        return str(lease.spec.holder_identity or "")

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

    def kubectl(self, *args: str, input: str | None = None) -> str:
        done = subprocess.run(
            [self.kubectl_path, "-n", self.namespace, *args],
            input=input,
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

    def wait_condition(
        self, name: str, type: str, *, status: str = "True", timeout: float = 30
    ) -> dict[str, Any]:
        """Until the task has a condition of this ``type`` with this ``status``."""
        return self.wait_task(
            name,
            lambda b: any(
                c["type"] == type and c["status"] == status
                for c in (b.get("status") or {}).get("conditions") or []
            ),
            timeout=timeout,
            what=type,
        )

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

    def agent(
        self,
        worker: str,
        behaviour: str = "complete",
        *,
        sink: str | None = None,
        identity: str | None = None,
        kubeconfig: str | None = None,
        program: Callable[[str, Path], list[str]] | None = None,
        **options: Any,
    ) -> AgentPair:
        """Start an agent for ``worker``: a sidecar and an agent-sim behaving as told.

        Options named in ``SIDECAR_OPTIONS`` go to the sidecar (default
        ``worker_lease_seconds=4``), the others to agent-sim (``work_seconds``,
        ``beat_seconds``). ``kubeconfig`` gives the sidecar other credentials than the
        fleet's (admin) ones. The sidecar's identity (its "pod name") defaults to
        ``<worker>-pod``, so a pair started again for the same worker is the same
        pod restarted. ``program(url, token_file)`` gives the argv of another agent than
        agent-sim (the example agents in Go and TypeScript, ``tests/polyglot.py``).
        """
        sidecar_flags = {"worker_lease_seconds": 4}
        agent_flags = {}
        for key, value in options.items():
            (sidecar_flags if key in SIDECAR_OPTIONS else agent_flags)[key] = value
        port = free_port()
        n = len(self.processes)
        # Per worker, as the volume the pod's two containers share: a pair started again
        # (the pod's sidecar restarted) replaces the secret.
        token_file = self.workdir / f"sidecar-token-{worker}"
        sidecar_argv, agent_argv = agentsim.pair_commands(
            worker=worker,
            namespace=self.namespace,
            port=port,
            token_file=str(token_file),
            behaviour=behaviour,
            kubeconfig=kubeconfig or self.kubeconfig,
            identity=identity or f"{worker}-pod",
            sink=sink,
            sidecar_flags=sidecar_flags,
            agent_flags=agent_flags,
        )
        if program is not None:
            agent_argv = program(f"http://127.0.0.1:{port}", token_file)
        sidecar = Process(sidecar_argv, self.workdir / f"sidecar-{worker}-{n}.log", self._env())
        self.processes.append(sidecar)
        agent = Process(agent_argv, self.workdir / f"agent-{worker}-{n}.log", self._env())
        self.processes.append(agent)
        pair = AgentPair(
            worker=worker,
            url=f"http://127.0.0.1:{port}",
            sidecar=sidecar,
            agent=agent,
            token_file=token_file,
        )
        self.pairs.append(pair)
        return pair

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
        # AGENTQ_TEST_WATCHER=kopf runs the operators of a test run with kopf's watches
        # (the default is the informer): the liveness tests hold both modes to one standard.
        watcher = os.environ.get("AGENTQ_TEST_WATCHER")
        if watcher and "--watcher" not in flags:
            args += ["--watcher", watcher]
        # Worker status counts are a snapshot written at most every WORKER_STATUS_INTERVAL
        # (30 s by default, from the leader's start): tests that read them wait 2 s.
        extra = {"AGENTQ_WORKER_STATUS_INTERVAL": "2", **(env or {})}
        # AGENTQ_TEST_OPERATOR_SRC=DIR runs the operator from another source tree (its
        # operator/ directory), e.g. `git archive main`: to see a test fail before a fix.
        src = os.environ.get("AGENTQ_TEST_OPERATOR_SRC")
        if src:
            extra["PYTHONPATH"] = str(Path(src) / "operator")
            # Trees before the AGENTQ_ prefix read the settings without it.
            for name, value in list(extra.items()):
                if name.startswith("AGENTQ_"):
                    extra[name.removeprefix("AGENTQ_")] = value
            at = args.index(AGENTQ)
            args = [*args[:at], sys.executable, "-m", "agentq.cli", *args[at + 1 :]]
        proc = Process(
            args,
            self.workdir / f"operator-{len(self.processes)}.log",
            {**self._env(), **extra},
        )
        self.processes.append(proc)
        self._wait_started(proc)
        return proc

    @staticmethod
    def _wait_started(proc: Process, timeout: float = 120) -> None:
        """Until the operator logged its start (its imports done, its watches starting),
        or exited. A test's deadlines then measure the operator, not how long a starved
        machine takes to start a Python process (10 s in a parallel run on 2 busy cores,
        a test's whole budget for a lease to expire)."""
        deadline = time.monotonic() + timeout
        while "started" not in proc.text():
            if proc.popen.poll() is not None:
                return  # exited: the test reads why
            if time.monotonic() > deadline:
                raise AssertionError(f"operator not started in {timeout}s:\n{proc.text()}")
            time.sleep(0.05)

    def logs(self, tail: int = 40) -> str:
        out = []
        for proc in self.processes:
            lines = proc.text().splitlines()[-(tail if "operator" in proc.args else 12) :]
            out.append(f"--- {proc.log.name} (pid {proc.pid})\n" + "\n".join(lines))
        return "\n".join(out)

    def close(self) -> None:
        for proc in reversed(self.processes):
            proc.stop()
        self.api.close()
