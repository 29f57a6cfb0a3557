"""The local node's pure parts: its configuration files, the host journal's
parsing and undo order, the sandbox image archive, and the host check's messages."""

from __future__ import annotations

import json
import tarfile
import tomllib
from pathlib import Path
from typing import Any

import pytest

from agentq.controlplane import host, images, node

MOUNTINFO = """\
22 1 8:0 / / rw,relatime - ext4 /dev/vda rw
30 22 0:26 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory
31 22 0:27 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw
40 22 8:0 /s/node/kubelet /s/node/kubelet rw shared:5 - ext4 /dev/vda rw
41 40 0:50 / /s/node/kubelet/pods/a/volumes/x rw - tmpfs tmpfs rw
42 22 0:51 / /s/node/containerd/state/with\\040space rw - tmpfs tmpfs rw
43 22 0:52 / /s/nodeother rw - tmpfs tmpfs rw
"""

SAVE = """\
*nat
:PREROUTING ACCEPT [0:0]
:KUBE-KUBELET-CANARY - [0:0]
-A PREROUTING -i agentq0 -j DNAT --to-destination 127.0.0.1:1
COMMIT
*filter
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:KUBE-FIREWALL - [0:0]
-A INPUT -j KUBE-FIREWALL
-A OUTPUT -j KUBE-FIREWALL
-A KUBE-FIREWALL -m comment --comment "block incoming localnet connections" -j DROP
COMMIT
"""


def test_mounts_under_a_root_come_deepest_first_and_unescaped() -> None:
    assert host.mounts_under("/s/node", MOUNTINFO) == [
        "/s/node/kubelet/pods/a/volumes/x",
        "/s/node/containerd/state/with space",
        "/s/node/kubelet",
    ]
    assert host.mounts_under("/s/nodeother", MOUNTINFO) == ["/s/nodeother"]


def test_cgroup_mounts_are_found_by_filesystem_type() -> None:
    assert host.cgroup_mounts(MOUNTINFO) == ["/sys/fs/cgroup/memory", "/sys/fs/cgroup/unified"]


def test_iptables_save_is_read_into_chains_and_jumps() -> None:
    chains = host.iptables_chains(SAVE)
    assert chains == {
        "nat": {"PREROUTING", "KUBE-KUBELET-CANARY"},
        "filter": {"INPUT", "OUTPUT", "KUBE-FIREWALL"},
    }
    jumps = host.rules_jumping_to(SAVE, "filter", {"KUBE-FIREWALL"})
    assert jumps == [
        ["-A", "INPUT", "-j", "KUBE-FIREWALL"],
        ["-A", "OUTPUT", "-j", "KUBE-FIREWALL"],
    ]


def test_shim_socket_is_where_containerd_puts_it() -> None:
    # containerd 1.6: sha256 of "<address>/<namespace>/<id>" under /run/containerd/s.
    path = host.shim_socket("/run/agentq/node/containerd.sock", "k8s.io", "abc")
    assert path.parent == Path("/run/containerd/s")
    assert len(path.name) == 64


def test_undo_runs_by_phase_latest_first_and_reports_every_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    done: list[str] = []

    def fake(kind: str) -> Any:
        def undo(entry: dict[str, Any], say: host.Say) -> None:
            if entry.get("fail"):
                raise host.HostError(f"{entry['id']} failed")
            done.append(entry["id"])

        return undo

    monkeypatch.setattr(host, "_UNDO", {kind: fake(kind) for kind in host._PHASES})
    journal = host.Journal("test", tmp_path / "run")
    journal.begin("owner")
    for kind, ident in [
        ("path", "dir-1"),
        ("process", "containerd"),
        ("link", "bridge"),
        ("sysctl", "ip_forward"),
        ("process", "kubelet"),
        ("mounts", "mounts"),
        ("path", "dir-2"),
    ]:
        journal.record({"kind": kind, "id": ident})
    journal.undo(say=lambda _: None)
    assert done == [
        "kubelet",
        "containerd",
        "mounts",
        "bridge",
        "ip_forward",
        "dir-2",
        "dir-1",
    ]
    assert not journal.path.exists()
    assert not (tmp_path / "run").exists()  # the journal's own directory, made by begin

    journal.begin("owner")
    journal.record({"kind": "link", "id": "a", "fail": True})
    journal.record({"kind": "sysctl", "id": "b"})
    with pytest.raises(host.HostError, match="a failed"):
        journal.undo(say=lambda _: None)
    assert "b" in done  # the others still ran
    assert journal.path.exists()  # kept, so down can be run again


def test_a_second_holder_of_the_lock_waits(tmp_path: Path) -> None:
    one, two = host.Journal("locktest", tmp_path), host.Journal("locktest", tmp_path)
    with one.locked(), pytest.raises(host.HostError, match="holds the locktest lock"):
        # Re-entrant in one process: simulate another process by clearing the held set.
        held = set(host._HELD)
        host._HELD.clear()
        try:
            with two.locked(timeout=0.5):
                pass
        finally:
            host._HELD.update(held)


def test_containerd_config_isolates_it_and_restricts_oom_score_adj(tmp_path: Path) -> None:
    text = node.containerd_config(
        directory=tmp_path / "containerd",
        socket_path=Path("/run/agentq/node/containerd.sock"),
        cni_bin=Path("/usr/lib/cni"),
    )
    config = tomllib.loads(text)
    assert config["root"] == str(tmp_path / "containerd" / "root")
    assert config["state"] == str(tmp_path / "containerd" / "state")
    assert config["grpc"]["address"] == "/run/agentq/node/containerd.sock"
    cri = config["plugins"]["io.containerd.grpc.v1.cri"]
    assert cri["restrict_oom_score_adj"] is True
    assert cri["sandbox_image"] == node.PAUSE_IMAGE
    assert cri["netns_mounts_under_state_dir"] is True
    runc = cri["containerd"]["runtimes"]["runc"]["options"]
    assert runc["Root"] == str(tmp_path / "containerd" / "runc")
    assert runc["SystemdCgroup"] is False
    assert cri["cni"]["conf_dir"].startswith(str(tmp_path))
    assert config["plugins"]["io.containerd.internal.v1.opt"]["path"].startswith(str(tmp_path))


def test_kubelet_config_allows_no_anonymous_access(tmp_path: Path) -> None:
    state = node.NodeState(
        name="vm",
        ip="192.0.2.2",
        directory=str(tmp_path),
        containerd_socket="/run/agentq/node/containerd.sock",
        kubelet_port=10250,
        kubelet_healthz_port=10248,
        scheduler_port=10259,
        journal="/run/agentq/node.json",
    )
    config = node.kubelet_config(
        node=state,
        ca_cert=tmp_path / "ca.crt",
        serving_cert=tmp_path / "kubelet.crt",
        serving_key=tmp_path / "kubelet.key",
        pod_logs=tmp_path / "pod-logs",
    )
    assert config["authentication"]["anonymous"] == {"enabled": False}
    assert config["authorization"] == {"mode": "Webhook"}
    assert config["readOnlyPort"] == 0
    assert config["address"] == "192.0.2.2"
    assert config["cgroupRoot"] == "/agentq"
    assert config["failCgroupV1"] is False
    assert config["containerRuntimeEndpoint"] == "unix:///run/agentq/node/containerd.sock"


def test_cni_config_is_one_bridge_with_host_local_addresses(tmp_path: Path) -> None:
    config = node.cni_config(ipam_dir=tmp_path / "ipam")
    (bridge,) = config["plugins"]
    assert bridge["bridge"] == node.BRIDGE and bridge["isGateway"] and not bridge["ipMasq"]
    assert bridge["ipam"]["ranges"] == [[{"subnet": node.POD_CIDR, "gateway": node.POD_GATEWAY}]]
    assert bridge["ipam"]["dataDir"] == str(tmp_path / "ipam")


def test_single_binary_image_is_a_docker_archive(tmp_path: Path) -> None:
    binary = tmp_path / "pause"
    binary.write_bytes(b"\x7fELF fake")
    archive = tmp_path / "pause.tar"
    digest = images.single_binary_image(binary, reference="agentq.local/pause:1", dest=archive)
    with tarfile.open(archive) as tar:
        (manifest,) = json.loads(tar.extractfile("manifest.json").read())  # type: ignore[union-attr]
        assert manifest["RepoTags"] == ["agentq.local/pause:1"]
        config = json.loads(tar.extractfile(manifest["Config"]).read())  # type: ignore[union-attr]
        layer = tar.extractfile(manifest["Layers"][0])
        assert layer is not None
        with tarfile.open(fileobj=layer) as inner:
            member = inner.getmember("pause")
            assert member.mode == 0o755
    assert config["config"]["Entrypoint"] == ["/pause"]
    assert digest.startswith("sha256:")
    # Deterministic: the same binary gives the same image.
    again = images.single_binary_image(binary, reference="agentq.local/pause:1", dest=archive)
    assert again == digest


def test_host_check_names_what_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(node.os, "geteuid", lambda: 1000)
    with pytest.raises(node.NodeError, match=r"needs root.*without --node"):
        node.check_host()
    monkeypatch.setattr(node.os, "geteuid", lambda: 0)
    real_read = Path.read_text

    def no_overlay(self: Path, *args: Any, **kwargs: Any) -> str:
        if str(self) == "/proc/filesystems":
            return "nodev\tproc\n\text4\n"
        return real_read(self, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", no_overlay)
    with pytest.raises(node.NodeError, match="no overlayfs"):
        node.check_host()
    monkeypatch.setattr(Path, "read_text", real_read)
    monkeypatch.setattr(node.shutil, "which", lambda _: None)
    monkeypatch.setattr(node, "CNI_PLUGINS_DIRS", ("/nonexistent",))
    with pytest.raises(node.NodeError, match=r"missing on this host: containerd.*make node-deps"):
        node.check_host()
