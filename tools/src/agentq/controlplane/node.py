"""The local node of ``agentq cluster up --node``: containerd, kubelet, kube-scheduler.

It turns the embedded control plane into a one-node cluster that runs real pods
(the agentq image, the manifests, RBAC, the agents' sidecars), with no Docker
engine and no registry:

- containerd (the host's, Debian's package) with the CRI plugin, its own root,
  state, socket and runc root, ``restrict_oom_score_adj`` (the machine's
  bounding set lacks CAP_SYS_RESOURCE, so no negative oom_score_adj) and the
  pod sandbox image made here from the ``pause`` program;
- CNI bridge networking (the host's plugins) on bridge ``agentq0`` with the pod
  range ``10.244.0.0/24``; a DNAT rule maps the ``kubernetes`` Service address
  (``10.0.0.1:443``) to the API server's loopback port for traffic from the
  bridge (with ``route_localnet`` on the bridge), so in-cluster configuration
  works unchanged; forwarding between the bridge and other interfaces is
  dropped, so pods reach nothing off this machine;
- the kubelet (cgroupfs driver, pods under cgroup ``/agentq``), serving TLS with
  a certificate from the cluster CA, no anonymous access, webhook authn/authz;
  the API server reaches it with its own client certificate (logs, exec);
- kube-scheduler with its own identity.

Every host change is journaled by ``host.Journal`` and undone by ``stop``;
``check_host`` says clearly when the host cannot run a node.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

from agentq.controlplane import host, images, pki, procs

COMPONENTS = ("containerd", "kubelet", "kube-scheduler")
BRIDGE = "agentq0"
POD_CIDR = "10.244.0.0/24"
POD_GATEWAY = "10.244.0.1"
CGROUP_ROOT = "agentq"
PAUSE_IMAGE = "agentq.local/pause:1"
CNI_PLUGINS_DIRS = ("/usr/lib/cni", "/opt/cni/bin")
CNI_PLUGINS = ("bridge", "host-local", "loopback")
# The kubelet sets these at start (its "kernel tunables"); the CNI bridge plugin
# turns on IPv4 forwarding for a gateway bridge.
KUBELET_SYSCTLS = (
    "vm.overcommit_memory",
    "vm.panic_on_oom",
    "kernel.panic",
    "kernel.panic_on_oops",
    "kernel.keys.root_maxkeys",
    "kernel.keys.root_maxbytes",
)
CNI_SYSCTLS = ("net.ipv4.ip_forward",)
# Places containerd, the CNI plugins and the kubelet write to whatever they are
# configured with; removed at down if they did not exist before. "empty": shared
# with other containerd instances (dockerd's), removed only when empty.
HOST_PATHS: tuple[tuple[str, str], ...] = (
    ("/run/containerd", "empty"),
    ("/opt/containerd", "empty"),
    ("/var/lib/containerd", "empty"),
    ("/etc/containerd", "empty"),
    ("/var/lib/kubelet", "tree"),
    ("/var/log/pods", "tree"),
    ("/var/log/containers", "tree"),
    ("/var/lib/cni", "tree"),
    ("/etc/cni", "empty"),
    ("/opt/cni", "empty"),
    ("/run/netns", "empty"),
    ("/etc/kubernetes", "empty"),
)
DEBIAN_PACKAGES = "containerd runc containernetworking-plugins iptables nftables"

Say = Callable[[str], None]


class NodeError(RuntimeError):
    """The local node cannot start on this host, or failed to; says why and what to do."""


@dataclass
class NodeState:
    """What ``up --node`` recorded about the node (part of the cluster's state.json)."""

    name: str
    ip: str
    directory: str
    containerd_socket: str
    kubelet_port: int
    kubelet_healthz_port: int
    scheduler_port: int
    journal: str


# -- the host -----------------------------------------------------------------------------


def node_name() -> str:
    """The machine's hostname as a node name (the API server dials it by InternalIP)."""
    name = socket.gethostname().lower()
    if not re.fullmatch(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?", name):
        raise NodeError(f"the hostname {name!r} is not a valid Kubernetes node name")
    return name


def node_ip() -> str:
    """The IPv4 address of the interface that carries the default route.

    The kubelet refuses a loopback node address.
    """
    routes = json.loads(host.run(["ip", "-j", "-4", "route", "show", "default"]).stdout or "[]")
    devices = [r["dev"] for r in routes if "dev" in r] or ["eth0"]
    for device in devices:
        addrs = json.loads(host.run(["ip", "-j", "-4", "addr", "show", "dev", device]).stdout)
        for link in addrs:
            for info in link.get("addr_info", []):
                if info.get("family") == "inet" and not info["local"].startswith("127."):
                    return str(info["local"])
    raise NodeError("no IPv4 address on the default route's interface; the kubelet needs one")


def cni_plugins_dir() -> Path | None:
    for directory in CNI_PLUGINS_DIRS:
        if all((Path(directory) / plugin).is_file() for plugin in CNI_PLUGINS):
            return Path(directory)
    return None


def check_host() -> None:
    """Raise ``NodeError`` saying what this host lacks for a local node, if anything.

    The plain control plane (``agentq cluster up`` without ``--node``) needs none
    of it and keeps working.
    """
    if os.uname().sysname != "Linux":
        raise NodeError("a local node needs Linux (containerd, cgroups, network namespaces)")
    if os.geteuid() != 0:
        raise NodeError(
            "a local node needs root (it runs containerd and the kubelet, creates a bridge, "
            "iptables rules and cgroups); run as root, or use 'agentq cluster up' without "
            "--node for the control plane alone"
        )
    filesystems = Path("/proc/filesystems").read_text()
    if not re.search(r"\boverlay$", filesystems, re.M):
        raise NodeError(
            "the kernel has no overlayfs (not in /proc/filesystems), which containerd needs "
            "for container root filesystems; load it (modprobe overlay) or use a kernel with it"
        )
    if not host.cgroup_mounts():
        raise NodeError("no cgroup filesystem is mounted; the kubelet needs one")
    missing = [
        tool
        for tool in ("containerd", "containerd-shim-runc-v2", "ctr", "runc", "iptables", "ip")
        if shutil.which(tool) is None
    ]
    if cni_plugins_dir() is None:
        missing.append(f"CNI plugins ({', '.join(CNI_PLUGINS)} in {' or '.join(CNI_PLUGINS_DIRS)})")
    if missing:
        raise NodeError(
            f"missing on this host: {', '.join(missing)}; install them with 'make node-deps' "
            f"(Debian: apt-get install {DEBIAN_PACKAGES})"
        )


# -- configuration files (pure) ------------------------------------------------------------


def containerd_config(*, directory: Path, socket_path: Path, cni_bin: Path) -> str:
    """containerd's config: its own root, state, socket and runc root; the CRI plugin."""
    return f"""\
# Written by agentq cluster up --node; containerd for the local node only.
version = 2
root = "{directory / "root"}"
state = "{directory / "state"}"
oom_score = 0
disabled_plugins = [
  "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.zfs",
  "io.containerd.tracing.processor.v1.otlp",
  "io.containerd.internal.v1.tracing",
]

[grpc]
  address = "{socket_path}"

[ttrpc]
  address = "{socket_path}.ttrpc"

[debug]
  address = ""

[metrics]
  address = ""

[plugins."io.containerd.internal.v1.opt"]
  path = "{directory / "opt"}"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  # The bounding capability set may lack CAP_SYS_RESOURCE: never ask for a negative
  # oom_score_adj (containerd gives sandboxes -998 otherwise, and runc fails).
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  enable_selinux = false
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"

  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"

    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"

      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "{directory / "runc"}"

  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{cni_bin}"
    conf_dir = "{directory / "cni" / "net.d"}"
    max_conf_num = 1
"""


def cni_config(*, ipam_dir: Path) -> dict[str, Any]:
    """The pod network: one bridge, host-local addresses, a default route via the bridge."""
    return {
        "cniVersion": "1.0.0",
        "name": "agentq",
        "plugins": [
            {
                "type": "bridge",
                "bridge": BRIDGE,
                "isGateway": True,
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": POD_CIDR, "gateway": POD_GATEWAY}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "dataDir": str(ipam_dir),
                },
            }
        ],
    }


def kubelet_config(
    *,
    node: NodeState,
    ca_cert: Path,
    serving_cert: Path,
    serving_key: Path,
    pod_logs: Path,
) -> dict[str, Any]:
    """The kubelet's KubeletConfiguration for the local node."""
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": node.ip,
        "port": node.kubelet_port,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": node.kubelet_healthz_port,
        "tlsCertFile": str(serving_cert),
        "tlsPrivateKeyFile": str(serving_key),
        # Only callers with a certificate from the cluster CA or a valid token, each
        # authorized by the API server (SubjectAccessReview): no anonymous access.
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(ca_cert)},
        },
        "authorization": {"mode": "Webhook"},
        "containerRuntimeEndpoint": f"unix://{node.containerd_socket}",
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": f"/{CGROUP_ROOT}",
        # This machine kind has cgroup v1 (hybrid); the kubelet refuses it otherwise.
        "failCgroupV1": False,
        "failSwapOn": False,
        # No cluster DNS: pods get no resolver at all rather than the host's.
        "resolvConf": "",
        "podLogsDir": str(pod_logs),
        # A test node on a shared disk: never evict or garbage-collect images for disk.
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "evictionHard": {
            "memory.available": "100Mi",
            "nodefs.available": "1%",
            "nodefs.inodesFree": "1%",
            "imagefs.available": "1%",
        },
        "serializeImagePulls": False,
        "rotateCertificates": False,
        "serverTLSBootstrap": False,
        "registerNode": True,
        "shutdownGracePeriod": "0s",
        "shutdownGracePeriodCriticalPods": "0s",
    }


# -- the node -------------------------------------------------------------------------------


class LocalNode:
    """Starts and stops the node whose files live in ``<state_dir>/node``."""

    def __init__(self, state_dir: Path, *, journal: host.Journal | None = None) -> None:
        # Absolute: the machine-wide journal names its owner by this path.
        self.state_dir = state_dir.resolve()
        self.directory = self.state_dir / "node"
        self.log_dir = self.state_dir / "logs"
        self.journal = journal or host.Journal("node")

    # -- crash recovery --------------------------------------------------------------------

    def clean_up_leftovers(self, say: Say) -> None:
        """Undo what a node that was not stopped cleanly left on this host.

        Refuses (``NodeError``) while that node's processes still run.
        """
        if not self.journal.load():
            return
        alive = self.journal.processes_alive()
        if alive:
            raise NodeError(
                f"a local node is already running on this machine (state {self.journal.owner}: "
                f"{', '.join(alive)}); stop it with 'agentq cluster down --state-dir "
                f"{self.journal.owner}' first (one node per machine)"
            )
        say(f"cleaning up after a local node that was not stopped ({self.journal.owner})")
        self.journal.undo(say)

    # -- up --------------------------------------------------------------------------------

    def start(
        self,
        *,
        server: str,
        api_port: int,
        certs: pki.Pki,
        node_certs: pki.NodePki,
        name: str,
        ip: str,
        binaries: dict[str, Path],
        tie_to_parent: bool,
        deadline: float,
        on_process: Callable[[str, subprocess.Popen[bytes], str], None],
        say: Say,
    ) -> NodeState:
        """Start containerd, the kubelet and the scheduler; return when the node is Ready.

        ``on_process(name, popen, executable)`` is told of each process started, so the
        caller can record it. On failure the caller runs ``stop`` (the journal knows
        what to undo).
        """
        journal = self.journal
        journal.begin(str(self.state_dir))
        run_dir = journal.directory / "node"  # short paths for unix sockets
        journal.make_dir(run_dir)
        node = NodeState(
            name=name,
            ip=ip,
            directory=str(self.directory),
            containerd_socket=str(run_dir / "containerd.sock"),
            kubelet_port=procs.free_port(),
            kubelet_healthz_port=procs.free_port(),
            scheduler_port=procs.free_port(),
            journal=str(journal.path),
        )
        containerd_dir = self.directory / "containerd"
        for sub in ("root", "state", "opt", "runc", "cni/net.d", "cni/ipam"):
            (containerd_dir / sub).mkdir(parents=True, exist_ok=True)
        for sub in ("kubelet-pki", "pod-logs", "scheduler-certs", "images"):
            (self.directory / sub).mkdir(parents=True, exist_ok=True)
        # The kubelet binds unix sockets below its root directory (pod-resources/<n>,
        # plugin registration); a socket path may not exceed 107 bytes, which a state
        # directory under pytest's tmp_path easily does. So its root lives in the
        # short run directory (tmpfs; pod volumes are small), undone with it.
        kubelet_root = run_dir / "kubelet"
        kubelet_root.mkdir(parents=True, exist_ok=True)
        # Everything mounted below the node's directories (container root
        # filesystems, network namespaces, volumes) is unmounted at down.
        journal.watch_mounts(self.directory)
        journal.watch_mounts(run_dir)

        say(f"creating bridge {BRIDGE} ({POD_GATEWAY}/24) and the Service route to the API server")
        journal.watch_nft_tables()
        journal.cgroup(CGROUP_ROOT)
        journal.bridge(BRIDGE, f"{POD_GATEWAY}/24")
        journal.set_sysctl(f"net.ipv4.conf.{BRIDGE}.route_localnet", "1")
        journal.iptables_rule(
            "iptables",
            "nat",
            "PREROUTING",
            [
                *("-i", BRIDGE, "-d", f"{pki.SERVICE_IP}/32", "-p", "tcp", "--dport", "443"),
                *("-m", "comment", "--comment", "agentq node: kubernetes Service to the API"),
                *("-j", "DNAT", "--to-destination", f"127.0.0.1:{api_port}"),
            ],
        )
        for direction in (("-i", BRIDGE, "!", "-o", BRIDGE), ("-o", BRIDGE, "!", "-i", BRIDGE)):
            journal.iptables_rule(
                "iptables",
                "filter",
                "FORWARD",
                [
                    *direction,
                    *("-m", "comment", "--comment", "agentq node: pods stay on this machine"),
                    "-j",
                    "DROP",
                ],
            )
        for key in (*CNI_SYSCTLS, *KUBELET_SYSCTLS):
            journal.watch_sysctl(key)
        for path, mode in HOST_PATHS:
            journal.watch_path(path, mode=mode)
        journal.watch_iptables_chains()

        cni_bin = cni_plugins_dir()
        assert cni_bin is not None  # check_host said so
        config = self.directory / "containerd.toml"
        config.write_text(
            containerd_config(
                directory=containerd_dir, socket_path=Path(node.containerd_socket), cni_bin=cni_bin
            )
        )
        (containerd_dir / "cni" / "net.d" / "10-agentq.conflist").write_text(
            json.dumps(cni_config(ipam_dir=containerd_dir / "cni" / "ipam"), indent=2)
        )
        containerd = shutil.which("containerd") or "containerd"
        journal.shims(node.containerd_socket)
        say("starting containerd")
        proc = self._start("containerd", containerd, ["--config", str(config)], tie_to_parent)
        journal.process(
            "containerd",
            proc.pid,
            containerd,
            address=node.containerd_socket,
            before_stop="containerd",
        )
        on_process("containerd", proc, containerd)
        self._wait("containerd", proc, deadline, lambda: self._ctr_ok(node))

        pause_tar = self.directory / "images" / "pause.tar"
        images.single_binary_image(binaries["pause"], reference=PAUSE_IMAGE, dest=pause_tar)
        self.import_image(node, pause_tar)

        kubeconfig = self.directory / "kubelet.kubeconfig"
        pki.write_kubeconfig(
            kubeconfig,
            server=server,
            pki=certs,
            client=(node_certs.kubelet_client_cert, node_certs.kubelet_client_key),
        )
        kubelet_yaml = self.directory / "kubelet.yaml"
        kubelet_yaml.write_text(
            yaml.safe_dump(
                kubelet_config(
                    node=node,
                    ca_cert=certs.ca_cert,
                    serving_cert=node_certs.kubelet_serving_cert,
                    serving_key=node_certs.kubelet_serving_key,
                    pod_logs=self.directory / "pod-logs",
                )
            )
        )
        kubelet = str(binaries["kubelet"])
        say("starting kubelet")
        proc = self._start(
            "kubelet",
            kubelet,
            [
                f"--config={kubelet_yaml}",
                f"--kubeconfig={kubeconfig}",
                f"--root-dir={kubelet_root}",
                f"--cert-dir={self.directory / 'kubelet-pki'}",
                f"--hostname-override={name}",
                f"--node-ip={ip}",
                "--v=1",
            ],
            tie_to_parent,
        )
        journal.process("kubelet", proc.pid, kubelet, grace=15.0)
        on_process("kubelet", proc, kubelet)

        scheduler_kubeconfig = self.directory / "scheduler.kubeconfig"
        pki.write_kubeconfig(
            scheduler_kubeconfig,
            server=server,
            pki=certs,
            client=(node_certs.scheduler_cert, node_certs.scheduler_key),
        )
        scheduler = str(binaries["kube-scheduler"])
        say("starting kube-scheduler")
        proc_s = self._start(
            "kube-scheduler",
            scheduler,
            [
                f"--kubeconfig={scheduler_kubeconfig}",
                f"--authentication-kubeconfig={scheduler_kubeconfig}",
                f"--authorization-kubeconfig={scheduler_kubeconfig}",
                "--bind-address=127.0.0.1",
                f"--secure-port={node.scheduler_port}",
                f"--cert-dir={self.directory / 'scheduler-certs'}",
                "--leader-elect=false",
                "--profiling=false",
            ],
            tie_to_parent,
        )
        journal.process("kube-scheduler", proc_s.pid, scheduler)
        on_process("kube-scheduler", proc_s, scheduler)

        tls = ssl.create_default_context(cafile=str(certs.ca_cert))
        tls.load_cert_chain(str(certs.admin_cert), str(certs.admin_key))
        say(f"waiting for node {name} to be Ready")
        self._wait("kubelet", proc, deadline, lambda: self._node_ready(server, name, tls))
        insecure = ssl.create_default_context()
        insecure.check_hostname = False
        insecure.verify_mode = ssl.CERT_NONE  # its self-signed loopback serving certificate
        self._wait(
            "kube-scheduler",
            proc_s,
            deadline,
            lambda: _get(f"https://127.0.0.1:{node.scheduler_port}/healthz", insecure) == b"ok",
        )
        return node

    def import_image(self, node: NodeState, archive: Path) -> None:
        """Import a ``docker save`` archive into the node's containerd (for pods)."""
        done = host.run(
            [
                *("ctr", "--address", node.containerd_socket, "-n", "k8s.io"),
                *("images", "import", "--no-unpack", str(archive)),
            ],
            check=False,
            timeout=600,
        )
        if done.returncode != 0:
            raise NodeError(f"importing {archive} into containerd failed: {done.stderr.strip()}")

    # -- down ------------------------------------------------------------------------------

    def stop(self, say: Say) -> None:
        """Stop the node's processes and pods and undo every host change it made."""
        if self.journal.load():
            self.journal.undo(say)

    # -- helpers ---------------------------------------------------------------------------

    def _start(
        self, name: str, binary: str, args: list[str], tie_to_parent: bool
    ) -> subprocess.Popen[bytes]:
        try:
            return procs.start(
                name,
                binary,
                args,
                cwd=self.directory,
                log=self.log_dir / f"{name}.log",
                tie_to_parent=tie_to_parent,
            )
        except procs.ProcessError as err:
            raise NodeError(str(err)) from err

    def _wait(
        self,
        name: str,
        proc: subprocess.Popen[bytes],
        deadline: float,
        check: Callable[[], bool],
    ) -> None:
        log = self.log_dir / f"{name}.log"
        while True:
            if proc.poll() is not None:
                raise NodeError(
                    f"{name} exited with code {proc.returncode} while starting; "
                    f"last lines of {log}:\n{procs.log_tail(log)}"
                )
            if check():
                return
            if time.monotonic() > deadline:
                raise NodeError(
                    f"{name} was not ready in time; last lines of {log}:\n{procs.log_tail(log)}"
                )
            time.sleep(0.3)

    @staticmethod
    def _ctr_ok(node: NodeState) -> bool:
        if not Path(node.containerd_socket).exists():
            return False
        done = host.run(["ctr", "--address", node.containerd_socket, "version"], check=False)
        return done.returncode == 0

    @staticmethod
    def _node_ready(server: str, name: str, tls: ssl.SSLContext) -> bool:
        body = _get(f"{server}/api/v1/nodes/{name}", tls)
        if not body:
            return False
        conditions = json.loads(body).get("status", {}).get("conditions", [])
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def _get(url: str, context: ssl.SSLContext) -> bytes:
    try:
        with urllib.request.urlopen(url, timeout=2, context=context) as response:
            body: bytes = response.read()
            return body if response.status == 200 else b""
    except (OSError, urllib.error.URLError, ssl.SSLError):
        return b""


def state_from_dict(data: dict[str, Any] | None) -> NodeState | None:
    return NodeState(**data) if data else None


def state_to_dict(node: NodeState) -> dict[str, Any]:
    return asdict(node)
