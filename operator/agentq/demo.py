"""``make demo``: agentq's main job on the embedded control plane, end to end.

Brings the control plane up (building it the first time), installs the CRDs,
starts the operator and three scripted agents as processes, submits a backlog
of tasks of mixed cost, then injects the failures agentq exists to beat: an
agent killed with SIGKILL mid-task (its tasks are reclaimed and re-dispatched)
and a poison task (dead-lettered after maxReclaims + 1 attempts). It prints
`kubectl get` views and the cost share of each worker against its weight, then stops
every process it started (by pid); ``--keep`` leaves the cluster up to explore.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import click
import yaml

from agentq import scripted_agent
from agentq.controlplane import Cluster, ClusterError

NAMESPACE = "agentq-demo"
REPO = Path(__file__).resolve().parents[2]
WORKERS = {  # name: (capabilities, weight)
    "small": (["llm"], 1),
    "medium": (["llm"], 2),
    "large": (["llm", "gpu"], 4),
}


def _say(text: str) -> None:
    click.secho(text, fg="cyan", bold=True)


class Demo:
    def __init__(self, kubeconfig: str, kubectl: str, logs: Path) -> None:
        self.env = {**os.environ, "KUBECONFIG": kubeconfig, "PYTHONUNBUFFERED": "1"}
        self.kubeconfig = kubeconfig
        self.kubectl_path = kubectl
        self.logs = logs
        self.procs: list[subprocess.Popen[bytes]] = []

    def kubectl(self, *args: str, input: str | None = None, check: bool = True) -> str:
        done = subprocess.run(
            [self.kubectl_path, *args],
            input=input,
            capture_output=True,
            text=True,
            env=self.env,
            timeout=120,
            check=False,
        )
        if check and done.returncode != 0:
            raise click.ClickException(f"kubectl {' '.join(args)}: {done.stderr.strip()}")
        return done.stdout

    def spawn(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        log = open(self.logs / f"{name}.log", "ab")  # noqa: SIM115 - the child keeps it
        proc = subprocess.Popen(
            [*args], stdout=log, stderr=subprocess.STDOUT, env=self.env, stdin=subprocess.DEVNULL
        )
        log.close()
        self.procs.append(proc)
        return proc

    def agent(
        self, worker: str, behaviour: str = "complete", work: float = 1.0
    ) -> subprocess.Popen[bytes]:
        argv = scripted_agent.command(
            kubeconfig=self.kubeconfig,
            namespace=NAMESPACE,
            worker=worker,
            behaviour=behaviour,
            work_seconds=work,
        )
        return self.spawn(f"agent-{worker}", *argv)

    def apply(self, objects: list[dict[str, Any]]) -> None:
        self.kubectl("apply", "-n", NAMESPACE, "-f", "-", input=yaml.safe_dump_all(objects))

    def tasks(self) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = json.loads(
            self.kubectl("get", "agenttasks", "-n", NAMESPACE, "-o", "json")
        )["items"]
        return items

    def stop(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGCONT)
                proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _task(name: str, cost: float, requires: list[str], **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "agentq.dev/v1alpha1",
        "kind": "AgentTask",
        "metadata": {"name": name},
        "spec": {
            "requiredCapabilities": requires,
            "cost": cost,
            "leaseDurationSeconds": 6,
            "payload": {"prompt": f"do {name}"},
            **spec,
        },
    }


@click.command()
@click.option("--keep", is_flag=True, help="Leave the control plane running at the end.")
@click.option("--tasks", "count", default=42, show_default=True, help="Backlog size.")
def main(keep: bool, count: int) -> None:
    cluster = Cluster()
    state = cluster.load()
    started_here = False
    if state is None or not all(cluster.running(state).values()):
        _say("1. starting the embedded control plane (etcd, kube-apiserver, controller manager)")
        try:
            state = cluster.up(say=lambda line: click.echo(f"   {line}"))
        except ClusterError as err:
            raise click.ClickException(str(err)) from err
        started_here = True
    else:
        _say(f"1. reusing the running control plane at {state.server}")
    logs = Path(state.state_dir) / "demo-logs"
    logs.mkdir(exist_ok=True)
    demo = Demo(state.kubeconfig, state.binaries["kubectl"], logs)
    try:
        run(demo, count)
    finally:
        demo.stop()
        if started_here and not keep:
            _say("stopping the control plane (use --keep to explore it afterwards)")
            cluster.down()
        elif keep or not started_here:
            click.echo(
                f'\nexplore it:  eval "$(agentq cluster env)"; kubectl get agentq -n {NAMESPACE}'
            )
            click.echo("stop it:     make demo-down")


def run(demo: Demo, count: int) -> None:
    _say("2. installing the AgentTask and AgentWorker CRDs")
    demo.kubectl("apply", "-f", str(REPO / "crds"))
    demo.kubectl(
        "wait",
        "--for=condition=Established",
        "crd/agenttasks.agentq.dev",
        "crd/agentworkers.agentq.dev",
        "--timeout=60s",
    )
    demo.kubectl("delete", "namespace", NAMESPACE, "--ignore-not-found", "--wait=true")
    demo.kubectl("create", "namespace", NAMESPACE)

    _say("3. three workers, weights 1 : 2 : 4 (capacity 2 : 4 : 8), each with an agent process")
    demo.apply(
        [
            {
                "apiVersion": "agentq.dev/v1alpha1",
                "kind": "AgentWorker",
                "metadata": {"name": name},
                "spec": {"capabilities": caps, "weight": weight, "maxInFlight": 2 * weight},
            }
            for name, (caps, weight) in WORKERS.items()
        ]
    )
    agents = {name: demo.agent(name, work=0.8) for name in WORKERS}
    demo.spawn(
        "operator",
        sys.executable,
        "-m",
        "agentq.cli",
        "operator",
        "--namespace",
        NAMESPACE,
        "--metrics-port",
        "0",
        "--reconcile-interval",
        "1",
        "--no-leader-election",
        "--max-reclaims",
        "2",
    )

    _say(f"4. a backlog of {count} tasks of cost 1-3 and one gpu-only task")
    backlog = [_task(f"task-{i:03d}", 1 + i % 3, ["llm"]) for i in range(count)]
    backlog.append(_task("render-gpu", 2, ["gpu"]))
    demo.apply(backlog)
    wait_settled(demo)
    click.echo(demo.kubectl("get", "agenttasks", "-n", NAMESPACE))
    click.echo(demo.kubectl("get", "agentworkers", "-n", NAMESPACE, "-o", "wide"))
    fairness(demo.tasks())

    _say("5. faults: a poison task, and the 'large' agent killed (SIGKILL) mid-task")
    demo.apply(
        [
            {
                "apiVersion": "agentq.dev/v1alpha1",
                "kind": "AgentWorker",
                "metadata": {"name": "flaky"},
                "spec": {"capabilities": ["flaky"]},
            }
        ]
    )
    demo.agent("flaky", behaviour="fail", work=0.3)
    demo.apply(
        [
            _task(
                "poison",
                1,
                ["flaky"],
                maxReclaims=2,
                retryBackoff={"initialSeconds": 0.5, "maxSeconds": 2},
            )
        ]
    )
    victim = agents["large"]
    demo.apply([_task(f"late-{i:02d}", 1, ["llm"]) for i in range(12)])
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not any(
        (t.get("status") or {}).get("worker") == "large"
        and t["metadata"]["name"].startswith("late-")
        for t in demo.tasks()
    ):
        time.sleep(0.1)
    os.kill(victim.pid, signal.SIGKILL)
    victim.wait()
    click.echo("   killed the 'large' agent; its claims' leases now run out (6 s)")
    wait_settled(demo)
    click.echo(demo.kubectl("get", "agenttasks", "-n", NAMESPACE, "--sort-by=.status.reclaims"))
    items = demo.tasks()
    reclaimed = [t for t in items if (t.get("status") or {}).get("reclaims")]
    for t in reclaimed:
        history = t["status"].get("history") or []
        path = " -> ".join(f"{h.get('worker')}({h.get('reason')})" for h in history)
        click.echo(
            f"   {t['metadata']['name']}: {path or '-'} -> {t['status'].get('worker') or '-'}"
            f"  [{t['status']['phase']}]"
        )


def wait_settled(demo: Demo, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        items = demo.tasks()
        phases = Counter((t.get("status") or {}).get("phase", "new") for t in items)
        click.echo(f"   {dict(sorted(phases.items()))}")
        if all(
            (t.get("status") or {}).get("phase") in ("Succeeded", "DeadLettered") for t in items
        ):
            return
        time.sleep(2)


def fairness(items: list[dict[str, Any]]) -> None:
    served: Counter[str] = Counter()
    for t in items:
        st = t.get("status") or {}
        if st.get("phase") == "Succeeded" and t["spec"]["requiredCapabilities"] == ["llm"]:
            served[st.get("worker") or "?"] += t["spec"]["cost"]
    total = sum(served.values())
    weight_total = sum(w for _, w in WORKERS.values())
    click.echo(f"   {'worker':<8} {'weight share':>12} {'cost share':>10}")
    for name, (_, weight) in WORKERS.items():
        share = served[name] / total if total else 0.0
        click.echo(f"   {name:<8} {weight / weight_total:>12.2f} {share:>10.2f}")


if __name__ == "__main__":
    main()
