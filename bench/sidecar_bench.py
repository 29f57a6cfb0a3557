"""Benchmark of the heartbeat sidecar on a real control plane; writes its section of
docs/benchmarks.md.

Measures, with real processes (kube-apiserver, operator, sidecar, agent-sim):

1. API requests per renewal per task: a sidecar holds ``--tasks`` claims whose agent
   (agent-sim, ``hold``) beats; over ``--window`` seconds the API server's own
   ``apiserver_request_total`` for Leases (all verbs that read or write one object)
   is compared with the renewals the sidecar made (its worker-Lease renewals are
   subtracted). The operator is stopped for the window, so every Lease request in
   it is the sidecar's. The sidecar's own counter is reported beside it.
2. Heartbeat-to-renewal latency: (a) the sidecar's histogram of "due (and the agent
   had beaten) -> the API server's answer" over all renewals of the window; (b) the
   first heartbeat of an attempt -> the Lease renewed, seen by a reader of the API
   server, for ``--probes`` claims of a second worker whose agent is this script.
3. The sidecar's resident memory (VmRSS) with 0 and with ``--tasks`` held claims.

usage: .venv/bin/python bench/sidecar_bench.py [--tasks 50] [--window 60]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import docsection
from kubernetes import client, config
from kubernetes.client.rest import ApiException

from agentq import GROUP, VERSION, agentsim, protocol
from agentq.agent import Assignment, SidecarClient
from agentq.controlplane import Cluster
from agentq.controlplane.cluster import free_port

ROOT = Path(__file__).resolve().parents[1]
BEGIN = "<!-- BEGIN sidecar benchmark (bench/sidecar_bench.py) -->"
END = "<!-- END sidecar benchmark -->"


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def get_json(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url, timeout=10) as response:
        body: dict[str, Any] = json.loads(response.read())
        return body


def get_text(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return str(response.read().decode())


def lease_requests(bench: Bench) -> dict[str, float]:
    """apiserver_request_total for one-object Lease requests, by "VERB CODE"."""
    text = subprocess.run(
        [bench.kubectl, "get", "--raw", "/metrics"],
        env=bench.env,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith("apiserver_request_total{"):
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}")[0]))
        if labels.get("resource") != "leases" or labels.get("scope") != "resource":
            continue
        key = f"{labels.get('verb', '')} {labels.get('code', '')}"
        out[key] = out.get(key, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def writes_ok(counts: dict[str, float]) -> float:
    return sum(
        n
        for key, n in counts.items()
        if key.split()[0] in ("PUT", "POST") and key.split()[1].startswith("2")
    )


def histogram(metrics_text: str, name: str) -> tuple[dict[float, float], float, float]:
    buckets: dict[float, float] = {}
    total = count = 0.0
    for line in metrics_text.splitlines():
        if line.startswith(f"{name}_bucket{{"):
            le = re.search(r'le="([^"]+)"', line)
            assert le is not None
            buckets[float(le.group(1))] = float(line.rsplit(" ", 1)[1])
        elif line.startswith(f"{name}_sum"):
            total = float(line.rsplit(" ", 1)[1])
        elif line.startswith(f"{name}_count"):
            count = float(line.rsplit(" ", 1)[1])
    return buckets, total, count


def quantile_bound(buckets: dict[float, float], count: float, q: float) -> float:
    """The upper bound of the bucket holding quantile ``q`` (counts are cumulative)."""
    for le in sorted(buckets):
        if buckets[le] >= q * count:
            return le
    return float("inf")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class Bench:
    def __init__(self, workdir: Path, kubeconfig: str, kubectl: str) -> None:
        self.workdir = workdir
        self.kubectl = kubectl
        self.kubeconfig = kubeconfig
        self.namespace = "bench"
        self.api = config.new_client_from_config(config_file=kubeconfig)
        self.custom = client.CustomObjectsApi(self.api)
        self.leases = client.CoordinationV1Api(self.api)
        self.procs: list[subprocess.Popen[bytes]] = []
        self.env = {**os.environ, "KUBECONFIG": kubeconfig, "PYTHONUNBUFFERED": "1"}

    def spawn(self, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        log = open(self.workdir / f"{name}.log", "ab")  # noqa: SIM115 - the child keeps it
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=self.env)
        log.close()
        self.procs.append(proc)
        return proc

    def stop(self, proc: subprocess.Popen[bytes]) -> None:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def close(self) -> None:
        for proc in reversed(self.procs):
            self.stop(proc)
        self.api.close()

    def add(self, plural: str, body: dict[str, Any]) -> None:
        self.custom.create_namespaced_custom_object(GROUP, VERSION, self.namespace, plural, body)

    def tasks(self) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = self.custom.list_namespaced_custom_object(
            GROUP, VERSION, self.namespace, "agenttasks"
        )["items"]
        return items

    def wait(self, what: str, predicate: Any, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                raise SystemExit(f"timed out waiting for {what}")
            time.sleep(0.5)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=50)
    parser.add_argument("--lease", type=int, default=9, help="task lease seconds")
    parser.add_argument("--window", type=float, default=60.0)
    parser.add_argument("--probes", type=int, default=10)
    parser.add_argument("--output", type=Path, default=ROOT / "docs" / "benchmarks.md")
    args = parser.parse_args(argv)
    started = time.monotonic()
    workdir = Path(tempfile.mkdtemp(prefix="agentq-sidecar-bench-"))
    cluster = Cluster(workdir / "controlplane")
    state = cluster.up(build=True, tie_to_parent=True, say=lambda s: print(s, flush=True))
    bench = Bench(workdir, state.kubeconfig, state.binaries["kubectl"])
    try:
        subprocess.run(
            [state.binaries["kubectl"], "apply", "-f", str(ROOT / "crds")],
            env=bench.env,
            check=True,
            capture_output=True,
        )
        subprocess.run(
            [
                state.binaries["kubectl"],
                "wait",
                "--for=condition=Established",
                "--timeout=60s",
                "crd/agenttasks.agentq.dev",
                "crd/agentworkers.agentq.dev",
                "crd/agentqueues.agentq.dev",
                "crd/agentbudgets.agentq.dev",
            ],
            env=bench.env,
            check=True,
            capture_output=True,
        )
        client.CoreV1Api(bench.api).create_namespace({"metadata": {"name": bench.namespace}})
        results = run(bench, args)
    finally:
        bench.close()
        cluster.down()
    shutil.rmtree(workdir, ignore_errors=True)  # kept only when the run failed (its logs)
    command = " ".join([".venv/bin/python", "bench/sidecar_bench.py", *(argv or sys.argv[1:])])
    section = render(results, args, command, time.monotonic() - started)
    write_section(args.output, section)
    print(section)
    print(f"wrote {args.output}")
    return 0


def run(bench: Bench, args: argparse.Namespace) -> dict[str, Any]:
    # The API server renews Leases of its own (its identity Lease in kube-system):
    # measure that background on the idle cluster and subtract it, scaled to the window.
    idle_seconds = min(30.0, args.window)
    idle_before = lease_requests(bench)
    time.sleep(idle_seconds)
    idle_after = lease_requests(bench)
    idle = sum(idle_after.values()) - sum(idle_before.values())
    background = idle * args.window / idle_seconds
    port, metrics_port = free_port(), free_port()
    held = SidecarClient(
        f"http://127.0.0.1:{port}", token_file=bench.workdir / "sidecar-token-held"
    )
    sidecar_argv, agent_argv = agentsim.pair_commands(
        worker="held",
        namespace=bench.namespace,
        port=port,
        token_file=held.token_file,
        metrics_port=metrics_port,
        behaviour="hold",
        kubeconfig=bench.kubeconfig,
        identity="held-pod",
        sidecar_flags={"capabilities": "bench", "max_in_flight": args.tasks},
    )
    sidecar = bench.spawn("sidecar-held", sidecar_argv)
    # Health and metrics on the sidecar's own port for them (no secret needed there).
    url = f"http://127.0.0.1:{metrics_port}"
    bench.wait("the sidecar", lambda: _up(url))
    time.sleep(2)
    rss_idle = rss_kib(sidecar.pid)
    agent = bench.spawn("agent-held", agent_argv)
    probe_port, probe_metrics_port = free_port(), free_port()
    probe_token = bench.workdir / "sidecar-token-probe"
    probe_argv, _ = agentsim.pair_commands(
        worker="probe",
        namespace=bench.namespace,
        port=probe_port,
        token_file=str(probe_token),
        metrics_port=probe_metrics_port,
        kubeconfig=bench.kubeconfig,
        identity="probe-pod",
        sidecar_flags={"capabilities": "probe", "max_in_flight": args.probes},
    )
    bench.spawn("sidecar-probe", probe_argv)
    probe_url = f"http://127.0.0.1:{probe_port}"
    bench.wait("the probe sidecar", lambda: _up(f"http://127.0.0.1:{probe_metrics_port}"))
    bench.wait("the AgentWorkers", lambda: _workers(bench) == 2)
    operator = bench.spawn(
        "operator",
        [
            str(Path(sys.executable).with_name("agentq")),
            "operator",
            "--namespace",
            bench.namespace,
            "--metrics-port",
            "0",
            "--reconcile-interval",
            "0.5",
            "--leader-namespace",
            bench.namespace,
        ],
    )
    for i in range(args.tasks):
        bench.add("agenttasks", _task(f"held-{i:03d}", "bench", args.lease))
    for i in range(args.probes):
        bench.add("agenttasks", _task(f"probe-{i:03d}", "probe", 30))

    def phases(prefix: str, phase: str) -> int:
        return sum(
            1
            for t in bench.tasks()
            if t["metadata"]["name"].startswith(prefix)
            and (t.get("status") or {}).get("phase") == phase
        )

    bench.wait("all held tasks Running", lambda: phases("held-", "Running") == args.tasks)
    bench.wait("all probe tasks Assigned", lambda: phases("probe-", "Assigned") == args.probes)

    # (2b) first heartbeat -> the Lease renewed, as a reader of the API server sees it.
    probe = SidecarClient(probe_url, token_file=probe_token)
    first_beat: list[float] = []
    for assignment in _assignments(probe, args.probes):
        lease_name = protocol.task_lease_name(assignment.task)
        before = bench.leases.read_namespaced_lease(lease_name, bench.namespace).spec.renew_time
        sent = time.monotonic()
        probe.heartbeat(assignment.task, assignment.token, "first")
        while True:
            now = bench.leases.read_namespaced_lease(lease_name, bench.namespace)
            if now.spec.renew_time != before:
                first_beat.append(time.monotonic() - sent)
                break
            time.sleep(0.002)
    bench.stop(operator)  # from here on, every Lease request is a sidecar's
    time.sleep(3)

    # (1) requests per renewal over the window, and (3) RSS with the claims held.
    server_before = lease_requests(bench)
    held_before = held.request("GET", "/v1/status")
    probe_before = probe.request("GET", "/v1/status")
    metrics_before = get_text(f"{url}/metrics")
    time.sleep(args.window)
    server_after = lease_requests(bench)
    held_after = held.request("GET", "/v1/status")
    probe_after = probe.request("GET", "/v1/status")
    metrics_after = get_text(f"{url}/metrics")
    rss_held = rss_kib(sidecar.pid)

    def delta(key: str) -> int:
        return int(held_after[key] - held_before[key]) + int(probe_after[key] - probe_before[key])

    keys = set(server_before) | set(server_after)
    by_code = {k: server_after.get(k, 0) - server_before.get(k, 0) for k in sorted(keys)}
    by_code = {k: n for k, n in by_code.items() if n}
    renewals = delta("renewals")
    worker_renewals = delta("workerLeaseRenewals")
    all_requests = sum(by_code.values())
    ok_writes = writes_ok(server_after) - writes_ok(server_before)
    _, req_sum_0, req_count_0 = histogram(metrics_before, "agentq_sidecar_renewal_api_requests")
    _, req_sum_1, req_count_1 = histogram(metrics_after, "agentq_sidecar_renewal_api_requests")
    buckets, total, count = histogram(metrics_after, "agentq_sidecar_renewal_latency_seconds")
    return {
        "tasks": args.tasks,
        "lease": args.lease,
        "window": args.window,
        "renewals": renewals,
        "worker_renewals": worker_renewals,
        "server_by_code": by_code,
        "server_lease_requests": all_requests,
        "server_ok_writes": ok_writes,
        "background": background,
        "per_write_server": all_requests / max(1.0, ok_writes),
        "per_renewal_sidecar": (req_sum_1 - req_sum_0) / max(1.0, req_count_1 - req_count_0),
        "renewals_per_task_minute": renewals / args.tasks / (args.window / 60),
        "latency_count": count,
        "latency_mean_ms": 1000 * total / max(1, count),
        "latency_p50_ms": 1000 * quantile_bound(buckets, count, 0.5),
        "latency_p99_ms": 1000 * quantile_bound(buckets, count, 0.99),
        "first_beat_ms": [1000 * x for x in first_beat],
        "rss_idle_kib": rss_idle,
        "rss_held_kib": rss_held,
        "agent_rss_kib": rss_kib(agent.pid),
    }


def _up(url: str) -> bool:
    try:
        return get_json(f"{url}/readyz").get("status") == "ready"
    except OSError:
        return False


def _workers(bench: Bench) -> int:
    try:
        items = bench.custom.list_namespaced_custom_object(
            GROUP, VERSION, bench.namespace, "agentworkers"
        )["items"]
    except ApiException:
        return 0
    return len(items)


def _assignments(probe: SidecarClient, n: int) -> list[Assignment]:
    deadline = time.monotonic() + 60
    while True:
        _, items = probe.list()
        if len(items) >= n or time.monotonic() > deadline:
            return items
        time.sleep(0.2)


def _task(name: str, capability: str, lease: int) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "AgentTask",
        "metadata": {"name": name},
        "spec": {"requiredCapabilities": [capability], "leaseDurationSeconds": lease},
    }


def render(r: dict[str, Any], args: argparse.Namespace, command: str, seconds: float) -> str:
    first = r["first_beat_ms"]
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    codes = ", ".join(f"{k}: {int(n)}" for k, n in r["server_by_code"].items())
    hb = r["lease"] / 3
    return "\n".join(
        [
            BEGIN,
            "## Heartbeat sidecar: requests per renewal, latency, memory",
            "",
            f"One sidecar holds {r['tasks']} claims (lease {r['lease']} s, so a renewal every "
            f"{hb:g} s each) for an agent-sim that beats; a second sidecar holds "
            f"{args.probes} claims for this script. Real kube-apiserver, real processes.",
            "",
            "| measure | value |",
            "|---|--:|",
            f"| renewals in the {r['window']:g} s window | {r['renewals']} "
            f"({r['renewals_per_task_minute']:.1f} per task per minute) |",
            f"| Lease requests at the API server in the window (apiserver_request_total, "
            f"by verb and code) | {int(r['server_lease_requests'])} ({codes}) |",
            f"| of them successful writes | {int(r['server_ok_writes'])}: {r['renewals']} task "
            f"renewals + {r['worker_renewals']} worker-Lease renewals + "
            f"~{r['background']:.0f} of the API server's own Leases (the sidecars' counts are "
            "read a moment after the API server's, so the sum is off by a few) |",
            f"| **API requests per Lease write** (API server's count: all requests / "
            f"successful writes) | **{r['per_write_server']:.3f}** |",
            f"| API requests per task renewal (the sidecar's per-renewal histogram) | "
            f"{r['per_renewal_sidecar']:.3f} |",
            f"| renewal latency, due and beaten -> API answer: mean / p50 / p99 (bucket bound) | "
            f"{r['latency_mean_ms']:.1f} / <= {r['latency_p50_ms']:.0f} / "
            f"<= {r['latency_p99_ms']:.0f} ms ({int(r['latency_count'])} renewals) |",
            f"| first heartbeat of an attempt -> Lease renewed, seen by a reader: "
            f"median / max | {percentile(first, 0.5):.1f} / {max(first):.1f} ms "
            f"({len(first)} attempts) |",
            f"| sidecar RSS, no claims / {r['tasks']} held claims | "
            f"{r['rss_idle_kib'] / 1024:.1f} / {r['rss_held_kib'] / 1024:.1f} MiB |",
            f"| agent-sim RSS with {r['tasks']} claims ({r['tasks']} work threads + "
            f"{r['tasks']} heartbeat threads) | {r['agent_rss_kib'] / 1024:.1f} MiB |",
            "",
            "A renewal is one replace (PUT) carrying the resourceVersion of the sidecar's last "
            "write; the Lease is read again only after a 409. Later heartbeats ride on the "
            "renewal cadence (one per heartbeat interval), so a progress marker reaches the "
            "Lease within one heartbeat interval plus the latency above; the first heartbeat "
            "of an attempt is renewed at once (that is what marks the task Running).",
            "",
            "Measured with:",
            "",
            "```",
            command,
            "```",
            "",
            f"- machine: {platform.machine()}, {os.cpu_count()} CPUs, {platform.system()} "
            f"{platform.release()}; Python {platform.python_version()}",
            f"- load average at the end: {load} (other work may have been running)",
            f"- whole benchmark: {seconds:.0f} s",
            END,
            "",
        ]
    )


def write_section(path: Path, section: str) -> None:
    docsection.write_section(path, BEGIN, END, section)


if __name__ == "__main__":
    raise SystemExit(main())
