"""``make demo``: agentq's main job on the embedded control plane, end to end, live.

Brings the control plane up (building it the first time), installs the CRDs,
starts the operator and one agent pod per worker (an ``agentq sidecar`` and an
``agentq agent-sim`` process), and shows one screen
that updates as it goes (tasks by phase, each worker's share of the served cost
against its share of the weight, reclaims and dead letters as they happen):

1. three workers of weights 1 : 2 : 4 and a backlog of tasks of cost 1-3, sent in
   waves; every worker's share of the assigned cost stays within the DRR bound;
2. the faults agentq exists to beat: the heaviest worker's agent is killed with
   SIGKILL while it holds tasks (their leases run out and they are re-dispatched
   to the others), and a poison task is dead-lettered after maxReclaims + 1
   attempts.

Then it prints a summary with the checks (every task terminal, poison
DeadLettered, shares within the bound; exit 1 if one fails) and stops every
process it started, by pid. ``--keep`` leaves the cluster, the operator and the
agents running (the poison task's agent fixed) and prints how to look around;
``--down`` (``make demo-down``) stops them and the control plane.
``--no-live`` prints progress lines instead of the live screen (the default when
stdout is not a terminal); ``--kubeconfig`` runs against an existing cluster.
"""

from __future__ import annotations

import contextlib
import ctypes
import datetime
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click
import yaml
from kubernetes import client, config
from kubernetes.client.rest import ApiException
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.padding import Padding
from rich.text import Text

from agentq import GROUP, VERSION, agentsim
from agentq.clock import parse_time
from agentq.controlplane import Cluster as ControlPlane
from agentq.controlplane import ClusterError
from agentq.controlplane.cluster import free_port, pid_runs
from agentq.ops import fleet, render
from agentq.ops.errors import OpsError
from agentq.ops.kube import Cluster

NAMESPACE = "agentq-demo"
REPO = Path(__file__).resolve().parents[3]  # tools/src/agentq/demo.py
CRDS = REPO / "crds"
WORKERS = {  # name: (capabilities, weight)
    "small": (("llm",), 1),
    "medium": (("llm",), 2),
    "large": (("llm", "gpu"), 4),
}
LEASE_SECONDS = 6
MAX_RECLAIMS = 2
WORK_SECONDS = 1.5
FEED_REASONS = (
    "LeaseExpired",
    "Reclaimed",
    "DeadLettered",
    "Held",
    "StaleReportRefused",
    "Requeued",
)
PIDFILE = "processes.json"


# --- the fairness check (pure) ----------------------------------------------------------------


@dataclass(frozen=True)
class Share:
    worker: str
    weight: float
    cost: float  # assigned cost of the backlog
    fair: float  # total * weight / total weight
    low: float  # the DRR bound on cost - fair (docs/scheduling.md, "The DRR bound")
    high: float

    @property
    def within(self) -> bool:
        # A little slack for float rounding only.
        return self.low - 1e-6 <= self.cost - self.fair <= self.high + 1e-6


def shares(weights: Mapping[str, float], assigned: Iterable[tuple[str, float]]) -> list[Share]:
    """Each worker's assigned cost against its weighted share, with the proven bound.

    Over a backlog every worker could take, with no worker full, the core keeps
    ``-C (n-1) w_i / W <= a_i - w_i T / W <= C (W - w_i) / W`` (C the largest cost).
    """
    cost: dict[str, float] = dict.fromkeys(weights, 0.0)
    largest = 0.0
    for worker, c in assigned:
        cost[worker] = cost.get(worker, 0.0) + c
        largest = max(largest, c)
    total = sum(cost.values())
    total_weight = sum(weights.values())
    n = len(weights)
    return [
        Share(
            worker=name,
            weight=w,
            cost=cost[name],
            fair=total * w / total_weight,
            low=-largest * (n - 1) * w / total_weight,
            high=largest * (total_weight - w) / total_weight,
        )
        for name, w in weights.items()
    ]


# --- processes ---------------------------------------------------------------------------------


def _die_with_parent() -> None:
    # Between fork and exec: if the demo dies (even by SIGKILL), its children die too.
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    @property
    def pid(self) -> int:
        return self.popen.pid


def stop_pid(pid: int, executable: str, *, timeout: float = 15) -> None:
    """SIGTERM (SIGCONT first, for a frozen one), then SIGKILL; only if it still runs
    ``executable`` (a recycled pid is never signalled)."""
    if not pid_runs(pid, executable):
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGCONT)
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        if not pid_runs(pid, executable):
            return
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def stop_recorded(workdir: Path) -> int:
    """Stop the processes a ``--keep`` run left (recorded in ``workdir``); how many."""
    pidfile = workdir / PIDFILE
    try:
        recorded = json.loads(pidfile.read_text())
    except (OSError, ValueError):
        return 0
    stopped = 0
    for entry in reversed(recorded):
        if pid_runs(int(entry["pid"]), str(entry["executable"])):
            stop_pid(int(entry["pid"]), str(entry["executable"]))
            stopped += 1
    pidfile.unlink(missing_ok=True)
    return stopped


# --- the run -----------------------------------------------------------------------------------


@dataclass
class Feed:
    """Reclaims, dead letters and the like, as they happen (newest last)."""

    seen: set[str] = field(default_factory=set)
    lines: list[tuple[datetime.datetime | None, str, str, str]] = field(default_factory=list)
    counts: Counter[str] = field(default_factory=Counter)

    def add(self, events: Iterable[Mapping[str, Any]]) -> list[str]:
        fresh = []
        ordered = sorted(
            events,
            key=lambda e: str(e.get("lastTimestamp") or e.get("eventTime") or ""),
        )
        for event in ordered:
            uid = str((event.get("metadata") or {}).get("uid") or id(event))
            reason = str(event.get("reason") or "")
            if uid in self.seen or reason not in FEED_REASONS:
                continue
            self.seen.add(uid)
            name = str((event.get("involvedObject") or {}).get("name") or "?")
            message = str(event.get("message") or "")
            when = parse_time(event.get("lastTimestamp") or event.get("eventTime"))
            self.lines.append((when, reason, name, message))
            self.counts[reason] += 1
            fresh.append(f"{reason} {name}: {message}")
        return fresh


class Demo:
    def __init__(
        self,
        *,
        kubeconfig: str,
        namespace: str,
        workdir: Path,
        live: bool,
        keep: bool,
        out: Console,
    ) -> None:
        self.kubeconfig = kubeconfig
        self.namespace = namespace
        self.workdir = workdir
        self.live = live
        self.keep = keep
        self.out = out
        self.api = config.new_client_from_config(config_file=kubeconfig)
        self.custom = client.CustomObjectsApi(self.api)
        self.core = client.CoreV1Api(self.api)
        self.extensions = client.ApiextensionsV1Api(self.api)
        self.cluster = Cluster.connect(kubeconfig=kubeconfig, namespace=namespace)
        self.procs: list[Proc] = []
        self.agents: dict[str, list[Proc]] = {}
        self.stage = ""
        self.feed = Feed()
        self.window = fleet.ShareWindow(60.0)
        self.metrics_port = free_port()
        self._live: Live | None = None
        self._last_line = 0.0

    # -- processes ----------------------------------------------------------------

    def spawn(self, name: str, argv: list[str]) -> Proc:
        log = self.workdir / f"{name}.log"
        with open(log, "ab") as out:
            popen = subprocess.Popen(
                argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, "KUBECONFIG": self.kubeconfig, "PYTHONUNBUFFERED": "1"},
                start_new_session=True,  # Ctrl-C goes to the demo, which stops them in order
                preexec_fn=None if self.keep else _die_with_parent,
            )
        proc = Proc(name, popen, log)
        self.procs.append(proc)
        self._record()
        return proc

    def _record(self) -> None:
        entries = [
            {"name": p.name, "pid": p.pid, "executable": sys.executable}
            for p in self.procs
            if p.popen.poll() is None
        ]
        (self.workdir / PIDFILE).write_text(json.dumps(entries, indent=2))

    def start_agent(
        self,
        worker: str,
        behaviour: str = "complete",
        *,
        work_seconds: float | None = None,
        sidecar_flags: dict[str, Any] | None = None,
    ) -> None:
        """An agent pod for ``worker``, as two processes: ``agentq sidecar`` (keeps the
        worker's Lease, renews the claims) and ``agentq agent-sim`` (does the work,
        talking only to its sidecar over loopback HTTP). ``sidecar_flags``: more of the
        sidecar's options (``operator_url``, ``operator_token_file``)."""
        if work_seconds is None:
            work_seconds = WORK_SECONDS if behaviour == "complete" else 0.3
        sidecar, agent = agentsim.pair_commands(
            worker=worker,
            namespace=self.namespace,
            port=free_port(),
            token_file=str(self.workdir / f"sidecar-token-{worker}"),
            behaviour=behaviour,
            kubeconfig=self.kubeconfig,
            identity=f"{worker}-pod",  # a pair started again is the same pod restarted
            sidecar_flags={"worker_lease_seconds": 4, **(sidecar_flags or {})},
            agent_flags={"work_seconds": work_seconds},
        )
        self.agents[worker] = [
            self.spawn(f"sidecar-{worker}", sidecar),
            self.spawn(f"agent-{worker}", agent),
        ]

    def start_operator(self, *flags: str) -> Proc:
        return self.spawn(
            "operator",
            [
                sys.executable,
                "-m",
                "agentq.cli",
                "operator",
                "--namespace",
                self.namespace,
                "--metrics-port",
                str(self.metrics_port),
                "--no-leader-election",
                *flags,
            ],
        )

    def kill_agent(self, worker: str) -> None:
        for proc in self.agents.pop(worker, []):
            os.kill(proc.pid, signal.SIGKILL)
            proc.popen.wait()
        self._record()

    def stop(self) -> None:
        for proc in reversed(self.procs):
            if proc.popen.poll() is None:
                stop_pid(proc.pid, sys.executable)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.popen.wait(timeout=5)
        (self.workdir / PIDFILE).unlink(missing_ok=True)

    # -- objects --------------------------------------------------------------------

    def install_crds(self) -> None:
        for path in sorted(CRDS.glob("*.yaml")):
            body = yaml.safe_load(path.read_text())
            name = body["metadata"]["name"]
            try:
                self.extensions.create_custom_resource_definition(body)
            except ApiException as err:
                if err.status != 409:
                    raise
                current = self.extensions.read_custom_resource_definition(name)
                body["metadata"]["resourceVersion"] = current.metadata.resource_version
                self.extensions.replace_custom_resource_definition(name, body)
        deadline = time.monotonic() + 60
        for path in sorted(CRDS.glob("*.yaml")):
            name = yaml.safe_load(path.read_text())["metadata"]["name"]
            while not self._established(name):
                if time.monotonic() > deadline:
                    raise click.ClickException(f"CRD {name} not Established after 60 s")
                time.sleep(0.2)

    def _established(self, name: str) -> bool:
        crd = self.extensions.read_custom_resource_definition(name)
        return any(
            c.type == "Established" and c.status == "True" for c in (crd.status.conditions or [])
        )

    def fresh_namespace(self) -> None:
        with contextlib.suppress(ApiException):
            self.core.delete_namespace(self.namespace)
        deadline = time.monotonic() + 120
        while True:
            try:
                self.core.read_namespace(self.namespace)
            except ApiException as err:
                if err.status == 404:
                    break
                raise
            if time.monotonic() > deadline:
                raise click.ClickException(f"namespace {self.namespace} is still terminating")
            time.sleep(0.5)
        self.core.create_namespace(
            client.V1Namespace(metadata=client.V1ObjectMeta(name=self.namespace))
        )

    def create(self, plural: str, body: dict[str, Any]) -> None:
        self.custom.create_namespaced_custom_object(GROUP, VERSION, self.namespace, plural, body)

    def worker(
        self, name: str, capabilities: Iterable[str], weight: float, max_in_flight: int
    ) -> None:
        self.create(
            "agentworkers",
            {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": "AgentWorker",
                "metadata": {"name": name},
                "spec": {
                    "capabilities": list(capabilities),
                    "weight": weight,
                    "maxInFlight": max_in_flight,
                },
            },
        )

    def task(self, name: str, cost: float, requires: Iterable[str], **spec: Any) -> None:
        self.create(
            "agenttasks",
            {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": "AgentTask",
                "metadata": {"name": name, "labels": {"agentq.dev/demo": "true"}},
                "spec": {
                    "requiredCapabilities": list(requires),
                    "cost": cost,
                    "leaseDurationSeconds": LEASE_SECONDS,
                    "payload": {"prompt": f"do {name}"},
                    **spec,
                },
            },
        )

    # -- watching ---------------------------------------------------------------------

    def snapshot(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        tasks = self.cluster.tasks(self.namespace)
        workers = self.cluster.workers(self.namespace)
        self.window.add_workers(time.monotonic(), workers)
        for line in self.feed.add(self.cluster.events(self.namespace)):
            if not self.live:
                self.out.print(f"   event: {line}")
        return tasks, workers

    def frame(self, tasks: list[dict[str, Any]], workers: list[dict[str, Any]]) -> RenderableType:
        view = fleet.build(
            tasks, workers, now=datetime.datetime.now(datetime.UTC), recent=self.window.shares()
        )
        head = Text.assemble(
            ("agentq demo", "bold cyan"),
            f" · namespace {self.namespace} · ",
            (self.stage, "bold"),
        )
        feed = Text("\nreclaims and dead letters, as they happen\n", style="bold")
        for when, reason, name, message in self.feed.lines[-8:]:
            stamp = when.strftime("%H:%M:%S") if when else "--:--:--"
            style = "bold red" if reason == "DeadLettered" else "yellow"
            feed.append(f"  {stamp} ")
            feed.append(f"{reason:<13}", style=style)
            feed.append(f" {name}: {message[:110]}\n")
        if not self.feed.lines:
            feed.append("  (none yet)\n", style="dim")
        totals = Text.assemble(
            "  so far: ",
            (f"{self.feed.counts['Reclaimed']} reclaimed", "yellow"),
            ", ",
            (f"{self.feed.counts['DeadLettered']} dead-lettered", "red"),
        )
        return Group(head, Text(""), render.fleet(view, live=True), feed, totals)

    def say(self, stage: str) -> None:
        self.stage = stage
        if self._live is None:
            self.out.print(Text(stage, style="bold cyan"))

    def pause(self, seconds: float) -> None:
        """Wait ``seconds`` while the screen keeps updating."""
        until = time.monotonic() + seconds
        self.wait_until(lambda _: time.monotonic() >= until, timeout=seconds + 60, what="a pause")

    def wait_until(
        self,
        done: Callable[[list[dict[str, Any]]], bool],
        *,
        timeout: float,
        what: str,
    ) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while True:
            tasks, workers = self.snapshot()
            if self._live is not None:
                self._live.update(self.frame(tasks, workers))
            elif time.monotonic() - self._last_line > 3:
                self._last_line = time.monotonic()
                counts = fleet.build(tasks, workers, now=datetime.datetime.now(datetime.UTC))
                self.out.print(Text.assemble("   ", render.phase_line(counts.totals())))
            if done(tasks):
                return tasks
            if time.monotonic() > deadline:
                raise click.ClickException(
                    f"timed out after {timeout:.0f}s waiting for {what}; logs in {self.workdir}"
                )
            time.sleep(0.5)


def _phase(task: Mapping[str, Any]) -> str:
    return str((task.get("status") or {}).get("phase") or "Pending")


def _terminal(tasks: list[dict[str, Any]]) -> bool:
    return bool(tasks) and all(_phase(t) in ("Succeeded", "Failed", "DeadLettered") for t in tasks)


def _name(task: Mapping[str, Any]) -> str:
    return str(task["metadata"]["name"])


Tasks = list[dict[str, Any]]


def run(demo: Demo, count: int) -> tuple[Tasks, Tasks]:
    """The scenario; returns the tasks when the backlog was done, and at the end."""
    demo.say("installing the CRDs and a fresh namespace")
    demo.install_crds()
    demo.fresh_namespace()

    total_weight = sum(w for _, w in WORKERS.values())
    demo.say(
        "three workers of weights 1 : 2 : 4, an agent pod (sidecar + agent) each, the operator"
    )
    for name, (caps, weight) in WORKERS.items():
        # Room for every task it should get: the bound holds while no worker is full.
        demo.worker(name, caps, weight, 2 + math.ceil(1.5 * count * weight / total_weight))
        demo.start_agent(name)
    demo.start_operator("--reconcile-interval", "1", "--max-reclaims", str(MAX_RECLAIMS))
    demo.wait_until(
        lambda _: all(
            (w.get("status") or {}).get("phase") == "Ready"
            for w in demo.cluster.workers(demo.namespace)
        ),
        timeout=60,
        what="every worker to be Ready",
    )

    costs = [1 + i % 3 for i in range(count)]
    waves = 3
    demo.say(f"a backlog of {count} tasks of cost 1-3 (total {sum(costs)}), in {waves} waves")
    for wave in range(waves):
        for i in range(wave, count, waves):
            demo.task(f"task-{i:03d}", costs[i], ["llm"])
        if wave < waves - 1:
            demo.pause(1.5)
    backlog = demo.wait_until(_terminal, timeout=240, what="the backlog to finish")

    demo.say("faults: a poison task, and the 'large' worker's agent killed (SIGKILL) mid-task")
    demo.worker("flaky", ("flaky",), 1, 1)  # its agent fails every task it gets
    demo.start_agent("flaky", "fail")
    demo.task(
        "poison",
        1,
        ["flaky"],
        maxReclaims=MAX_RECLAIMS,
        retryBackoff={"initialSeconds": 0.5, "maxSeconds": 2},
    )
    demo.task("render-gpu", 2, ["gpu"])
    for i in range(12):
        demo.task(f"late-{i:02d}", 1 + i % 3, ["llm"])
    demo.wait_until(
        lambda tasks: any(
            (t.get("status") or {}).get("worker") == "large"
            and _phase(t) in ("Assigned", "Running")
            and _name(t).startswith("late-")
            for t in tasks
        ),
        timeout=60,
        what="a late task on 'large'",
    )
    demo.kill_agent("large")
    demo.say(
        f"killed the 'large' agent: its claims' leases run out ({LEASE_SECONDS} s), "
        "then they are re-dispatched"
    )
    # render-gpu needs 'large' (the only gpu worker); bring an agent back for it.
    demo.wait_until(
        lambda tasks: all(
            _phase(t) in ("Succeeded", "DeadLettered") for t in tasks if _name(t) != "render-gpu"
        ),
        timeout=240,
        what="the reclaimed tasks and the poison task to settle",
    )
    demo.say("a new 'large' agent starts (render-gpu needs a gpu worker)")
    demo.start_agent("large")
    final = demo.wait_until(_terminal, timeout=120, what="every task to end")
    return backlog, final


def summary(
    demo: Demo, backlog: list[dict[str, Any]], final: list[dict[str, Any]], count: int
) -> list[str]:
    out = demo.out
    failures: list[str] = []
    phases = Counter(_phase(t) for t in final)
    out.print(Text("\nSummary", style="bold"))
    out.print(Text.assemble("  tasks: ", render.phase_line(dict(sorted(phases.items())))))
    if not _terminal(final):
        failures.append("not every task is terminal")

    assigned = [
        (str(t["status"]["worker"]), float(t["spec"]["cost"]))
        for t in backlog
        if _name(t).startswith("task-") and (t.get("status") or {}).get("worker")
    ]
    table = render.table(
        "WORKER", "WEIGHT SHARE", "COST SHARE", "COST", "FAIR", "DIFF", "DRR BOUND", ""
    )
    result = shares({n: float(w) for n, (_, w) in WORKERS.items()}, assigned)
    total = sum(s.cost for s in result) or 1.0
    for s in result:
        table.add_row(
            s.worker,
            f"{s.weight / sum(x.weight for x in result):.0%}",
            f"{s.cost / total:.0%}",
            f"{s.cost:g}",
            f"{s.fair:.1f}",
            f"{s.cost - s.fair:+.1f}",
            f"[{s.low:+.1f}, {s.high:+.1f}]",
            Text("ok", style="green") if s.within else Text("OUTSIDE", style="bold red"),
        )
        if not s.within:
            failures.append(f"{s.worker}'s share is outside the DRR bound")
    if len(assigned) != count:
        failures.append(f"only {len(assigned)} of {count} backlog tasks were assigned")
    out.print(Text(f"\n  fair share of the backlog ({count} tasks, cost {total:g}):", style="bold"))
    out.print(Padding(table, (0, 0, 0, 4), expand=False))

    moved = [
        t for t in final if _name(t).startswith("late-") and (t["status"].get("reclaims") or 0)
    ]
    out.print(Text(f"\n  reclaimed after the kill ({len(moved)}):", style="bold"))
    for t in moved:
        path = " -> ".join(
            f"{h.get('worker')} ({h.get('reason')})"
            for h in t["status"].get("history") or []
            if h.get("outcome") == "Failed"
        )
        out.print(f"    {_name(t)}: {path} -> {t['status'].get('worker')} [{_phase(t)}]")
    poison = next((t for t in final if _name(t) == "poison"), None)
    if poison is None or _phase(poison) != "DeadLettered":
        failures.append("poison is not DeadLettered")
    else:
        out.print(
            f"\n  dead-lettered: poison after {poison['status'].get('attempt')} attempts on "
            f"flaky ({(poison['status'].get('error') or {}).get('reason')})"
        )
    if failures:
        out.print(Text("\n  FAILED: " + "; ".join(failures), style="bold red"))
    else:
        out.print(
            Text(
                "\n  all checks passed: every task terminal, poison DeadLettered, every share "
                "within the DRR bound",
                style="bold green",
            )
        )
    return failures


def _next_steps(demo: Demo, embedded: bool) -> None:
    ns = demo.namespace
    env = 'eval "$(agentq cluster env)"' if embedded else f"export KUBECONFIG={demo.kubeconfig}"
    demo.out.print(
        Text(
            "\nThe cluster, the operator and the agents keep running; the flaky worker's agent "
            "is fixed now. Look around:",
            style="bold",
        )
    )
    venv_bin = Path(sys.executable).parent
    on_path = shutil.which("agentq") == str(venv_bin / "agentq")
    for line in (
        *(() if on_path else (f'export PATH={venv_bin}:"$PATH"   # agentq, kubectl-agentq',)),
        f"{env}",
        f"kubectl get agentq -n {ns}",
        f"agentq top -n {ns}",
        f"agentq explain poison -n {ns}",
        f"agentq requeue --all-dead-lettered -n {ns} --rate 5",
        f"curl -s localhost:{demo.metrics_port}/metrics | grep ^agentq_",
    ):
        demo.out.print(f"  {line}")
    down = (
        "make demo-down" if embedded else f"python -m agentq.demo --down --workdir {demo.workdir}"
    )
    demo.out.print(f"Stop everything: {down}   (logs: {demo.workdir})")


@click.command()
@click.option("--keep", is_flag=True, help="Leave the cluster, operator and agents running.")
@click.option(
    "--tasks",
    "count",
    default=42,
    show_default=True,
    type=click.IntRange(6, 500),
    help="Backlog size.",
)
@click.option("--live/--no-live", default=None, help="The live screen [default: on a terminal].")
@click.option("--kubeconfig", help="Run against this cluster instead of the embedded one.")
@click.option("--namespace", default=NAMESPACE, show_default=True)
@click.option("--workdir", type=click.Path(file_okay=False, path_type=Path), help="Logs and pids.")
@click.option("--down", is_flag=True, help="Stop what a --keep run left, and the control plane.")
def main(
    keep: bool,
    count: int,
    live: bool | None,
    kubeconfig: str | None,
    namespace: str,
    workdir: Path | None,
    down: bool,
) -> None:
    """agentq's main job on the embedded control plane, live (see ``make demo``)."""
    out = render.console()
    plane = ControlPlane()
    embedded = kubeconfig is None
    state = plane.load() if embedded else None
    if down:
        where = workdir or (Path(state.state_dir) / "demo" if state else None)
        stopped = stop_recorded(where) if where else 0
        click.echo(f"stopped {stopped} demo process(es)")
        if embedded:
            click.echo("control plane stopped" if plane.down() else "no control plane was running")
        return
    started_here = False
    if embedded:
        if state is None or not all(plane.running(state).values()):
            out.print(
                Text(
                    "starting the embedded control plane (etcd, kube-apiserver, "
                    "controller manager)",
                    style="bold cyan",
                )
            )
            try:
                state = plane.up(say=lambda line: click.echo(f"   {line}"))
            except ClusterError as err:
                raise click.ClickException(str(err)) from err
            started_here = True
        else:
            out.print(f"reusing the running control plane at {state.server}")
        kubeconfig = state.kubeconfig
        workdir = workdir or Path(state.state_dir) / "demo"
    workdir = workdir or Path(tempfile.mkdtemp(prefix="agentq-demo-"))
    workdir.mkdir(parents=True, exist_ok=True)
    stop_recorded(workdir)  # a previous --keep run's processes
    assert kubeconfig is not None
    use_live = out.is_terminal if live is None else live
    demo = Demo(
        kubeconfig=kubeconfig,
        namespace=namespace,
        workdir=workdir,
        live=use_live,
        keep=keep,
        out=out,
    )
    failures: list[str] = []
    try:
        if use_live:
            with Live(Text("starting..."), console=out, refresh_per_second=4) as screen:
                demo._live = screen
                try:
                    backlog, final = run(demo, count)
                finally:
                    demo._live = None
        else:
            backlog, final = run(demo, count)
        failures = summary(demo, backlog, final, count)
        if keep:
            _fix_flaky(demo)
            _next_steps(demo, embedded)
    except OpsError as err:
        raise click.ClickException(str(err)) from err
    finally:
        demo.cluster.close()
        if not keep:
            demo.stop()
            if started_here:
                out.print("stopping the control plane (use --keep to look around afterwards)")
                plane.down()
    if failures:
        sys.exit(1)


def _fix_flaky(demo: Demo) -> None:
    """--keep: replace the failing agent with one that completes, so a redrive succeeds."""
    demo.kill_agent("flaky")
    demo.start_agent("flaky", "complete")


if __name__ == "__main__":
    main()
