"""Runs a chaos plan on a fresh embedded control plane and verifies the outcome.

``ChaosRun(plan, workdir).run()`` starts its own etcd, kube-apiserver and
kube-controller-manager (so restarting the API server disturbs nothing else),
installs the CRDs, creates the workers, starts every agent pod (``agents``) and
two operator replicas with leader election, each under libfaketime so its wall
clock can be stepped; then it creates the tasks, fires each fault of the plan
when its point of progress is reached, waits until every task is terminal, reads
the final state back from the API server and hands it to ``verify``.

Processes are real and are stopped by pid: a ``Supervisor`` thread restarts an
agent or a replica that exited (after the plan's delay, as a kubelet or a
Deployment would) and records an exit nobody asked for as an ``agent-crash``.
The fault loop and every control-plane restart run on the calling thread (the
control plane's processes are tied to the thread that started them).
"""

from __future__ import annotations

import contextlib
import glob
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client, config

from agentq import GROUP, VERSION
from agentq.controlplane import Cluster
from builders import budget, task, worker
from chaos import plan as p
from chaos.agents import KITS, AgentKit, Context, default_kit
from chaos.observe import TaskWatcher
from chaos.verify import Collected, FaultRecord, Verdict, verify
from fleet import AGENTQ, Process

CRDS = Path(__file__).resolve().parents[2] / "crds"
NAMESPACE = "chaos"
ELECTION = "agentq-operator"
LIBFAKETIME = next(iter(glob.glob("/usr/lib/*/faketime/libfaketime.so.1")), None)
# A killed agent process counts as faulted until this long after its replacement
# started: the new process has to start Python and find its Leases again.
STARTUP_GRACE = 5.0
# A stopped process counts as faulted until this long after SIGCONT.
RESUME_GRACE = 1.0


class ChaosError(RuntimeError):
    """The run could not be carried out (not a verdict: the harness itself failed)."""


@dataclass
class Slot:
    """A process the harness keeps running, as a kubelet or a Deployment would."""

    name: str
    launch: Callable[[int], Process]
    delays: list[float]
    proc: Process | None = None
    serial: int = 0
    expected_exit: bool = False
    restart_at: float | None = None
    open_fault: FaultRecord | None = None
    history: list[Process] = field(default_factory=list)

    def start(self) -> Process:
        self.serial += 1
        self.proc = self.launch(self.serial)
        self.history.append(self.proc)
        return self.proc

    def next_delay(self) -> float:
        return self.delays[self.serial % len(self.delays)]


class Supervisor:
    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.slots: dict[str, Slot] = {}
        self.lock = threading.RLock()
        self.crashes: list[FaultRecord] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="supervisor", daemon=True)

    def add(self, slot: Slot) -> Slot:
        with self.lock:
            self.slots[slot.name] = slot
            slot.start()
        return slot

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        with self.lock:
            # Operators first (added last), so none reclaims from agents being stopped.
            for slot in reversed(list(self.slots.values())):
                for proc in slot.history:
                    proc.stop()

    def _run(self) -> None:
        while not self._stop.is_set():
            with self.lock:
                for slot in self.slots.values():
                    self._check(slot)
            time.sleep(0.2)

    def _check(self, slot: Slot) -> None:
        proc = slot.proc
        if proc is None or proc.popen.poll() is None:
            return
        now = self.clock()
        if slot.restart_at is None:
            if not slot.expected_exit:
                record = FaultRecord(
                    "agent-crash" if slot.name.startswith("agent/") else "replica-crash",
                    slot.name.split("/")[1] if "/" in slot.name else slot.name,
                    now,
                    note=f"exit code {proc.popen.returncode}",
                )
                self.crashes.append(record)
                slot.open_fault = record
            slot.restart_at = now + slot.next_delay()
            return
        if now >= slot.restart_at:
            proc.stop()  # closes its log
            slot.start()
            slot.expected_exit = False
            slot.restart_at = None
            if slot.open_fault is not None:
                slot.open_fault.until = now + STARTUP_GRACE
                slot.open_fault = None


class ChaosRun:
    def __init__(
        self,
        plan: p.Plan,
        workdir: Path,
        *,
        kit: str | None = None,
        say: Callable[[str], None] = print,
        deadline_seconds: float = 3600.0,
        stall_seconds: float = 300.0,
    ) -> None:
        self.plan = plan
        self.workdir = workdir
        self.kit: AgentKit = KITS[kit or default_kit()]
        self.say = stamped(say)
        self.deadline_seconds = deadline_seconds
        # No task became terminal for this long: stop waiting and verify what is there
        # (the tasks still open are the finding), instead of sitting out the deadline.
        self.stall_seconds = stall_seconds
        self._progress = (-1, 0.0)  # (terminal count, when it last changed)
        self.t0 = time.monotonic()
        self.faults: list[FaultRecord] = []
        self.skipped: list[str] = []
        self.supervisor = Supervisor(self.now)
        self.replicas: list[Slot] = []
        self.clock_files: list[Path] = []
        self._stepped: Slot | None = None
        self.last_holder = ""
        self.load: list[float] = [os.getloadavg()[0]]  # 1-minute load average, start and end
        self.cluster: Cluster | None = None
        self.api: client.ApiClient | None = None

    def now(self) -> float:
        return time.monotonic() - self.t0

    # -- the run -------------------------------------------------------------------

    def run(self) -> Verdict:
        logs = self.workdir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        self.cluster = Cluster(self.workdir / "controlplane")
        watcher: TaskWatcher | None = None
        # The harness's own clients retry through the API server restart; their warnings
        # about it would drown the output.
        urllib3_log = logging.getLogger("urllib3")
        urllib3_level = urllib3_log.level
        urllib3_log.setLevel(logging.ERROR)
        try:
            self.say(
                f"chaos: seed {self.plan.seed}, {len(self.plan.tasks)} tasks; starting cluster"
            )
            state = self.cluster.up(build=True, tie_to_parent=True)
            kubectl = state.binaries["kubectl"]
            self._kubectl(kubectl, state.kubeconfig, "apply", "-f", str(CRDS))
            self._kubectl(
                kubectl,
                state.kubeconfig,
                "wait",
                "--for=condition=Established",
                "--timeout=60s",
                "crd/agenttasks.agentq.dev",
                "crd/agentworkers.agentq.dev",
                "crd/agentqueues.agentq.dev",
                "crd/agentbudgets.agentq.dev",
            )
            self._kubectl(kubectl, state.kubeconfig, "create", "namespace", NAMESPACE)
            self.api = config.new_client_from_config(config_file=state.kubeconfig)
            ctx = Context(kubeconfig=state.kubeconfig, namespace=NAMESPACE, logs=logs)
            custom = client.CustomObjectsApi(self.api)
            for w in self.plan.workers:
                custom.create_namespaced_custom_object(
                    GROUP, VERSION, NAMESPACE, "agentworkers", _worker_body(w)
                )
            custom.create_cluster_custom_object(
                GROUP,
                VERSION,
                "agentbudgets",
                budget(p.BUDGET).set("spec.maxConcurrent", self.plan.budget_max_concurrent).obj(),
            )
            # Operators first: forty Python processes importing their libraries at once
            # take a loaded 2-core machine a minute, and the agents can wait for them.
            self._start_replicas(ctx)
            self._wait_leader(240)
            self._start_agents(ctx)
            self.supervisor.start()
            limits = {w.name: w.max_in_flight for w in self.plan.workers}
            watcher = TaskWatcher(
                self.api,
                NAMESPACE,
                limits,
                budgets={t.name: t.budget for t in self.plan.tasks if t.budget},
                budget_limits={p.BUDGET: self.plan.budget_max_concurrent},
                t0=self.t0,
            )
            watcher.start()
            self._wait_workers_ready(custom, 300)
            self.say(f"chaos: fleet ready at {self.now():.0f}s; creating tasks")
            self._create_tasks(custom)
            started = self.now()
            self._fire_faults(watcher)
            self._wait_all_terminal(watcher)
            end = self.now()
            self.say(f"chaos: every task terminal at {end:.0f}s; collecting")
            tasks = custom.list_namespaced_custom_object(GROUP, VERSION, NAMESPACE, "agenttasks")[
                "items"
            ]
            events = [
                self.api.sanitize_for_serialization(e)
                for e in client.CoreV1Api(self.api).list_namespaced_event(NAMESPACE).items
            ]
        finally:
            if watcher is not None:
                watcher.stop()
            self.supervisor.stop()
            if self.api is not None:
                self.api.close()
            self.cluster.down()
            urllib3_log.setLevel(urllib3_level)
        self.load.append(os.getloadavg()[0])
        errors, tracebacks, acquisitions, checks, broken = self._operator_log_counts()
        collected = Collected(
            plan=self.plan,
            kit=self.kit.name,
            reported_reasons=self.kit.reported_reasons,
            tasks=tasks,
            events=events,
            seen=watcher.seen,
            faults=[*self.faults, *self.supervisor.crashes],
            reports=self.kit.reports(ctx),
            sink=self.kit.sink(ctx, [t.name for t in self.plan.tasks]),
            refused_by_sink=self.kit.refused_by_sink(ctx),
            duration=end - started,
            end=end,
            operator_errors=errors,
            operator_tracebacks=tracebacks,
            leader_acquisitions=acquisitions,
            invariant_checks=checks,
            invariant_violations=broken,
            load=tuple(self.load),
            skipped=self.skipped,
        )
        return verify(collected)

    # -- set-up --------------------------------------------------------------------

    @staticmethod
    def _kubectl(kubectl: str, kubeconfig: str, *args: str) -> None:
        subprocess.run(
            [kubectl, "--kubeconfig", kubeconfig, *args],
            check=True,
            capture_output=True,
            timeout=120,
        )

    def _start_agents(self, ctx: Context) -> None:
        delays = list(self.plan.agent_restart_seconds)
        for w in self.plan.workers:
            for role in self.kit.roles:

                def launch(serial: int, w: p.WorkerPlan = w, role: str = role) -> Process:
                    return self.kit.launch(ctx, w, role, serial)

                self.supervisor.add(Slot(f"agent/{w.name}/{role}", launch, delays))

    def _start_replicas(self, ctx: Context) -> None:
        delays = list(self.plan.replica_restart_seconds)
        for i in range(2):
            clock = self.workdir / f"faketime-{i}"
            clock.write_text("+0\n")
            self.clock_files.append(clock)
            env = ctx.env()
            if LIBFAKETIME is not None:
                env.update(
                    LD_PRELOAD=LIBFAKETIME,
                    FAKETIME_TIMESTAMP_FILE=str(clock),
                    FAKETIME_NO_CACHE="1",
                    # An NTP step moves CLOCK_REALTIME only; the monotonic clock goes on.
                    FAKETIME_DONT_FAKE_MONOTONIC="1",
                )

            def launch(serial: int, i: int = i, env: dict[str, str] = env) -> Process:
                args = [
                    AGENTQ,
                    "operator",
                    "--namespace",
                    NAMESPACE,
                    "--leader-namespace",
                    NAMESPACE,
                    "--leader-election",
                    "--leader-lease-seconds",
                    "4",
                    "--reconcile-interval",
                    "1",
                    # The store's indexes compared with the records every 2 s: 0 differences
                    # allowed (verify.py).
                    "--invariant-interval",
                    "2",
                    "--metrics-port",
                    "0",
                ]
                return Process(args, ctx.logs / f"replica-{i}-{serial}.log", env)

            self.replicas.append(self.supervisor.add(Slot(f"replica-{i}", launch, delays)))

    def _create_tasks(self, custom: client.CustomObjectsApi) -> None:
        def create(t: p.TaskPlan) -> None:
            backoff = (0.2, 1.0) if t.poison else (0.5, 5.0)
            builder = (
                task(t.name)
                .namespace(NAMESPACE)
                .requires(*t.requires)
                .cost(t.cost)
                .lease(t.lease_seconds)
                .max_reclaims(t.max_reclaims)
                .backoff(initial=backoff[0], max=backoff[1])
                .payload({"n": int(t.name[1:])})
            )
            body = (builder.budget(t.budget, requests=0) if t.budget else builder).obj()
            custom.create_namespaced_custom_object(GROUP, VERSION, NAMESPACE, "agenttasks", body)

        with ThreadPoolExecutor(max_workers=4) as pool:
            list(pool.map(create, self.plan.tasks))

    # -- waiting -------------------------------------------------------------------

    def _deadline_passed(self) -> bool:
        return self.now() > self.deadline_seconds

    def _stalled(self, done: int) -> bool:
        if done != self._progress[0]:
            self._progress = (done, self.now())
            return False
        return self.now() - self._progress[1] > self.stall_seconds

    def _give_up(self, done: int) -> bool:
        """Deadline passed, or no progress for ``stall_seconds`` (said once)."""
        if self._deadline_passed():
            return True
        if self._stalled(done):
            if "stalled" not in self.skipped:
                self.skipped.append("stalled")
                self.say(
                    f"chaos: no task became terminal for {self.stall_seconds:.0f}s "
                    f"({done}/{len(self.plan.tasks)}); verifying as is"
                )
            return True
        return False

    def _leader(self) -> Slot | None:
        assert self.api is not None
        try:
            lease = client.CoordinationV1Api(self.api).read_namespaced_lease(ELECTION, NAMESPACE)
        except Exception:
            return None
        holder = lease.spec.holder_identity or ""
        self.last_holder = holder
        with self.supervisor.lock:
            for slot in self.replicas:
                if slot.proc is not None and f"-{slot.proc.pid}-" in holder:
                    return slot
        return None

    def _wait_leader(self, timeout: float, *, stable: float = 0.0) -> Slot:
        """The replica that leads, once one has led for ``stable`` seconds without a change
        (so two operator faults never hit one takeover in the middle)."""
        deadline = time.monotonic() + timeout
        since: tuple[Slot, int, float] | None = None
        while True:
            leader = self._leader()
            proc = leader.proc if leader is not None else None
            if leader is None or proc is None or proc.popen.poll() is not None:
                since = None
            elif since is None or since[:2] != (leader, proc.pid):
                since = (leader, proc.pid, time.monotonic())
            if since is not None and time.monotonic() - since[2] >= stable:
                return since[0]
            if time.monotonic() > deadline:
                raise ChaosError(f"no operator replica led steadily within {timeout}s")
            time.sleep(0.2)

    def _wait_workers_ready(self, custom: client.CustomObjectsApi, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            items = custom.list_namespaced_custom_object(GROUP, VERSION, NAMESPACE, "agentworkers")
            ready = [i for i in items["items"] if (i.get("status") or {}).get("phase") == "Ready"]
            if len(ready) == len(self.plan.workers):
                return
            if time.monotonic() > deadline:
                raise ChaosError(f"only {len(ready)} of {len(self.plan.workers)} workers Ready")
            time.sleep(0.5)

    def _wait_progress(self, watcher: TaskWatcher, fraction: float) -> None:
        goal = fraction * len(self.plan.tasks)
        while (done := watcher.seen.terminal()) < goal:
            if self._give_up(done):
                return
            time.sleep(0.25)

    def _wait_all_terminal(self, watcher: TaskWatcher) -> None:
        total = len(self.plan.tasks)
        last = -1
        while True:
            done = watcher.seen.terminal()
            if done >= total or self._give_up(done):
                return
            if done // max(1, total // 10) != last:
                last = done // max(1, total // 10)
                self.say(f"chaos: {done}/{total} terminal at {self.now():.0f}s")
            time.sleep(0.5)

    # -- faults --------------------------------------------------------------------

    def _fire_faults(self, watcher: TaskWatcher) -> None:
        for fault in self.plan.faults:
            self._wait_progress(watcher, fault.at)
            if self._deadline_passed() or "stalled" in self.skipped:
                self.skipped.append(f"{fault.describe()} (not fired: the run stalled or ran out)")
                continue
            self.say(
                f"chaos: {self.now():6.1f}s at {watcher.seen.terminal()} terminal: "
                f"{fault.describe()}"
            )
            self._fire(fault)

    def _fire(self, fault: p.Fault) -> None:
        kind = fault.kind
        if kind in p.AGENT_FAULTS:
            role = self.kit.process_role("sidecar" if kind.startswith("sidecar") else "agent")
            self._agent_fault(fault, self.supervisor.slots[f"agent/{fault.target}/{role}"])
        elif kind in (p.LEADER_KILL, p.LEADER_TERM, p.LEADER_STOP):
            self._leader_fault(fault, self._wait_leader(120, stable=3.0))
        elif kind == p.APISERVER_RESTART:
            self._restart_apiserver(fault)
        elif kind == p.CLOCK_STEP:
            self._clock_step(fault)

    def _agent_fault(self, fault: p.Fault, slot: Slot) -> None:
        with self.supervisor.lock:
            proc = slot.proc
            if proc is None or proc.popen.poll() is not None or slot.restart_at is not None:
                self.skipped.append(f"{fault.describe()} (process down already)")
                return
            record = FaultRecord(fault.kind, fault.target, self.now(), note=f"pid {proc.pid}")
            self.faults.append(record)
            if fault.kind in (p.AGENT_KILL, p.SIDECAR_KILL):
                slot.expected_exit = True
                slot.open_fault = record
                proc.kill()
                return
            proc.signal(signal.SIGSTOP)
        time.sleep(fault.seconds)
        proc.signal(signal.SIGCONT)
        record.until = self.now() + RESUME_GRACE

    def _leader_fault(self, fault: p.Fault, slot: Slot) -> None:
        with self.supervisor.lock:
            proc = slot.proc
            assert proc is not None
            record = FaultRecord(
                fault.kind, slot.name, self.now(), note=f"pid {proc.pid} ({self.last_holder})"
            )
            self.faults.append(record)
            self.say(f"chaos: {fault.kind} hits {slot.name}, pid {proc.pid}")
            if fault.kind == p.LEADER_KILL:
                slot.expected_exit = True
                proc.kill()
                return
            if fault.kind == p.LEADER_TERM:
                slot.expected_exit = True
                proc.signal(signal.SIGTERM)
        if fault.kind == p.LEADER_TERM:
            try:
                proc.popen.wait(timeout=30)
            except subprocess.TimeoutExpired:
                record.note += "; did not exit within 30 s of SIGTERM, killed"
                proc.kill()
            record.until = self.now()
            return
        proc.signal(signal.SIGSTOP)
        time.sleep(fault.seconds)
        proc.signal(signal.SIGCONT)
        record.until = self.now()

    def _restart_apiserver(self, fault: p.Fault) -> None:
        assert self.cluster is not None and self.api is not None
        record = FaultRecord(fault.kind, fault.target, self.now())
        self.faults.append(record)
        self.cluster.restart("kube-apiserver", down_seconds=fault.seconds, timeout=120)
        version = client.VersionApi(self.api)
        deadline = time.monotonic() + 120
        while True:
            with contextlib.suppress(Exception):
                version.get_code(_request_timeout=2)
                break
            if time.monotonic() > deadline:
                raise ChaosError("kube-apiserver did not come back within 120 s")
            time.sleep(0.2)
        record.until = self.now()
        record.note = f"back after {record.until - record.at:.1f}s"

    def _clock_step(self, fault: p.Fault) -> None:
        if LIBFAKETIME is None:
            self.skipped.append(f"{fault.describe()} (libfaketime missing: make system-deps)")
            return
        stepped = fault.target == "stepped"
        slot = self._stepped if stepped else self._wait_leader(120, stable=3.0)
        if slot is None:
            self.skipped.append(f"{fault.describe()} (no clock was stepped before)")
            return
        self._stepped = slot
        index = self.replicas.index(slot)
        self.clock_files[index].write_text(f"{int(fault.seconds):+d}\n")
        self.faults.append(
            FaultRecord(
                fault.kind, slot.name, self.now(), note=f"{slot.name} to {fault.seconds:+.0f}s"
            )
        )

    # -- logs ----------------------------------------------------------------------

    def _operator_log_counts(self) -> tuple[int, int, int, int, int]:
        """ERROR lines, tracebacks, leader acquisitions, invariant checks (at least: each
        replica process says every 100th) and invariant violations."""
        errors = tracebacks = acquisitions = checks = broken = 0
        for log in sorted((self.workdir / "logs").glob("replica-*.log")):
            said = 0
            for line in log.read_text(errors="replace").splitlines():
                if '"level": "ERROR"' in line:
                    errors += 1
                if "Traceback" in line:
                    tracebacks += 1
                if "acquired leadership" in line:
                    acquisitions += 1
                if "invariant violated" in line:
                    broken += 1
                found = re.search(r"invariants: (\d+) checks", line)
                if found:
                    said = int(found.group(1))
            checks += said
        return errors, tracebacks, acquisitions, checks, broken


def _worker_body(w: p.WorkerPlan) -> dict[str, Any]:
    return (
        worker(w.name)
        .namespace(NAMESPACE)
        .capabilities(*w.capabilities)
        .weight(w.weight)
        .max_in_flight(w.max_in_flight)
        .obj()
    )


def log_excerpt(workdir: Path, pattern: str, limit: int = 20) -> list[str]:
    """Lines of the operator logs matching ``pattern`` (for a bug report)."""
    out = []
    for log in sorted((workdir / "logs").glob("replica-*.log")):
        for line in log.read_text(errors="replace").splitlines():
            if pattern in line:
                out.append(f"{log.name}: {line[:400]}")
                if len(out) >= limit:
                    return out
    return out


def main_say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def stamped(say: Callable[[str], None]) -> Callable[[str], None]:
    """``say`` with the UTC wall time first, to line the harness up with the logs."""

    def out(text: str) -> None:
        say(f"{time.strftime('%H:%M:%S', time.gmtime())} {text}")

    return out
