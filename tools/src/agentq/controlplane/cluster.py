"""Starts, checks and stops the embedded control plane's processes.

One cluster per state directory (default ``$AGENTQ_STATE_DIR`` or
``~/.local/state/agentq/cluster``): its certificates, kubeconfig, etcd data,
logs and ``state.json`` with the pids it started. Everything listens on
127.0.0.1 only, on free ports. ``down`` stops exactly the pids recorded in
``state.json`` (after checking each still runs the binary we started, so a
recycled pid is never signalled) and removes the directory.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from agentq.controlplane import binaries, host, node, pki, procs
from agentq.controlplane.procs import free_port, pid_runs
from agentq.controlplane.versions import KUBERNETES_VERSION

# Order matters: each depends on the one before; ``down`` stops them in reverse.
COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager")
SERVICE_CIDR = "10.0.0.0/24"

__all__ = ["Cluster", "ClusterError", "ClusterState", "free_port", "pid_runs"]


class ClusterError(RuntimeError):
    """The control plane could not be started, checked or stopped; says why."""


@dataclass
class ClusterState:
    """What ``up`` recorded, persisted as ``state.json`` in the state directory."""

    state_dir: str
    kubeconfig: str
    server: str
    etcd_url: str
    bin_dir: str
    binaries: dict[str, str]
    pids: dict[str, int] = field(default_factory=dict)
    started_at: float = 0.0
    # The local node's details (``node.NodeState`` as a dict) when started with --node.
    node: dict[str, Any] | None = None


def default_state_dir() -> Path:
    explicit = os.environ.get("AGENTQ_STATE_DIR")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_STATE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".local" / "state") / "agentq" / "cluster"


def ensure_port_free(port: int) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError as err:
            raise ClusterError(f"port {port} on 127.0.0.1 is in use ({err.strerror})") from err


class Cluster:
    """The embedded control plane whose state lives in ``state_dir``."""

    def __init__(self, state_dir: Path | None = None) -> None:
        self.state_dir = Path(state_dir) if state_dir else default_state_dir()
        self.state_file = self.state_dir / "state.json"
        self.log_dir = self.state_dir / "logs"
        # Popen handles of the processes this object started: kept so they can be
        # reaped on ``down`` (a dropped handle of a live child warns at collection).
        self._children: dict[int, subprocess.Popen[bytes]] = {}
        # How each component was started (for ``restart``) and whether it dies with us.
        self._started: dict[str, tuple[list[str], bool, pki.Pki]] = {}
        self._apiserver_flags: tuple[str, ...] = ()  # ``up``'s, for kube-apiserver

    # -- reading state ---------------------------------------------------------------

    def load(self) -> ClusterState | None:
        try:
            return ClusterState(**json.loads(self.state_file.read_text()))
        except FileNotFoundError:
            return None
        except (ValueError, TypeError) as err:
            raise ClusterError(
                f"{self.state_file} is unreadable ({err}); remove {self.state_dir}"
            ) from err

    def running(self, state: ClusterState) -> dict[str, bool]:
        """For each component recorded in ``state``: is its process still running?"""
        return {name: pid_runs(pid, state.binaries[name]) for name, pid in state.pids.items()}

    # -- up --------------------------------------------------------------------------

    def up(
        self,
        *,
        port: int | None = None,
        build: bool = True,
        timeout: float = 180.0,
        tie_to_parent: bool = False,
        with_node: bool = False,
        apiserver_flags: Sequence[str] = (),
        say: Callable[[str], None] = lambda _: None,
    ) -> ClusterState:
        """Start etcd, kube-apiserver and kube-controller-manager; return when ready.

        Ready means ``/readyz`` is ok, the ``default`` namespace exists and the
        controller manager has created its ``default`` service account. With
        ``tie_to_parent`` the processes die with the calling process. With
        ``with_node`` a local node (``node.LocalNode``) joins and is Ready too.
        ``apiserver_flags`` go to kube-apiserver after the defaults (a later flag wins:
        ``--event-ttl=5m``, say).
        """
        if with_node:
            try:
                node.check_host()
            except node.NodeError as err:
                raise ClusterError(str(err)) from err
        existing = self.load()
        if existing is not None:
            alive = self.running(existing)
            if any(alive.values()):
                raise ClusterError(
                    f"a cluster is already running from {self.state_dir} "
                    f"(server {existing.server}, pids {existing.pids}); "
                    "use it, or 'agentq cluster down' first"
                )
            # Left over from a crash: nothing of it runs. Undo its node's host changes.
            say(f"cleaning up after a cluster that was not stopped ({self.state_dir})")
            self._stop(existing, say=say)
            self._remove_state()
        if port is not None:
            ensure_port_free(port)
        self._apiserver_flags = tuple(apiserver_flags)
        paths = binaries.resolve(build=build, say=say)
        if not with_node:
            return self._up_retrying(paths, port, timeout, tie_to_parent, False, say)
        paths |= binaries.resolve(build=build, say=say, binary_set=binaries.NODE)
        journal = host.Journal("node")
        with journal.locked():  # one node per machine: no second up or down meanwhile
            try:
                node.LocalNode(self.state_dir, journal=journal).clean_up_leftovers(say)
            except (node.NodeError, host.HostError) as err:
                raise ClusterError(str(err)) from err
            return self._up_retrying(paths, port, timeout, tie_to_parent, True, say)

    def _up_retrying(
        self,
        paths: dict[str, Path],
        port: int | None,
        timeout: float,
        tie_to_parent: bool,
        with_node: bool,
        say: Callable[[str], None],
    ) -> ClusterState:
        for attempt in range(3):
            try:
                return self._up_once(paths, port, timeout, tie_to_parent, with_node, say)
            except ClusterError as err:
                # Another process took a port between our check and the server's bind.
                if "address already in use" not in str(err) or port is not None or attempt == 2:
                    raise
                say("a port was taken while starting; retrying on other ports")
                self._remove_state()
        raise AssertionError("unreachable")

    def _up_once(
        self,
        paths: dict[str, Path],
        port: int | None,
        timeout: float,
        tie_to_parent: bool,
        with_node: bool,
        say: Callable[[str], None],
    ) -> ClusterState:
        """One start of the three processes on fresh ports; stops them all on failure."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(exist_ok=True)
        certs = pki.generate(self.state_dir / "pki")
        node_certs: pki.NodePki | None = None
        if with_node:
            try:
                name, ip = node.node_name(), node.node_ip()
            except (node.NodeError, host.HostError) as err:
                raise ClusterError(str(err)) from err
            node_certs = pki.generate_node(
                self.state_dir / "pki" / "node", certs, node_name=name, node_ips=(ip,)
            )
        api_port = port or free_port()
        etcd_client, etcd_peer = free_port(), free_port()
        server = f"https://127.0.0.1:{api_port}"
        state = ClusterState(
            state_dir=str(self.state_dir),
            kubeconfig=str(self.state_dir / "kubeconfig"),
            server=server,
            etcd_url=f"http://127.0.0.1:{etcd_client}",
            bin_dir=str(paths["kubectl"].parent),
            binaries={name: str(path) for name, path in paths.items()},
            started_at=time.time(),
        )
        pki.write_kubeconfig(Path(state.kubeconfig), server=server, pki=certs)
        args = {
            "etcd": self._etcd_args(etcd_client, etcd_peer),
            "kube-apiserver": [
                *self._apiserver_args(api_port, state.etcd_url, certs),
                *self._apiserver_flags,
            ]
            + (self._kubelet_client_args(certs, node_certs) if node_certs else []),
            "kube-controller-manager": self._kcm_args(state.kubeconfig, certs),
        }
        deadline = time.monotonic() + timeout
        try:
            for name in COMPONENTS:
                say(f"starting {name}")
                self._started[name] = (args[name], tie_to_parent, certs)
                proc = self._start(name, state.binaries[name], args[name], tie_to_parent)
                self._children[proc.pid] = proc
                state.pids[name] = proc.pid
                self._save(state)
                self._wait_ready(name, proc, state, certs, deadline)
            say(f"control plane {KUBERNETES_VERSION} ready at {server}")
            if node_certs is not None:
                self._start_node(state, api_port, certs, node_certs, tie_to_parent, deadline, say)
        except BaseException:
            self._stop(state, say=say)
            raise
        return state

    def _start_node(
        self,
        state: ClusterState,
        api_port: int,
        certs: pki.Pki,
        node_certs: pki.NodePki,
        tie_to_parent: bool,
        deadline: float,
        say: Callable[[str], None],
    ) -> None:
        def on_process(name: str, proc: subprocess.Popen[bytes], executable: str) -> None:
            self._children[proc.pid] = proc
            state.pids[name] = proc.pid
            state.binaries[name] = executable
            self._save(state)

        local = node.LocalNode(self.state_dir)
        # Recorded before anything starts, so a failure part-way is undone by _stop.
        state.node = {"journal": str(local.journal.path)}
        self._save(state)
        try:
            started = local.start(
                server=state.server,
                api_port=api_port,
                certs=certs,
                node_certs=node_certs,
                name=node.node_name(),
                ip=node.node_ip(),
                binaries={k: Path(v) for k, v in state.binaries.items()},
                tie_to_parent=tie_to_parent,
                deadline=deadline,
                on_process=on_process,
                say=say,
            )
        except (node.NodeError, host.HostError) as err:
            raise ClusterError(str(err)) from err
        state.node = node.state_to_dict(started)
        self._save(state)
        say(f"node {started.name} ({started.ip}) Ready")

    @staticmethod
    def _kubelet_client_args(certs: pki.Pki, node_certs: pki.NodePki) -> list[str]:
        """API server flags for a local node: verify the kubelet, present a client cert."""
        return [
            f"--kubelet-client-certificate={node_certs.apiserver_kubelet_client_cert}",
            f"--kubelet-client-key={node_certs.apiserver_kubelet_client_key}",
            f"--kubelet-certificate-authority={certs.ca_cert}",
            # The kubelet serves on the node's address; its hostname may resolve to loopback.
            "--kubelet-preferred-address-types=InternalIP,Hostname",
            "--enable-admission-plugins=NodeRestriction",
        ]

    @staticmethod
    def _etcd_args(client: int, peer: int) -> list[str]:
        return [
            "--name=default",
            "--data-dir=etcd",
            f"--listen-client-urls=http://127.0.0.1:{client}",
            f"--advertise-client-urls=http://127.0.0.1:{client}",
            f"--listen-peer-urls=http://127.0.0.1:{peer}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
            f"--initial-cluster=default=http://127.0.0.1:{peer}",
            "--log-level=warn",
            # A throwaway local cluster: durability across power loss buys nothing,
            # and fsync dominates latency on shared disks.
            "--unsafe-no-fsync=true",
        ]

    @staticmethod
    def _apiserver_args(port: int, etcd_url: str, certs: pki.Pki) -> list[str]:
        return [
            f"--etcd-servers={etcd_url}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={port}",
            f"--cert-dir={certs.ca_cert.parent}",
            f"--tls-cert-file={certs.serving_cert}",
            f"--tls-private-key-file={certs.serving_key}",
            f"--client-ca-file={certs.ca_cert}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={certs.sa_pub}",
            f"--service-account-signing-key-file={certs.sa_key}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            # Node: each kubelet may read and write only what its own pods need.
            "--authorization-mode=Node,RBAC",
            "--allow-privileged=true",
            # No kube-proxy or nodes consume the kubernetes endpoints here.
            "--endpoint-reconciler-type=none",
            "--profiling=false",
            *Cluster._aggregation_args(certs),
        ]

    @staticmethod
    def _aggregation_args(certs: pki.Pki) -> list[str]:
        """The aggregation layer, so an APIService (KEDA's external metrics adapter,
        docs/autoscaling.md) can serve an API: the API server proxies to its endpoints
        (no kube-proxy here) with the front-proxy client certificate."""
        if certs.front_proxy_ca_cert is None:
            return []
        return [
            f"--requestheader-client-ca-file={certs.front_proxy_ca_cert}",
            f"--requestheader-allowed-names={pki.FRONT_PROXY_CLIENT}",
            "--requestheader-username-headers=X-Remote-User",
            "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            f"--proxy-client-cert-file={certs.front_proxy_client_cert}",
            f"--proxy-client-key-file={certs.front_proxy_client_key}",
            "--enable-aggregator-routing=true",
        ]

    def _kcm_args(self, kubeconfig: str, certs: pki.Pki) -> list[str]:
        return [
            f"--kubeconfig={kubeconfig}",
            "--bind-address=127.0.0.1",
            f"--secure-port={free_port()}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            "--leader-elect=false",
            f"--service-account-private-key-file={certs.sa_key}",
            f"--root-ca-file={certs.ca_cert}",
            f"--cluster-signing-cert-file={certs.ca_cert}",
            f"--cluster-signing-key-file={certs.ca_key}",
            f"--cert-dir={self.state_dir / 'kcm-certs'}",
            "--profiling=false",
        ]

    def _start(
        self, name: str, binary: str, args: list[str], tie_to_parent: bool
    ) -> subprocess.Popen[bytes]:
        try:
            return procs.start(
                name,
                binary,
                args,
                cwd=self.state_dir,
                log=self.log_dir / f"{name}.log",
                tie_to_parent=tie_to_parent,
            )
        except procs.ProcessError as err:
            raise ClusterError(str(err)) from err

    def _wait_ready(
        self,
        name: str,
        proc: subprocess.Popen[bytes],
        state: ClusterState,
        certs: pki.Pki,
        deadline: float,
    ) -> None:
        # One TLS context (CA + admin client certificate) for every poll of this wait.
        tls = ssl.create_default_context(cafile=str(certs.ca_cert))
        tls.load_cert_chain(str(certs.admin_cert), str(certs.admin_key))
        checks: dict[str, Callable[[], bool]] = {
            "etcd": lambda: self._get(f"{state.etcd_url}/health", None).find(b'"true"') >= 0,
            "kube-apiserver": lambda: (
                self._get(f"{state.server}/readyz", tls) == b"ok"
                and bool(self._get(f"{state.server}/api/v1/namespaces/default", tls))
            ),
            "kube-controller-manager": lambda: bool(
                self._get(f"{state.server}/api/v1/namespaces/default/serviceaccounts/default", tls)
            ),
        }
        check = checks[name]
        log = self.log_dir / f"{name}.log"
        while True:
            if proc.poll() is not None:
                raise ClusterError(
                    f"{name} exited with code {proc.returncode} while starting; "
                    f"last lines of {log}:\n{procs.log_tail(log)}"
                )
            if check():
                return
            if time.monotonic() > deadline:
                raise ClusterError(
                    f"{name} was not ready in time; last lines of {log}:\n{procs.log_tail(log)}"
                )
            time.sleep(0.2)

    @staticmethod
    def _get(url: str, context: ssl.SSLContext | None) -> bytes:
        """GET ``url``; the body on 200, b'' on any error (the caller polls)."""
        try:
            with urllib.request.urlopen(url, timeout=2, context=context) as response:
                body: bytes = response.read()
                return body if response.status == 200 else b""
        except (OSError, urllib.error.URLError, ssl.SSLError):
            return b""

    def _save(self, state: ClusterState) -> None:
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(state), indent=2))
        tmp.replace(self.state_file)

    # -- restart (fault tests) -------------------------------------------------------

    def restart(
        self, name: str, *, down_seconds: float = 0.0, timeout: float = 60.0
    ) -> ClusterState:
        """Stop one component this object started (by its pid, SIGTERM then SIGKILL), wait
        ``down_seconds``, start it again with the same arguments and wait until it is ready.
        For fault tests: the API server restarting under a running operator."""
        state = self.load()
        if state is None or name not in self._started:
            raise ClusterError(f"{name} was not started by this Cluster object")
        args, tie_to_parent, certs = self._started[name]
        pid = state.pids[name]
        try:
            procs.stop(pid, state.binaries[name], name=name)
        except procs.ProcessError as err:
            raise ClusterError(str(err)) from err
        child = self._children.pop(pid, None)
        if child is not None:
            child.wait(timeout=5)
        time.sleep(down_seconds)
        proc = self._start(name, state.binaries[name], args, tie_to_parent)
        self._children[proc.pid] = proc
        state.pids[name] = proc.pid
        self._save(state)
        self._wait_ready(name, proc, state, certs, time.monotonic() + timeout)
        return state

    # -- down ------------------------------------------------------------------------

    def down(self, *, say: Callable[[str], None] = lambda _: None) -> bool:
        """Stop every process this cluster started and remove its state; False if none."""
        state = self.load()
        if state is None:
            if self.state_dir.exists():
                self._remove_state()
            return False
        self._stop(state, say=say)
        self._remove_state()
        return True

    def _stop(self, state: ClusterState, *, say: Callable[[str], None] = lambda _: None) -> None:
        if state.node is not None:
            journal = host.Journal("node")
            # Only this cluster's node: the journal is machine-wide.
            if journal.load() and journal.owner == str(self.state_dir.resolve()):
                try:
                    with journal.locked():
                        node.LocalNode(self.state_dir, journal=journal).stop(say)
                except host.HostError as err:
                    raise ClusterError(str(err)) from err
            for name in node.COMPONENTS:
                child = self._children.pop(state.pids.get(name, -1), None)
                if child is not None:
                    child.wait(timeout=5)
        for name in reversed(COMPONENTS):
            pid = state.pids.get(name)
            if pid is None or not pid_runs(pid, state.binaries[name]):
                continue
            say(f"stopping {name} (pid {pid})")
            try:
                procs.stop(pid, state.binaries[name], name=name)
            except procs.ProcessError as err:
                raise ClusterError(str(err)) from err
            child = self._children.pop(pid, None)
            if child is not None:
                child.wait(timeout=5)

    def _remove_state(self) -> None:
        # Never delete through a mount (a pod volume bound from the host, say).
        held = host.mounts_under(str(self.state_dir.resolve()))
        if held:
            raise ClusterError(
                f"not removing {self.state_dir}: still mounted below it: {', '.join(held)}"
            )
        shutil.rmtree(self.state_dir, ignore_errors=True)
