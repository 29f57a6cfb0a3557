"""A scripted agent: one process standing in for an agent pod (sidecar and agent) by
writing Leases directly.

Superseded by ``agentq sidecar`` + ``agentq agent-sim`` (``agentq.agentsim.pair_commands``),
which the integration tests use. Kept only while ``agentq.demo`` still starts it;
remove it when the demo has switched.

It renews its worker Lease (``agentq-worker-<name>``), finds the task Leases the
operator granted to it, and behaves as told for each attempt:

- ``complete``: renew with progress, then report Succeeded after ``--work-seconds``
- ``fail``:     report a retryable failure after ``--work-seconds``
- ``fatal``:    report a non-retryable failure after ``--work-seconds``
- ``hold``:     renew (with progress) forever, never report
- ``hang``:     keep the worker Lease, never renew a task Lease (a hung agent)
- ``stuck``:    renew task Leases forever but never change progress (a busy loop)

An API error (the API server restarting) is logged and retried with backoff,
as a real agent's sidecar would; it never ends the process.

Every write goes through ``agentq.holder`` (compare-and-swap on the Lease). The
test kills it with SIGKILL or freezes it with SIGSTOP like a real pod.

usage: python -m agentq.scripted_agent --kubeconfig K --namespace NS --worker W --behaviour B
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from kubernetes import client, config

from agentq import protocol
from agentq.holder import LeaseLost, renew_task_lease, renew_worker_lease, write_report


def command(
    *, kubeconfig: str, namespace: str, worker: str, behaviour: str, **options: float
) -> list[str]:
    """The argv that starts a scripted agent in a new process (options: ``work_seconds``...)."""
    argv = [
        sys.executable,
        "-m",
        "agentq.scripted_agent",
        "--kubeconfig",
        kubeconfig,
        "--namespace",
        namespace,
        "--worker",
        worker,
        "--behaviour",
        behaviour,
    ]
    for key, value in options.items():
        argv += [f"--{key.replace('_', '-')}", str(value)]
    return argv


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kubeconfig", default=None, help="default: in-cluster, else ~/.kube")
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--worker", required=True)
    parser.add_argument(
        "--behaviour",
        default="complete",
        choices=["complete", "fail", "fatal", "hold", "hang", "stuck"],
    )
    parser.add_argument("--work-seconds", type=float, default=0.5)
    parser.add_argument("--beat-seconds", type=float, default=0.5)
    parser.add_argument("--worker-lease-seconds", type=int, default=4)
    args = parser.parse_args()

    if args.kubeconfig:
        api = config.new_client_from_config(config_file=args.kubeconfig)
    else:
        try:
            config.load_incluster_config()
        except config.ConfigException:
            config.load_kube_config()
        api = client.ApiClient()
    leases = client.CoordinationV1Api(api)
    identity = f"{args.worker}-agent"
    started: dict[tuple[str, int], float] = {}
    done: set[tuple[str, int]] = set()
    selector = f"{protocol.LABEL_LEASE_KIND}=task,{protocol.LABEL_WORKER}={args.worker}"
    print(json.dumps({"started": args.worker, "behaviour": args.behaviour}), flush=True)
    delay = args.beat_seconds
    while True:
        try:
            beat(args, leases, identity, started, done, selector)
            delay = args.beat_seconds
        except Exception as err:  # the API server is away (restarting): back off, go on
            print(json.dumps({"api_error": f"{type(err).__name__}: {err}"[:300]}), flush=True)
            delay = min(max(delay * 2, 0.2), 5.0)
        time.sleep(delay)


def beat(
    args: argparse.Namespace,
    leases: client.CoordinationV1Api,
    identity: str,
    started: dict[tuple[str, int], float],
    done: set[tuple[str, int]],
    selector: str,
) -> None:
    """One round: renew the worker Lease, then act on each task Lease granted to us."""
    renew_worker_lease(
        leases,
        args.namespace,
        args.worker,
        identity=identity,
        duration_seconds=args.worker_lease_seconds,
    )
    for lease in leases.list_namespaced_lease(args.namespace, label_selector=selector).items:
        token = protocol.lease_token(lease.metadata.annotations)
        task = (lease.metadata.labels or {}).get(protocol.LABEL_TASK)
        if token is None or task is None or lease.spec.holder_identity != args.worker:
            continue
        attempt = (task, token)
        if attempt in done or args.behaviour == "hang":
            continue
        first = started.setdefault(attempt, time.monotonic())
        elapsed = time.monotonic() - first
        try:
            if args.behaviour in ("complete", "fail", "fatal") and elapsed >= args.work_seconds:
                write_report(leases, args.namespace, task, _report(args, token))
                done.add(attempt)
                print(json.dumps({"reported": task, "token": token}), flush=True)
                continue
            progress = None if args.behaviour == "stuck" else f"step-{int(elapsed * 10)}"
            renew_task_lease(
                leases,
                args.namespace,
                task,
                worker=args.worker,
                token=token,
                progress=progress,
            )
        except LeaseLost as lost:
            done.add(attempt)
            print(json.dumps({"lost": task, "token": token, "why": str(lost)}), flush=True)


def _report(args: argparse.Namespace, token: int) -> protocol.Report:
    if args.behaviour == "complete":
        return protocol.Report(
            token=token, worker=args.worker, outcome="Succeeded", result={"by": args.worker}
        )
    return protocol.Report(
        token=token,
        worker=args.worker,
        outcome="Failed",
        error=protocol.ErrorInfo(
            reason="AgentError", message="scripted failure", retryable=args.behaviour == "fail"
        ),
    )


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        sys.exit(0)
