"""What the local node could leave on the host, as a comparable snapshot.

``snapshot()`` before ``up --node`` and after ``down`` must be equal: mounts,
network links, iptables and nftables state, the sysctls the node or the kubelet
touch, cgroups, the directories containerd, the CNI plugins, the kubelet and
dockerd write to, and processes of ours (anything that mentions the node's
runtime directory or its containerd socket). Other engineers' work on the same
machine (control planes on loopback, files in /tmp) is outside what it looks at.
"""

from __future__ import annotations

import glob
import os
import subprocess
from pathlib import Path
from typing import Any

from agentq.controlplane import host, node

SYSCTLS = (
    *node.KUBELET_SYSCTLS,
    *node.CNI_SYSCTLS,
    "net.ipv6.conf.all.forwarding",
    "net.ipv4.conf.all.route_localnet",
)
PATH_ROOTS = ("/run", "/var/lib", "/var/log", "/etc", "/opt")
# Places other programs on a shared machine change while we look (test runs,
# package installs): not ours to judge.
IGNORED = ("/run/shm", "/run/user", "/run/lock", "/var/log/apt", "/var/lib/apt", "/var/lib/dpkg")


def _paths() -> list[str]:
    found = []
    for root in PATH_ROOTS:
        for level in ("/*", "/*/*"):
            for path in glob.glob(root + level):
                if not any(host.is_under(path, ignored) for ignored in IGNORED):
                    found.append(path)
    return sorted(found)


def _iptables() -> dict[str, list[str]]:
    out = {}
    for tool in host.iptables_tools():
        saved = subprocess.run([f"{tool}-save"], capture_output=True, text=True, check=False).stdout
        # Counters and timestamps change by themselves; rules and chains do not.
        out[tool] = sorted(
            line.split(" [")[0] for line in saved.splitlines() if line and not line.startswith("#")
        )
    return out


def our_processes() -> list[str]:
    """Processes that belong to a local node or an image build (by what they run)."""
    needles = (str(host.JOURNAL_DIR).encode(),)
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes()
            state = (proc / "stat").read_text().rsplit(")", 1)[-1].split()[0]
        except OSError:
            continue
        if state != "Z" and any(n in cmdline for n in needles):
            text = cmdline.replace(b"\0", b" ").decode(errors="replace")
            found.append(f"{proc.name} {text[:200]}")
    return sorted(found)


def snapshot() -> dict[str, Any]:
    return {
        "mounts": sorted(host.mount_points()),
        "links": sorted(os.listdir("/sys/class/net")),
        "iptables": _iptables(),
        "nft": host.nft_tables(),
        "sysctls": {key: host.read_sysctl(key) for key in SYSCTLS},
        "cgroups": sorted(
            d for mount in host.cgroup_mounts() for d in glob.glob(f"{mount}/*/") if "agentq" in d
        ),
        "paths": _paths(),
        "processes": our_processes(),
    }


def differences(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """What changed, one line per difference (empty: the host is as it was)."""
    out = []
    for key in before:
        old, new = before[key], after[key]
        if old == new:
            continue
        if isinstance(old, list) and isinstance(new, list):
            added = sorted(set(new) - set(old))
            removed = sorted(set(old) - set(new))
            out.append(f"{key}: added {added[:20]} removed {removed[:20]}")
        else:
            out.append(f"{key}: {old} -> {new}")
    return out
