"""Shared machinery of the bad-input corpus (tests/integration/test_bad_input_*.py).

- ``RawApi``: requests of arbitrary bytes to the API server (the kubernetes client
  cannot even serialize a 3,000-level object: its sanitizer recurses), with the
  kubeconfig's client certificate.
- ``deep(n)`` / ``deep_text(n)``: nested JSON built without recursion.
- ``Arena``: one namespace shared by a module's cases, with its own operator (it
  watches only that namespace, so a case that kills it harms no other module), a
  scripted ``good`` worker for canary tasks, and *puppet* workers whose sidecar the
  test plays itself (their worker Leases are renewed by a thread; what happens on
  their task Leases is up to the case). After every case: the operator still runs,
  and a canary task is dispatched and succeeds (``Arena.check``).
- ``Puppet``: the test as the holder of a claim: wait for a grant, renew, write any
  report or annotation, raw or through ``agentq.holder``.

Every case uses task names of its own and deletes them afterwards, so a wedged
task from one case cannot disturb the next.
"""

from __future__ import annotations

import contextlib
import http.client
import itertools
import json
import signal
import ssl
import sys
import threading
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config
from kubernetes.client.rest import ApiException

from agentq import GROUP, VERSION, protocol
from agentq.controlplane.cluster import free_port
from agentq.holder import renew_task_lease, renew_worker_lease
from builders import TaskBuilder, task, worker
from fleet import ControlPlane, Fleet, Process

TASKS = f"/apis/{GROUP}/{VERSION}/namespaces/{{ns}}/agenttasks"
WORKERS = f"/apis/{GROUP}/{VERSION}/namespaces/{{ns}}/agentworkers"
LEASES = "/apis/coordination.k8s.io/v1/namespaces/{ns}/leases"


# --- raw requests -------------------------------------------------------------------


class RawApi:
    """Arbitrary requests to the API server as the admin user of a kubeconfig."""

    def __init__(self, kubeconfig: str) -> None:
        api = config.new_client_from_config(config_file=kubeconfig)
        conf = api.configuration
        self.url = urllib.parse.urlparse(conf.host)
        self.tls = ssl.create_default_context(cafile=conf.ssl_ca_cert)
        self.tls.load_cert_chain(conf.cert_file, conf.key_file)
        api.close()

    def request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        *,
        content_type: str = "application/json",
        timeout: float = 60,
    ) -> tuple[int, Any]:
        """(status, body): the body as JSON when it decodes, else its first 2 KB as text."""
        conn = http.client.HTTPSConnection(
            self.url.hostname or "127.0.0.1", self.url.port, context=self.tls, timeout=timeout
        )
        try:
            headers = {"Content-Type": content_type} if body is not None else {}
            conn.request(method, path, body=body, headers=headers)
            response = conn.getresponse()
            data = response.read()
        finally:
            conn.close()
        try:
            return response.status, deep_loads(data)
        except ValueError:
            return response.status, data[:2048].decode(errors="replace")

    @staticmethod
    def message(body: Any) -> str:
        return str(body.get("message", body)) if isinstance(body, dict) else str(body)


def deep_loads(data: bytes | str) -> Any:
    """``json.loads`` of objects as deep as the API server stores (10,000 levels): the
    decoder recurses, so lift the interpreter's limit for this call only."""
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 25_000))
    try:
        return json.loads(data)
    finally:
        sys.setrecursionlimit(limit)


def deep(levels: int, leaf: Any = 1) -> dict[str, Any]:
    """``{"a": {"a": ... leaf}}`` nested ``levels`` deep, built without recursion."""
    root: dict[str, Any] = {}
    node = root
    for _ in range(levels - 1):
        node["a"] = {}
        node = node["a"]
    node["a"] = leaf
    return root


def deep_text(levels: int, leaf: str = "1") -> str:
    """The JSON text of ``deep(levels, leaf)`` (json.dumps would recurse)."""
    return '{"a":' * levels + leaf + "}" * levels


# --- the arena ----------------------------------------------------------------------


@dataclass
class Case:
    """One corpus case: an id, what it does and checks, and why it may fail today."""

    id: str
    run: Callable[..., None]
    needs: str | None = None  # "<branch>: <what>" when it depends on unlanded work


def cases_as_params(cases: list[Case]) -> list[Any]:
    """pytest params of ``cases``: a case that ``needs`` unlanded work is a strict xfail."""
    out = []
    for case in cases:
        marks = [pytest.mark.xfail(strict=True, reason=f"needs {case.needs}")] if case.needs else []
        out.append(pytest.param(case, id=case.id, marks=marks))
    return out


class Arena:
    """A namespace, its operator, a canary worker and puppet workers, for one module."""

    CANARY = "canary"

    def __init__(
        self,
        control_plane: ControlPlane,
        workdir: Path,
        *,
        puppets: tuple[str, ...] = ("pa", "pb"),
        operator_flags: tuple[str, ...] = (),
        operator_env: dict[str, str] | None = None,
    ) -> None:
        self.cp = control_plane
        self.namespace = f"bad-{uuid.uuid4().hex[:8]}"
        control_plane.kubectl("create", "namespace", self.namespace)
        self.fleet = Fleet(
            kubeconfig=control_plane.kubeconfig,
            namespace=self.namespace,
            workdir=workdir,
            kubectl=control_plane.kubectl_path,
        )
        self.raw = RawApi(control_plane.kubeconfig)
        self.custom = self.fleet.custom
        self.leases = self.fleet.leases
        self.metrics_port = free_port()
        self.operator_flags = operator_flags
        self.operator_env = operator_env
        self.operator: Process | None = None
        self._serial = itertools.count()
        self._case_names: list[str] = []
        self.fleet.add_worker(worker("good").capabilities(self.CANARY).max_in_flight(4))
        self.fleet.agent("good", "complete", work_seconds=0.1, beat_seconds=0.3)
        self.puppets: dict[str, Puppet] = {}
        for name in puppets:
            self.fleet.add_worker(worker(name).capabilities(name).max_in_flight(8))
            self.puppets[name] = Puppet(self, name)
        self._stop = threading.Event()
        self._keeper = threading.Thread(target=self._keep_puppets_ready, daemon=True)
        self._keeper.start()
        self.start_operator()
        self.check()

    # -- processes -----------------------------------------------------------------

    def start_operator(self) -> Process:
        self.operator = self.fleet.operator(
            "--metrics-port", str(self.metrics_port), *self.operator_flags, env=self.operator_env
        )
        return self.operator

    def operator_alive(self) -> bool:
        return self.operator is not None and self.operator.popen.poll() is None

    def close(self) -> None:
        self._stop.set()
        self._keeper.join(timeout=10)
        self.fleet.close()
        self.cp.kubectl("delete", "namespace", self.namespace, "--wait=false", check=False)

    def _keep_puppets_ready(self) -> None:
        while not self._stop.is_set():
            for name, puppet in self.puppets.items():
                if puppet.worker_lease_paused:
                    continue
                with contextlib.suppress(Exception):
                    renew_worker_lease(
                        self.leases,
                        self.namespace,
                        name,
                        identity=f"{name}-sidecar",
                        duration_seconds=4,
                    )
            self._stop.wait(1.0)

    # -- names and objects -----------------------------------------------------------

    def name(self, prefix: str) -> str:
        """A fresh object name; tasks (and task Leases) of that name go at ``end_case``."""
        name = f"{prefix}-{next(self._serial)}"
        self._case_names.append(name)
        return name

    def begin_case(self) -> None:
        """Before a case: the operator runs (a case that killed it has failed already)."""
        self._case_names = []
        if not self.operator_alive():
            self.start_operator()

    def end_case(self) -> None:
        """After a case, pass or fail: its tasks and Leases go, so a task it wedged cannot
        flood the log or slow the next case."""
        for name in self._case_names:
            self.delete_task(name)
            with contextlib.suppress(ApiException):
                self.leases.delete_namespaced_lease(protocol.task_lease_name(name), self.namespace)
        self._case_names = []

    def create_task(self, builder: TaskBuilder) -> dict[str, Any]:
        return self.fleet.add_task(builder)

    def task(self, name: str) -> dict[str, Any]:
        return self.fleet.task(name)

    def status(self, name: str) -> dict[str, Any]:
        return self.task(name).get("status") or {}

    def task_raw(self, name: str) -> dict[str, Any]:
        """The task read with RawApi (the kubernetes client cannot decode a deep payload)."""
        status, body = self.raw.request("GET", TASKS.format(ns=self.namespace) + f"/{name}")
        assert status == 200 and isinstance(body, dict), (status, str(body)[:300])
        return body

    def delete_task(self, name: str) -> None:
        with contextlib.suppress(ApiException):
            self.custom.delete_namespaced_custom_object(
                GROUP, VERSION, self.namespace, "agenttasks", name
            )

    def patch_status(self, name: str, status: dict[str, Any]) -> dict[str, Any]:
        """A hostile user with RBAC on the status subresource writes ``status``."""
        patched: dict[str, Any] = self.custom.patch_namespaced_custom_object_status(
            GROUP, VERSION, self.namespace, "agenttasks", name, {"status": status}
        )
        return patched

    # -- after each case -------------------------------------------------------------

    @contextlib.contextmanager
    def case(self) -> Iterator[None]:
        """Around one case: a running operator before, clean-up after, then ``check``."""
        self.begin_case()
        try:
            yield
        finally:
            self.end_case()
        self.check()

    def check(self, *, timeout: float = 60) -> None:
        """The operator still runs and still dispatches: a canary task succeeds."""
        assert self.operator_alive(), f"the operator exited:\n{self.fleet.logs()}"
        name = f"canary-{next(self._serial)}"
        self.create_task(task(name).requires(self.CANARY).lease(5))
        try:
            self.fleet.wait_phase(name, "Succeeded", timeout=timeout)
        finally:
            self.delete_task(name)
        assert self.operator_alive(), f"the operator exited:\n{self.fleet.logs()}"

    def log_mark(self) -> int:
        return len(self.operator.text().splitlines()) if self.operator else 0

    def log_since(self, mark: int) -> list[str]:
        return self.operator.text().splitlines()[mark:] if self.operator else []

    def errors_since(self, mark: int) -> list[str]:
        return [line for line in self.log_since(mark) if '"level": "ERROR"' in line]

    def metric(self, name: str, **labels: str) -> float:
        """A sample of the operator's /metrics (0 if absent)."""
        with urllib.request.urlopen(
            f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10
        ) as r:
            text = r.read().decode()
        total = 0.0
        for line in text.splitlines():
            if not line.startswith(name) or line.startswith("#"):
                continue
            head, _, value = line.rpartition(" ")
            series = head[len(name) :]
            if series and not series.startswith("{"):
                continue
            if all(f'{k}="{v}"' in series for k, v in labels.items()):
                total += float(value)
        return total

    def wait(
        self, what: str, predicate: Callable[[], bool], *, timeout: float = 30, every: float = 0.2
    ) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                raise AssertionError(f"not reached in {timeout}s: {what}\n{self.fleet.logs(60)}")
            time.sleep(every)

    def stays(self, what: str, predicate: Callable[[], bool], *, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            assert predicate(), f"no longer true: {what}"
            time.sleep(0.25)

    def reasons(self, name: str) -> list[str]:
        return self.fleet.reasons(name)

    def signal_operator(self, sig: signal.Signals) -> None:
        assert self.operator is not None
        self.operator.signal(sig)


def running(
    arena: Arena, prefix: str, puppet: str = "pa", lease: int = 3
) -> tuple[Puppet, str, int]:
    """A claim of ``puppet`` on a fresh task with a short ``lease``, started (Running)."""
    p = arena.puppets[puppet]
    name = p.submit(prefix, lease=lease)
    token = p.wait_grant(name)
    p.run(name, token)
    return p, name, token


class Puppet:
    """The test playing the sidecar of worker ``name``: it holds claims by hand."""

    def __init__(self, arena: Arena, name: str) -> None:
        self.arena = arena
        self.name = name
        self.worker_lease_paused = False

    @property
    def ns(self) -> str:
        return self.arena.namespace

    def submit(
        self,
        prefix: str,
        builder: Callable[[TaskBuilder], TaskBuilder] | None = None,
        *,
        lease: int = 3,
    ) -> str:
        """Create a task only this puppet can take; return its name."""
        name = self.arena.name(prefix)
        b = task(name).requires(self.name).lease(lease).backoff(initial=0.2, max=1)
        self.arena.create_task(builder(b) if builder else b)
        return name

    def wait_grant(self, name: str, *, after: int = 0, timeout: float = 30) -> int:
        """Wait until ``name`` is Assigned/Running to us with a token above ``after``, and
        its Lease carries that token; return the token."""
        found: dict[str, int] = {}

        def granted() -> bool:
            status = self.arena.status(name)
            token = status.get("fencingToken")
            if (
                status.get("phase") not in ("Assigned", "Running")
                or status.get("worker") != self.name
            ):
                return False
            if not isinstance(token, int) or token <= after:
                return False
            lease = self.arena.fleet.task_lease(name)
            if lease is None or protocol.lease_token(lease.metadata.annotations) != token:
                return False
            found["token"] = token
            return True

        self.arena.wait(f"{name} granted to {self.name}", granted, timeout=timeout)
        return found["token"]

    def lease(self, name: str) -> client.V1Lease:
        lease = self.arena.fleet.task_lease(name)
        assert lease is not None, f"{name} has no Lease"
        return lease

    def renew(self, name: str, token: int, *, progress: str | None = None) -> client.V1Lease:
        return renew_task_lease(
            self.arena.leases, self.ns, name, worker=self.name, token=token, progress=progress
        )

    def run(self, name: str, token: int) -> None:
        """Start the attempt (first renewal) and wait for Running, renewing meanwhile as a
        healthy holder does: on a loaded machine the operator may take longer than the
        short lease to say Running (a leadership hand-over, say), and a holder that beat
        once and then waited would rightly lose its claim. Renewals stop on return."""
        self.renew(name, token, progress="started")
        with self.renewing(name, token, progress=False):
            self.arena.fleet.wait_phase(name, "Running", timeout=20)

    @contextlib.contextmanager
    def renewing(
        self, name: str, token: int, every: float = 0.5, *, progress: bool = True
    ) -> Iterator[None]:
        """Keep renewing the claim in a thread (a healthy holder) while the block runs;
        with ``progress`` a new marker each time, else the annotation is left alone."""
        stop = threading.Event()

        def beat() -> None:
            step = 0
            while not stop.is_set():
                with contextlib.suppress(Exception):
                    self.renew(name, token, progress=f"step-{step}" if progress else None)
                step += 1
                stop.wait(every)

        thread = threading.Thread(target=beat, daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join(timeout=10)

    def patch_lease(self, name: str, patch: dict[str, Any]) -> client.V1Lease:
        """A raw merge patch of the task Lease (no ownership check: anyone with RBAC)."""
        patched: client.V1Lease = self.arena.leases.patch_namespaced_lease(
            protocol.task_lease_name(name), self.ns, patch
        )
        return patched

    def annotate(self, name: str, key: str, value: str | None) -> client.V1Lease:
        return self.patch_lease(name, {"metadata": {"annotations": {key: value}}})

    def raw_report(self, name: str, text: str) -> client.V1Lease:
        return self.annotate(name, protocol.ANNOTATION_REPORT, text)

    def report(
        self, name: str, token: int, *, outcome: str = "Succeeded", **fields: Any
    ) -> client.V1Lease:
        body = {"token": token, "worker": self.name, "outcome": outcome, **fields}
        return self.raw_report(name, json.dumps(body))

    def finish(self, name: str, *, timeout: float = 30) -> dict[str, Any]:
        """Succeed with whatever the current grant is, as a healthy holder would: renew,
        report, and if the attempt moves on meanwhile (reclaimed, repaired, re-granted),
        do it again with the new token; return the final status."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            token = self.wait_grant(name, timeout=max(1.0, left))
            with contextlib.suppress(Exception):  # the claim may move on under us
                self.renew(name, token)
                self.report(name, token, result={"by": self.name, "token": token})
            settle = time.monotonic() + 5
            while time.monotonic() < min(settle, deadline):
                status = self.arena.status(name)
                if status.get("phase") == "Succeeded":
                    return status
                if status.get("fencingToken") != token:
                    break
                time.sleep(0.2)
            if time.monotonic() >= deadline:
                raise AssertionError(
                    f"{name} did not succeed within {timeout}s: {self.arena.status(name)}\n"
                    f"{self.arena.fleet.logs(60)}"
                )
