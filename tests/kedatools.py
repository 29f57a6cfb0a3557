"""KEDA (the build of ``make keda``) and a Prometheus as processes beside a cluster.

``Keda.start()`` installs KEDA's CRDs, runs ``keda-operator`` and ``keda-adapter`` with
the cluster's kubeconfig (the gRPC link between them over TLS with a CA made here), and
registers the adapter as the APIService ``v1beta1.external.metrics.k8s.io`` through a
Service without selector whose Endpoints are this host's address (the API server proxies
to endpoints itself: ``--enable-aggregator-routing``). ``stop()`` undoes all of it, the
APIService first (an unavailable one breaks API discovery for every client).

``Prometheus`` scrapes the given targets every second (Debian's ``prometheus``).
Processes are stopped by pid and die with the test process (PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import signal
import subprocess
import time
import urllib.parse
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import yaml

from agentq.controlplane import binaries
from agentq.controlplane.cluster import free_port
from fleet import ControlPlane

APISERVICE = "v1beta1.external.metrics.k8s.io"


def _die_with_parent() -> None:
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def host_address() -> str:
    """This host's first global IPv4 address: where the API server reaches the adapter
    (an Endpoints address may not be loopback)."""
    out = subprocess.run(
        ["ip", "-4", "-o", "addr", "show", "scope", "global"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    for line in out.splitlines():
        return line.split()[3].split("/")[0]
    raise AssertionError("no global IPv4 address on this host")


def _stop(popen: subprocess.Popen[bytes]) -> None:
    if popen.poll() is None:
        popen.send_signal(signal.SIGTERM)
        try:
            popen.wait(timeout=15)
        except subprocess.TimeoutExpired:
            popen.kill()
            popen.wait()


def _spawn(argv: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
        return subprocess.Popen(
            argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **env},
            preexec_fn=_die_with_parent,
        )


class Keda:
    def __init__(self, control_plane: ControlPlane, workdir: Path) -> None:
        found = binaries.resolve(build=False, binary_set=binaries.KEDA)
        self.operator_bin = found["keda-operator"]
        self.adapter_bin = found["keda-adapter"]
        self.crds = self.operator_bin.parent / "crd"
        self.cp = control_plane
        self.workdir = workdir
        # A namespace of its own: one of an earlier run may still be terminating.
        self.namespace = f"keda-{uuid.uuid4().hex[:8]}"
        self.processes: list[subprocess.Popen[bytes]] = []
        self.logs: list[Path] = []

    def _certs(self) -> Path:
        """ca.crt, tls.crt, tls.key: the operator's gRPC server and the adapter's client
        (and its serving certificate; the APIService skips verifying it)."""
        certs = self.workdir / "keda-certs"
        certs.mkdir(parents=True, exist_ok=True)

        def openssl(*args: str) -> None:
            subprocess.run(["openssl", *args], cwd=certs, capture_output=True, check=True)

        openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key",
                "-out", "ca.crt", "-days", "2", "-subj", "/CN=keda-test-ca")  # fmt: skip
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "tls.key", "-out",
                "tls.csr", "-subj", "/CN=keda-operator")  # fmt: skip
        (certs / "ext").write_text(
            "subjectAltName=DNS:keda-operator.keda.svc.cluster.local,DNS:localhost,"
            "IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n"
        )
        openssl("x509", "-req", "-in", "tls.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
                "-CAcreateserial", "-out", "tls.crt", "-days", "2", "-extfile", "ext")  # fmt: skip
        return certs

    def start(self, timeout: float = 120) -> None:
        kubeconfig = self.cp.kubeconfig
        wait_until_not_terminating(self.cp, "scaledobjects.keda.sh")
        self.cp.kubectl("apply", "--server-side", "-f", str(self.crds), timeout=120)
        self.cp.kubectl("create", "namespace", self.namespace)
        certs = self._certs()
        env = {"KEDA_CLUSTER_OBJECT_NAMESPACE": self.namespace, "POD_NAMESPACE": self.namespace,
               "WATCH_NAMESPACE": "", "KUBECONFIG": kubeconfig}  # fmt: skip
        grpc = free_port()
        operator = [
            str(self.operator_bin),
            f"--kubeconfig={kubeconfig}",
            f"--cert-dir={certs}",
            "--metrics-bind-address=127.0.0.1:0",
            "--health-probe-bind-address=127.0.0.1:0",
            f"--metrics-service-bind-address=127.0.0.1:{grpc}",
            "--enable-webhook-patching=false",
            "--enable-apiservice-patching=false",
        ]
        self._run(operator, "keda-operator.log", env)
        address, port = host_address(), free_port()
        adapter = [
            str(self.adapter_bin),
            f"--lister-kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            f"--bind-address={address}",
            f"--secure-port={port}",
            f"--cert-dir={certs}",
            f"--tls-cert-file={certs / 'tls.crt'}",
            f"--tls-private-key-file={certs / 'tls.key'}",
            f"--metrics-service-address=127.0.0.1:{grpc}",
            "--metrics-service-grpc-authority=keda-operator.keda.svc.cluster.local",
            f"--port={free_port()}",
        ]
        self._run(adapter, "keda-adapter.log", env)
        service = {"apiVersion": "v1", "kind": "List", "items": [
            {"apiVersion": "v1", "kind": "Service",
             "metadata": {"name": "keda-metrics-apiserver", "namespace": self.namespace},
             "spec": {"ports": [{"name": "https", "port": 443, "targetPort": port}]}},
            {"apiVersion": "v1", "kind": "Endpoints",
             "metadata": {"name": "keda-metrics-apiserver", "namespace": self.namespace},
             "subsets": [{"addresses": [{"ip": address}],
                          "ports": [{"name": "https", "port": port}]}]},
            {"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
             "metadata": {"name": APISERVICE},
             "spec": {"group": "external.metrics.k8s.io", "version": "v1beta1",
                      "groupPriorityMinimum": 100, "versionPriority": 100,
                      "insecureSkipTLSVerify": True,
                      "service": {"name": "keda-metrics-apiserver", "namespace": self.namespace,
                                  "port": 443}}},
        ]}  # fmt: skip
        self.cp.kubectl("apply", "-f", "-", input=json.dumps(service))
        deadline = time.monotonic() + timeout
        while True:
            got = self.cp.kubectl("get", "apiservice", APISERVICE, "-o", "json", check=False)
            status = json.loads(got.stdout or "{}").get("status") or {}
            if any(
                c["type"] == "Available" and c["status"] == "True"
                for c in status.get("conditions") or []
            ):
                return
            for popen, log in zip(self.processes, self.logs, strict=True):
                if popen.poll() is not None:
                    raise AssertionError(f"{log.name} exited: {log.read_text()[-3000:]}")
            if time.monotonic() > deadline:
                raise AssertionError(f"APIService not Available: {status}\n{self.tail()}")
            time.sleep(1)

    def _run(self, argv: list[str], log: str, env: dict[str, str]) -> None:
        path = self.workdir / log
        self.processes.append(_spawn(argv, path, env))
        self.logs.append(path)

    def tail(self, lines: int = 30) -> str:
        return "\n".join(
            f"--- {log.name}\n" + "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
            for log in self.logs
            if log.exists()
        )

    def stop(self) -> None:
        # KEDA removes its own finalizers from what it scales: those objects go while it
        # still runs, or the CRDs deleted below would stay terminating for good (and a
        # later test applying them again would find them refusing every object).
        for kind in KEDA_SCALERS:
            self.cp.kubectl("delete", kind, "--all", "-A", "--ignore-not-found",
                            "--timeout=60s", check=False, timeout=90)  # fmt: skip
            _strip_finalizers(self.cp, kind)  # what KEDA did not let go of in time
        self.cp.kubectl("delete", "apiservice", APISERVICE, "--ignore-not-found", check=False)
        for popen in reversed(self.processes):
            _stop(popen)
        self.cp.kubectl("delete", "namespace", self.namespace, "--ignore-not-found", "--wait=false",
                        check=False)  # fmt: skip
        self.cp.kubectl("delete", "-f", str(self.crds), "--ignore-not-found", "--wait=false",
                        check=False)  # fmt: skip


KEDA_SCALERS = ("scaledobjects.keda.sh", "scaledjobs.keda.sh")


def _strip_finalizers(control_plane: ControlPlane, kind: str) -> None:
    done = control_plane.kubectl("get", kind, "-A", "-o", "json", check=False)
    if done.returncode != 0:
        return
    for item in json.loads(done.stdout).get("items") or []:
        meta = item["metadata"]
        control_plane.kubectl("patch", kind, meta["name"], "-n", meta["namespace"],
                              "--type=merge", "-p", '{"metadata":{"finalizers":null}}',
                              check=False)  # fmt: skip


def wait_until_not_terminating(control_plane: ControlPlane, crd: str) -> None:
    """A CRD an earlier test deleted (without waiting) is gone before it is applied
    again: a terminating CRD takes the apply, then refuses its objects."""
    deadline = time.monotonic() + 120
    while True:
        done = control_plane.kubectl("get", f"crd/{crd}", "-o", "json", check=False)
        if done.returncode != 0 or not json.loads(done.stdout)["metadata"].get("deletionTimestamp"):
            return
        assert time.monotonic() < deadline, f"{crd} still terminating after 120 s"
        time.sleep(0.5)


class Prometheus:
    """A Prometheus process scraping ``targets`` every second, on a free port."""

    def __init__(self, workdir: Path, targets: list[str], port: int | None = None) -> None:
        tool = shutil.which("prometheus")
        if tool is None:
            raise AssertionError("prometheus is not installed: `make system-deps` installs it")
        self.port = port or free_port()
        config = {
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
            "scrape_configs": [{"job_name": "agentq", "static_configs": [{"targets": targets}]}],
        }
        path = workdir / "prometheus.yml"
        path.write_text(yaml.safe_dump(config))
        self.log = workdir / "prometheus.log"
        self.popen = _spawn(
            [tool, f"--config.file={path}", f"--storage.tsdb.path={workdir / 'prom-data'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
            self.log, {},
        )  # fmt: skip

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def query(self, expr: str) -> list[dict[str, Any]]:
        params = urllib.parse.urlencode({"query": expr})
        try:
            with urllib.request.urlopen(f"{self.url}/api/v1/query?{params}", timeout=5) as rsp:
                result: list[dict[str, Any]] = json.loads(rsp.read())["data"]["result"]
                return result
        except OSError:
            return []

    def stop(self) -> None:
        _stop(self.popen)
