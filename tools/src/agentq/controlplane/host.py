"""Changes to the host made for the local node (or an image build), journaled and undone.

Every change is recorded in a journal *before* it is made, so that ``down`` -- or
the next ``up`` after a crash -- can undo it even if the cluster's state
directory is gone: the journal lives at a machine-wide path
(``/run/agentq/<name>.json``; one local node per machine). Changes made by the
programs we start (the kubelet sets sysctls and creates directories and
iptables chains; containerd and dockerd create directories) are journaled as
"watches": what was there before they started.

Undo runs in phases, whatever order the entries were recorded in: processes
(latest first), then the pods' processes left in the node's cgroups, container
shims, mounts, network links, iptables rules and chains, sysctls, cgroup
directories, and last the paths that did not exist before. Each step is
idempotent and tolerates "already gone", so an undo can be repeated; a step
that fails is reported and the others still run.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from agentq.controlplane import procs

JOURNAL_DIR = Path(os.environ.get("AGENTQ_HOST_JOURNAL_DIR", "/run/agentq"))

Say = Callable[[str], None]


class HostError(RuntimeError):
    """The host cannot do what was asked, or a change could not be undone; says why."""


def run(
    args: list[str], *, check: bool = True, timeout: float = 30
) -> subprocess.CompletedProcess[str]:
    """Run a host tool; on failure (with ``check``) raise ``HostError`` with its stderr."""
    try:
        done = subprocess.run(args, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise HostError(f"{shlex.join(args)}: {err}") from err
    if check and done.returncode != 0:
        raise HostError(f"{shlex.join(args)} exited {done.returncode}: {done.stderr.strip()}")
    return done


# -- reading the host ------------------------------------------------------------------


def sysctl_path(key: str) -> Path:
    return Path("/proc/sys") / key.replace(".", "/")


def read_sysctl(key: str) -> str | None:
    try:
        return sysctl_path(key).read_text().strip()
    except OSError:
        return None


def _unescape_mount(field: str) -> str:
    # /proc/self/mountinfo escapes space, tab, newline and backslash as \ooo.
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and field[i + 1 : i + 4].isdigit():
            out.append(chr(int(field[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def mount_points(mountinfo: str | None = None) -> list[str]:
    """Every mount point of this mount namespace, in mount order."""
    if mountinfo is None:
        mountinfo = Path("/proc/self/mountinfo").read_text()
    return [_unescape_mount(line.split()[4]) for line in mountinfo.splitlines() if line.strip()]


def is_under(path: str, root: str) -> bool:
    root = root.rstrip("/") or "/"
    return path == root or path.startswith(root + "/")


def mounts_under(root: str, mountinfo: str | None = None) -> list[str]:
    """Mount points at or below ``root``, deepest (latest) first: the order to unmount."""
    found = [m for m in mount_points(mountinfo) if is_under(m, root)]
    # Later mounts may stack on earlier ones: unmount in reverse mount order, and
    # deeper paths before their parents.
    return sorted(reversed(found), key=lambda m: -m.count("/"))


def cgroup_mounts(mountinfo: str | None = None) -> list[str]:
    """The cgroup hierarchies' mount points (one per v1 controller set, or the v2 root)."""
    if mountinfo is None:
        mountinfo = Path("/proc/self/mountinfo").read_text()
    points = []
    for line in mountinfo.splitlines():
        before, _, after = line.partition(" - ")
        fstype = after.split()[0] if after else ""
        if fstype in ("cgroup", "cgroup2"):
            points.append(_unescape_mount(before.split()[4]))
    return points


def iptables_chains(save_output: str) -> dict[str, set[str]]:
    """Table -> chain names, from ``iptables-save`` output."""
    chains: dict[str, set[str]] = {}
    table = ""
    for line in save_output.splitlines():
        if line.startswith("*"):
            table = line[1:].strip()
            chains.setdefault(table, set())
        elif line.startswith(":") and table:
            chains[table].add(line[1:].split()[0])
    return chains


def rules_jumping_to(save_output: str, table: str, chains: set[str]) -> list[list[str]]:
    """The ``-A CHAIN ...`` rules of ``table`` that jump to (or go to) one of ``chains``."""
    found, current = [], ""
    for line in save_output.splitlines():
        if line.startswith("*"):
            current = line[1:].strip()
        elif current == table and line.startswith("-A "):
            words = shlex.split(line)
            for flag in ("-j", "-g"):
                if flag in words[:-1] and words[words.index(flag) + 1] in chains:
                    found.append(words)
                    break
    return found


_BUILTIN_CHAINS = {"INPUT", "OUTPUT", "FORWARD", "PREROUTING", "POSTROUTING"}


def nft_tables() -> list[str] | None:
    """``family name`` of every nftables table, or None without the ``nft`` tool."""
    if shutil.which("nft") is None:
        return None
    listed = run(["nft", "list", "tables"], check=False).stdout
    return [line.removeprefix("table ").strip() for line in listed.splitlines() if line.strip()]


def nft_table_rules(table: str) -> int:
    done = run(["nft", "-j", "list", "table", *table.split()], check=False)
    if done.returncode != 0:
        return 0
    return sum(1 for item in json.loads(done.stdout)["nftables"] if "rule" in item)


def iptables_tools() -> list[str]:
    return [tool for tool in ("iptables", "ip6tables") if shutil.which(tool)]


# -- the journal ---------------------------------------------------------------------------

# Undo phases, in order; entries of a kind run in its phase, latest recorded first.
_PHASES = (
    "process",
    "cgroup-procs",
    "shims",
    "mounts",
    "link",
    "iptables-rule",
    "iptables-chains",
    "nft-tables",
    "sysctl",
    "cgroup",
    "path",
)


_HELD: set[str] = set()


class Journal:
    """The host changes of one owner (``node`` or ``image``), persisted as JSON."""

    def __init__(self, name: str, directory: Path | None = None) -> None:
        self.directory = directory or JOURNAL_DIR
        self.name = name
        self.path = self.directory / f"{name}.json"
        self.entries: list[dict[str, Any]] = []
        self.owner = ""

    # -- persistence ---------------------------------------------------------------------

    def exists(self) -> bool:
        return self.path.exists()

    def load(self) -> bool:
        """Read the journal from disk; False if there is none."""
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return False
        except ValueError as err:
            raise HostError(f"{self.path} is unreadable ({err}); inspect and remove it") from err
        self.entries = list(data.get("entries", []))
        self.owner = str(data.get("owner", ""))
        return True

    def begin(self, owner: str) -> None:
        """Start a new journal owned by ``owner`` (a state directory, for messages)."""
        created = not self.directory.exists()
        self.directory.mkdir(parents=True, exist_ok=True)
        self.owner = owner
        self.entries = []
        if created:
            self.entries.append({"kind": "path", "path": str(self.directory), "mode": "empty"})
        self._save()

    def _save(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"owner": self.owner, "entries": self.entries}, indent=1))
        tmp.replace(self.path)

    def record(self, entry: dict[str, Any]) -> None:
        """Write ``entry`` down before the change it describes is made."""
        assert entry["kind"] in _PHASES, entry
        self.entries.append(entry)
        self._save()

    @contextlib.contextmanager
    def locked(self, timeout: float = 600) -> Iterator[None]:
        """Hold the machine-wide lock of this journal (one up or down at a time).

        The lock is an abstract unix socket name: it leaves no file behind and the
        kernel releases it when the holder dies. Re-entrant within a process.
        """
        key = f"agentq-{self.name}-{self.directory}"
        if key in _HELD:
            yield
            return
        lock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        deadline = time.monotonic() + timeout
        try:
            while True:
                try:
                    lock.bind(f"\0{key}")
                    break
                except OSError as err:
                    if time.monotonic() > deadline:
                        raise HostError(f"another agentq holds the {self.name} lock") from err
                    time.sleep(0.2)
            _HELD.add(key)
            yield
        finally:
            _HELD.discard(key)
            lock.close()

    # -- changes, each journaled before it is made ----------------------------------------

    def process(
        self, name: str, pid: int, executable: str, *, stop_after: str = "", **extra: Any
    ) -> None:
        """A process we started (recorded right after the start, with its pid).

        ``stop_after``: the name of a process that must stop first (a daemon that
        would restart this child of it).
        """
        entry = {"kind": "process", "name": name, "pid": pid, "exe": executable, **extra}
        if stop_after:
            index = next(i for i, e in enumerate(self.entries) if e.get("name") == stop_after)
            self.entries.insert(index, entry)
            self._save()
        else:
            self.record(entry)

    def watch_path(self, path: str | Path, *, mode: str = "tree") -> None:
        """``path`` may be created from now on; undo removes it if it did not exist.

        ``mode`` "tree" removes it with its contents; "empty" removes only empty
        directories (for places other programs may share, like /run/containerd).
        """
        if not os.path.lexists(path):
            self.record({"kind": "path", "path": str(path), "mode": mode})

    def make_dir(self, path: Path, *, mode: str = "tree") -> None:
        """Create ``path`` (and parents), journaling every directory that is new."""
        missing = []
        probe = path
        while not probe.exists():
            missing.append(probe)
            probe = probe.parent
        for directory in reversed(missing):
            self.record({"kind": "path", "path": str(directory), "mode": mode})
            directory.mkdir()

    def set_sysctl(self, key: str, value: str) -> None:
        before = read_sysctl(key)
        if before is None:
            raise HostError(f"sysctl {key} does not exist on this kernel")
        if before == value:
            return
        self.record({"kind": "sysctl", "key": key, "before": before})
        try:
            sysctl_path(key).write_text(value)
        except OSError as err:
            raise HostError(f"cannot set sysctl {key}={value}: {err}") from err

    def watch_sysctl(self, key: str) -> None:
        """Another program may change ``key``; undo writes back today's value."""
        before = read_sysctl(key)
        if before is not None:
            self.record({"kind": "sysctl", "key": key, "before": before})

    def iptables_rule(self, tool: str, table: str, chain: str, rule: list[str]) -> None:
        """Insert ``rule`` at the top of ``chain`` unless it is there already."""
        if run([tool, "-w", "-t", table, "-C", chain, *rule], check=False).returncode == 0:
            return
        self.record(
            {"kind": "iptables-rule", "tool": tool, "table": table, "chain": chain, "rule": rule}
        )
        run([tool, "-w", "-t", table, "-I", chain, "1", *rule])

    def watch_iptables_chains(self) -> None:
        """Programs may add chains from now on; undo removes the ones that are new."""
        for tool in iptables_tools():
            saved = run([f"{tool}-save"], check=False).stdout
            chains = {t: sorted(c) for t, c in iptables_chains(saved).items()}
            self.record({"kind": "iptables-chains", "tool": tool, "before": chains})

    def watch_nft_tables(self) -> None:
        """iptables-nft creates the nftables tables it first uses; undo deletes the new
        ones that hold no rules (needs the ``nft`` tool; else they stay, empty)."""
        self.record({"kind": "nft-tables", "before": nft_tables()})

    def bridge(self, name: str, address: str) -> None:
        """Create bridge ``name`` with ``address`` (CIDR) and bring it up."""
        if Path(f"/sys/class/net/{name}").exists():
            raise HostError(f"network interface {name} exists already; remove it or down the node")
        self.record({"kind": "link", "name": name})
        run(["ip", "link", "add", name, "type", "bridge"])
        run(["ip", "addr", "add", address, "dev", name])
        run(["ip", "link", "set", name, "up"])

    def watch_mounts(self, root: Path) -> None:
        """Mounts may appear at or below ``root``; undo unmounts them all."""
        self.record({"kind": "mounts", "root": str(root)})

    def cgroup(self, name: str) -> None:
        """Create cgroup ``/name`` in every hierarchy (the parent of all pods)."""
        self.record({"kind": "cgroup", "name": name})
        self.record({"kind": "cgroup-procs", "name": name})
        for mount in cgroup_mounts():
            directory = Path(mount) / name
            directory.mkdir(exist_ok=True)
            # cgroup v1 cpuset: a new group starts with no CPUs and no memory nodes.
            for knob in ("cpuset.cpus", "cpuset.mems"):
                if (directory / knob).exists() and not (directory / knob).read_text().strip():
                    (directory / knob).write_text((Path(mount) / knob).read_text())

    def shims(self, address: str) -> None:
        """Container shims serving containerd at ``address``; undo kills the ones left."""
        self.record({"kind": "shims", "address": address})

    # -- undo ------------------------------------------------------------------------------

    def undo(self, say: Say) -> None:
        """Undo every recorded change; remove the journal. Raises if something remains."""
        failures: list[str] = []
        order = sorted(
            range(len(self.entries)),
            key=lambda i: (_PHASES.index(self.entries[i]["kind"]), -i),
        )
        for index in order:
            entry = self.entries[index]
            if entry["kind"] == "path" and entry.get("path") == str(self.directory):
                continue  # the journal's own directory goes last, below
            try:
                _UNDO[entry["kind"]](entry, say)
            except (HostError, OSError, procs.ProcessError) as err:
                failures.append(f"{entry['kind']}: {err}")
        if failures:
            self._save()
            raise HostError(
                "could not undo every host change (the journal "
                f"{self.path} is kept; fix and run down again):\n  " + "\n  ".join(failures)
            )
        self.path.unlink(missing_ok=True)
        # agentq's own directory, whoever made it: gone once no journal lives there.
        with contextlib.suppress(OSError):
            self.directory.rmdir()
        self.entries = []

    def processes_alive(self) -> list[str]:
        return [
            f"{e['name']} (pid {e['pid']})"
            for e in self.entries
            if e["kind"] == "process" and procs.pid_runs(e["pid"], e["exe"])
        ]


def _undo_process(entry: dict[str, Any], say: Say) -> None:
    before = entry.get("before_stop")
    if before and procs.pid_runs(entry["pid"], entry["exe"]):
        _BEFORE_STOP[before](entry, say)
    if procs.stop(entry["pid"], entry["exe"], name=entry["name"], grace=entry.get("grace", 10.0)):
        say(f"stopped {entry['name']} (pid {entry['pid']})")


def _containerd_cleanup(entry: dict[str, Any], say: Say) -> None:
    """Kill and delete every container of a running containerd, so its shims exit
    and unmount their root filesystems before containerd itself stops."""
    ctr = ["ctr", "--address", entry["address"]]
    namespaces = run([*ctr, "namespaces", "ls", "-q"], check=False).stdout.split()
    removed = 0
    for ns in namespaces:
        for task in run([*ctr, "-n", ns, "tasks", "ls", "-q"], check=False).stdout.split():
            run([*ctr, "-n", ns, "tasks", "kill", "-s", "SIGKILL", task], check=False)
        for task in run([*ctr, "-n", ns, "tasks", "ls", "-q"], check=False).stdout.split():
            run([*ctr, "-n", ns, "tasks", "rm", "-f", task], check=False)
        for container in run(
            [*ctr, "-n", ns, "containers", "ls", "-q"], check=False
        ).stdout.split():
            run([*ctr, "-n", ns, "containers", "rm", container], check=False)
            removed += 1
    if removed:
        say(f"removed {removed} containers from containerd")


_BEFORE_STOP: dict[str, Callable[[dict[str, Any], Say], None]] = {
    "containerd": _containerd_cleanup,
}


def _cgroup_dirs(name: str) -> list[Path]:
    """Every directory of cgroup ``/name`` in every hierarchy, deepest first."""
    found: list[Path] = []
    for mount in cgroup_mounts():
        top = Path(mount) / name
        if top.is_dir():
            found.extend(Path(d) for d, _, _ in os.walk(top))
    return sorted(found, key=lambda p: -len(p.parts))


def _undo_cgroup_procs(entry: dict[str, Any], say: Say) -> None:
    """SIGKILL every process left in the node's cgroups (pods of a crashed node)."""
    deadline = time.monotonic() + 10
    killed: set[int] = set()
    while True:
        pids = set()
        for directory in _cgroup_dirs(entry["name"]):
            with contextlib.suppress(OSError):
                pids |= {int(p) for p in (directory / "cgroup.procs").read_text().split()}
        pids.discard(os.getpid())
        if not pids:
            break
        if time.monotonic() > deadline:
            raise HostError(f"processes {sorted(pids)} in cgroup /{entry['name']} survive SIGKILL")
        for pid in pids - killed:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        killed |= pids
        time.sleep(0.1)
    if killed:
        say(f"killed {len(killed)} pod processes left in cgroup /{entry['name']}")


def _undo_cgroup(entry: dict[str, Any], say: Say) -> None:
    dirs = _cgroup_dirs(entry["name"])
    for directory in dirs:
        try:
            directory.rmdir()
        except FileNotFoundError:
            pass
        except OSError as err:
            raise HostError(f"cannot remove cgroup {directory}: {err}") from err
    if dirs:
        say(f"removed cgroup /{entry['name']} ({len(dirs)} directories)")


def shim_socket(address: str, namespace: str, container_id: str) -> Path:
    """Where containerd 1.6's runc shim for ``container_id`` listens (fixed under /run)."""
    digest = hashlib.sha256(f"{address}/{namespace}/{container_id}".encode()).hexdigest()
    return Path("/run/containerd/s") / digest


def _flag(cmdline: list[bytes], flag: bytes) -> str:
    if flag in cmdline[:-1]:
        return cmdline[cmdline.index(flag) + 1].decode(errors="replace")
    return ""


def _undo_shims(entry: dict[str, Any], say: Say) -> None:
    """Kill containerd shims started for our containerd socket (left by a crash), and
    remove their sockets (a killed shim cannot)."""
    needle = entry["address"].encode()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if not cmdline or not os.path.basename(cmdline[0]).startswith(b"containerd-shim"):
            continue
        if needle in cmdline:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(proc.name), signal.SIGKILL)
            say(f"killed containerd shim (pid {proc.name})")
            namespace, container = _flag(cmdline, b"-namespace"), _flag(cmdline, b"-id")
            if namespace and container:
                shim_socket(entry["address"], namespace, container).unlink(missing_ok=True)


def _undo_mounts(entry: dict[str, Any], say: Say) -> None:
    for _ in range(3):  # a mount may have been stacked over another
        points = mounts_under(entry["root"])
        if not points:
            return
        for point in points:
            if run(["umount", point], check=False).returncode != 0:
                # Busy (a process of a crashed pod still holds it): detach it now;
                # the kernel frees it when the last user is gone.
                run(["umount", "-l", point], check=False)
        say(f"unmounted {len(points)} mounts under {entry['root']}")
    left = mounts_under(entry["root"])
    if left:
        raise HostError(f"still mounted under {entry['root']}: {left}")


def _undo_link(entry: dict[str, Any], say: Say) -> None:
    if Path(f"/sys/class/net/{entry['name']}").exists():
        run(["ip", "link", "delete", entry["name"]])
        say(f"deleted network interface {entry['name']}")


def _undo_iptables_rule(entry: dict[str, Any], say: Say) -> None:
    tool, table, chain, rule = entry["tool"], entry["table"], entry["chain"], entry["rule"]
    while run([tool, "-w", "-t", table, "-C", chain, *rule], check=False).returncode == 0:
        run([tool, "-w", "-t", table, "-D", chain, *rule])
        say(f"deleted {tool} rule: -t {table} -A {chain} {shlex.join(rule)}")


def _undo_iptables_chains(entry: dict[str, Any], say: Say) -> None:
    tool = entry["tool"]
    saved = run([f"{tool}-save"], check=False).stdout
    before = {t: set(c) for t, c in entry["before"].items()}
    for table, chains in iptables_chains(saved).items():
        new = chains - before.get(table, set()) - _BUILTIN_CHAINS
        if not new:
            continue
        for words in rules_jumping_to(saved, table, new):
            if words[1] not in new:  # rules inside the new chains go with them
                run([tool, "-w", "-t", table, "-D", *words[1:]], check=False)
        for chain in sorted(new):
            run([tool, "-w", "-t", table, "-F", chain], check=False)
        for chain in sorted(new):
            run([tool, "-w", "-t", table, "-X", chain])
        say(f"deleted {tool} chains added in table {table}: {', '.join(sorted(new))}")


def _undo_nft_tables(entry: dict[str, Any], say: Say) -> None:
    before = entry["before"]
    now = nft_tables()
    if before is None or now is None:
        return
    for table in now:
        if table in before:
            continue
        if nft_table_rules(table):
            say(f"kept nftables table {table}: it has rules we did not add")
            continue
        run(["nft", "delete", "table", *table.split()])
        say(f"deleted nftables table {table} (created empty by iptables)")


def _undo_sysctl(entry: dict[str, Any], say: Say) -> None:
    current = read_sysctl(entry["key"])
    if current is None or current == entry["before"]:
        return
    sysctl_path(entry["key"]).write_text(entry["before"])
    say(f"restored sysctl {entry['key']}={entry['before']} (was {current})")


def _undo_path(entry: dict[str, Any], say: Say) -> None:
    path = Path(entry["path"])
    if not os.path.lexists(path):
        return
    if path.is_dir() and not path.is_symlink():
        held = mounts_under(str(path))
        if held:
            raise HostError(f"not removing {path}: still mounted below it: {held}")
        if entry.get("mode") == "empty":
            for directory, _, _ in sorted(os.walk(path), key=lambda w: -len(w[0])):
                with contextlib.suppress(OSError):
                    os.rmdir(directory)
            if path.exists():
                say(f"kept {path}: another program put files there")
                return
        else:
            shutil.rmtree(path)
    else:
        path.unlink()
    say(f"removed {path}")


_UNDO: dict[str, Callable[[dict[str, Any], Say], None]] = {
    "process": _undo_process,
    "cgroup-procs": _undo_cgroup_procs,
    "shims": _undo_shims,
    "mounts": _undo_mounts,
    "link": _undo_link,
    "iptables-rule": _undo_iptables_rule,
    "iptables-chains": _undo_iptables_chains,
    "nft-tables": _undo_nft_tables,
    "sysctl": _undo_sysctl,
    "cgroup": _undo_cgroup,
    "path": _undo_path,
}
