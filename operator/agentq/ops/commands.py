"""The click commands ``explain``, ``top``, ``drain`` and ``uncordon`` (``requeue`` is in
``agentq.requeue``): argument parsing and the order of calls, nothing else.

Every verb takes the kubectl-style ``-n/--namespace``, ``--kubeconfig`` and
``--context``, and data verbs ``-o text|json|yaml``. Errors print
``error: <what happened and what to do>`` on stderr and exit with a code from
``agentq.ops.errors.Exit``.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import re
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, ParamSpec, TypeVar

import click
from rich.console import Group, RenderableType
from rich.live import Live
from rich.text import Text

from agentq.clicktypes import FiniteFloatRange
from agentq.clock import parse_time
from agentq.models import ModelError
from agentq.ops import explain as explaining
from agentq.ops import fleet, render
from agentq.ops.errors import Exit, OpsError
from agentq.ops.kube import Body, Cluster

P = ParamSpec("P")
R = TypeVar("R")

EXIT_CODES_HELP = (
    "Exit codes: 0 ok; 1 not everything was done (refused, conflicting); 2 bad arguments; "
    "3 no usable cluster (no kubeconfig, unreachable, CRDs missing); 4 not found (or "
    "deleted while waited on); 5 timed out; 6 a task Failed or DeadLettered; 7 a task "
    "was Cancelled; 130 interrupted (Ctrl-C; what was sent stays sent). Several at once: "
    "the first of 3, 1, 4, 6, 7, 5."
)


def handles_errors(command: Callable[P, R]) -> Callable[P, R]:
    """Print an ``OpsError`` as ``error: ...`` and exit with its code; Ctrl-C as one line
    and 130 (not a traceback, nor click's "Aborted!" and 1)."""

    @functools.wraps(command)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return command(*args, **kwargs)
        except OpsError as err:
            click.echo(f"error: {err}", err=True)
            sys.exit(int(err.code))
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            sys.exit(int(Exit.INTERRUPTED))

    return wrapper


MIN_RATE = 0.001  # one write every 1,000 s
MAX_RATE = 1_000_000.0
# --rate PER_SECOND: at least one write every 1,000 s (1e-300 is an interval no clock
# holds), and a number.
RATE = FiniteFloatRange(min=MIN_RATE, max=MAX_RATE)


def cluster_options(command: Callable[P, R]) -> Callable[P, R]:
    """``-n/--namespace``, ``--kubeconfig``, ``--context``: as kubectl spells them."""
    command = click.option(
        "--context", metavar="NAME", help="kubeconfig context [default: the current one]"
    )(command)
    command = click.option(
        "--kubeconfig",
        metavar="FILE",
        help="kubeconfig file [default: $KUBECONFIG, ~/.kube/config, else in-cluster]",
    )(command)
    command = click.option(
        "-n",
        "--namespace",
        metavar="NS",
        help="namespace [default: the context's, else 'default']",
    )(command)
    return command


def output_option(command: Callable[P, R]) -> Callable[P, R]:
    return click.option(
        "-o",
        "--output",
        type=click.Choice(render.FORMATS),
        default="text",
        show_default=True,
        help="text for people; json or yaml for scripts",
    )(command)


def connect(kubeconfig: str | None, context: str | None, namespace: str | None) -> Cluster:
    return Cluster.connect(kubeconfig=kubeconfig, context=context, namespace=namespace)


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


class Duration(click.ParamType):  # type: ignore[type-arg]
    """``90``, ``90s``, ``5m``, ``1h30m`` -> seconds."""

    name = "duration"
    _PART = re.compile(r"(\d+(?:\.\d+)?)([hms]?)")

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> float:
        if isinstance(value, int | float):
            return float(value)
        text = str(value).strip()
        total, pos = 0.0, 0
        for match in self._PART.finditer(text):
            if match.start() != pos:
                break
            number, unit = float(match.group(1)), match.group(2) or "s"
            total += number * {"h": 3600, "m": 60, "s": 1}[unit]
            pos = match.end()
        if pos != len(text) or not text:
            self.fail(f"{value!r} is not a duration (examples: 90, 90s, 5m, 1h30m)", param, ctx)
        return total


# --- explain --------------------------------------------------------------------------------


@click.command(epilog=EXIT_CODES_HELP)
@click.argument("task")
@cluster_options
@output_option
@handles_errors
def explain(
    task: str, namespace: str | None, kubeconfig: str | None, context: str | None, output: str
) -> None:
    """Why TASK (an AgentTask) is where it is, with its attempts and events.

    It names the reason: waiting out a retry backoff (until when), unschedulable
    (which capabilities no worker offers), no Ready worker with a free slot (and
    why each capable worker is not), assigned but not started, held,
    dead-lettered (after which failures), reports refused from zombie holders,
    a requeue not yet honoured; each with the command that acts on it. For a task
    in an AgentQueue (spec.queue): why the queue does not admit it, or its
    position in the queue and whether the queue is at its cap or over its share.

    \b
      agentq explain summarise-42 -n agents
      agentq explain summarise-42 -o json | jq -r '.findings[].code'
    """
    cluster = connect(kubeconfig, context, namespace)
    body = cluster.task(task)
    ns = str(body["metadata"].get("namespace") or cluster.namespace)
    workers = cluster.workers(ns)
    events = cluster.events_of(body)
    status = body.get("status")
    status = status if isinstance(status, dict) else {}
    phase = status.get("phase")
    claimed = phase in ("Assigned", "Running", "Held")
    lease = cluster.task_lease(body) if claimed else None
    holders_known = True
    worker_ns = status.get("workerNamespace")
    if claimed and isinstance(worker_ns, str) and worker_ns and worker_ns != ns:
        # A claim across namespaces: its holder is a worker of the pool's namespace.
        pool = cluster.workers_if_readable(worker_ns)
        holders_known = pool is not None
        workers = pool or []
    ahead, place, queues = None, None, None
    budgets: list[Body] | None = None
    named_queue = bool((body.get("spec") or {}).get("queue"))
    if phase in (None, "Pending"):
        views = explaining.parse_workers(workers)
        listed = cluster.tasks(ns)
        try:
            ahead = explaining.pending_ahead(body, listed, views)
            place = explaining.queue_place(body, listed)
        except ModelError:
            pass  # explain() below says the task cannot be read
        if named_queue:
            queues = cluster.queues()  # None: forbidden; explain says what it cannot show
        if (body.get("spec") or {}).get("budgets"):
            budgets = cluster.budgets()  # None: forbidden; their status is not shown
    try:
        result = explaining.explain(
            body,
            workers=workers,
            events=events,
            lease=lease,
            now=_now(),
            pending_ahead=ahead,
            queue_place=place,
            queues=queues,
            budgets=budgets,
            holders_known=holders_known,
        )
    except ModelError as err:
        raise OpsError(f"agenttask {task!r} cannot be read: {err}") from err
    if output == "text":
        render.console().print(render.explanation(result))
    else:
        render.emit(result.to_dict(), output)


# --- top ------------------------------------------------------------------------------------


def _snapshot(
    cluster: Cluster, all_namespaces: bool
) -> tuple[list[Body], list[Body], list[Body] | None, list[Body]]:
    """Tasks, workers, the AgentQueues (cluster-scoped: the same whatever -n; None when
    listing them is forbidden) and the AgentBudgets (none shown when forbidden)."""
    return (
        cluster.tasks(all_namespaces=all_namespaces),
        cluster.workers(all_namespaces=all_namespaces),
        cluster.queues(),
        cluster.budgets() or [],
    )


@click.command(epilog=EXIT_CODES_HELP)
@cluster_options
@click.option("-A", "--all-namespaces", is_flag=True, help="every namespace")
@click.option(
    "--once", is_flag=True, help="print one snapshot and exit (the default when not on a terminal)"
)
@click.option(
    "--interval",
    type=click.FloatRange(min=0.5),
    default=2.0,
    show_default=True,
    help="seconds between refreshes",
)
@output_option
@handles_errors
def top(
    namespace: str | None,
    kubeconfig: str | None,
    context: str | None,
    all_namespaces: bool,
    once: bool,
    interval: float,
    output: str,
) -> None:
    """The fleet live: each worker's share of the served cost against its share of the
    weight, deficit, in flight / maxInFlight and readiness; the queue per required
    capability set (pending, in backoff, oldest, workers that could take it, free
    slots); tasks per phase; and, when AgentQueues exist, each queue's weight share,
    share, pending, in flight / maxInFlight, served cost and, in the live view, an
    estimated wait.

    WEIGHT SHARE is the worker's weight over the Ready workers' total; SERVED SHARE
    its part of all cost served so far; LAST MINUTE (live view) its part of the cost
    served in the last minute, which tracks WEIGHT SHARE while every worker is busy.
    A queue's EST. WAIT is its pending tasks' cost over the cost it was served per
    second in the last minute (live view only: it needs two samples).
    Ctrl-C leaves the live view.

    \b
      agentq top -n agents            # live, refreshing every 2 s
      agentq top -A --once            # one snapshot of every namespace
      agentq top -o json | jq '.workers[] | {name, servedShare, weightShare}'
    """
    cluster = connect(kubeconfig, context, namespace)
    tasks, workers, queues, budgets = _snapshot(cluster, all_namespaces)
    if output != "text":
        view = fleet.build(tasks, workers, now=_now(), agent_queues=queues, agent_budgets=budgets)
        render.emit(view.to_dict(), output)
        return
    out = render.console()
    if once or not out.is_terminal:
        view = fleet.build(tasks, workers, now=_now(), agent_queues=queues, agent_budgets=budgets)
        out.print(render.fleet(view, show_namespace=all_namespaces))
        return
    window = fleet.ShareWindow(60.0)
    window.add_workers(time.monotonic(), workers)
    rates = fleet.RateWindow(60.0)
    rates.add(time.monotonic(), queues or ())
    where = "all namespaces" if all_namespaces else f"namespace {cluster.namespace}"
    trouble = ""

    def frame() -> RenderableType:
        view = fleet.build(
            tasks,
            workers,
            now=_now(),
            recent=window.shares(),
            agent_queues=queues,
            queue_rates=rates.rates(),
            agent_budgets=budgets,
        )
        title = Text.assemble(
            (f"agentq top · {where} · {cluster.server}", "bold"),
            f" · every {interval:g}s · Ctrl-C to quit",
            (f"\n{trouble}", "red") if trouble else "",
        )
        return Group(title, render.fleet(view, show_namespace=all_namespaces, live=True))

    with ctrl_c() as quit_asked:
        try:
            with Live(frame(), console=out, refresh_per_second=4, screen=False) as live:
                while not quit_asked.wait(interval):
                    try:
                        tasks, workers, queues, budgets = _snapshot(cluster, all_namespaces)
                        window.add_workers(time.monotonic(), workers)
                        rates.add(time.monotonic(), queues or ())
                        trouble = ""
                    except OpsError as err:  # keep the last view; say why it is stale
                        trouble = f"stale: {err}"
                    live.update(frame())
        except KeyboardInterrupt:  # a second Ctrl-C, while a request was in flight
            return


@contextlib.contextmanager
def ctrl_c() -> Iterator[threading.Event]:
    """The first Ctrl-C (SIGINT) sets the event: the live loop ends at its next step and
    the view is closed in order. A KeyboardInterrupt raised at an arbitrary point could
    land inside the terminal library's locked output, and the view would not close; a
    second Ctrl-C raises it anyway (a request that hangs)."""
    asked = threading.Event()

    def handler(signum: int, frame: Any) -> None:
        if asked.is_set():
            raise KeyboardInterrupt
        asked.set()

    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield asked
    finally:
        signal.signal(signal.SIGINT, previous)


# --- drain / uncordon ------------------------------------------------------------------------


def _claims(tasks: list[Body], worker: str) -> tuple[list[Body], list[Body]]:
    """(tasks whose claim the worker holds, Held tasks that name it)."""
    held_by = [t for t in tasks if (t.get("status") or {}).get("worker") == worker]
    active = [t for t in held_by if t["status"].get("phase") in ("Assigned", "Running")]
    held = [t for t in held_by if t["status"].get("phase") == "Held"]
    return sorted(active, key=_task_name), sorted(held, key=_task_name)


def _task_name(task: Body) -> str:
    return str(task["metadata"]["name"])


def _claim_dict(task: Body, now: datetime.datetime) -> dict[str, Any]:
    status = task.get("status") or {}
    since = parse_time(status.get("assignedAt"))
    return {
        "name": _task_name(task),
        "phase": status.get("phase"),
        "attempt": status.get("attempt"),
        "fencingToken": status.get("fencingToken"),
        "heldForSeconds": round((now - since).total_seconds(), 1) if since else None,
        "progress": status.get("progress"),
    }


@click.command(epilog=EXIT_CODES_HELP)
@click.argument("worker")
@cluster_options
@click.option(
    "--wait", is_flag=True, help="wait until the tasks it holds end (completed or reclaimed)"
)
@click.option(
    "--timeout",
    type=Duration(),
    default="10m",
    show_default=True,
    help="how long --wait waits (90, 90s, 5m, 1h); then exit 5 listing what is still held",
)
@output_option
@handles_errors
def drain(
    worker: str,
    namespace: str | None,
    kubeconfig: str | None,
    context: str | None,
    wait: bool,
    timeout: float,
    output: str,
) -> None:
    """Take WORKER (an AgentWorker) out of dispatch for maintenance.

    Sets spec.paused: the operator assigns it no new task (phase Draining) and its
    weight leaves the fair-share computation; the tasks it holds keep running and
    keep their leases. With --wait, waits until they have ended. Prints what it
    still holds. `agentq uncordon WORKER` undoes it.

    \b
      agentq drain gpu-pool-1 -n agents --wait --timeout 15m && kubectl delete pod ...
    """
    cluster = connect(kubeconfig, context, namespace)
    before = cluster.worker(worker)
    ns = str(before["metadata"].get("namespace") or cluster.namespace)
    was_paused = bool((before.get("spec") or {}).get("paused", False))
    if not was_paused:
        cluster.set_paused(worker, True, ns)
    started = time.monotonic()
    active, held = _claims(cluster.tasks(ns), worker)
    text = output == "text"
    if text:
        already = " (it was already paused)" if was_paused else ""
        click.echo(f"agentworker/{worker} cordoned: no new tasks go to it{already}")
    shown = -1
    while wait and active and time.monotonic() - started < timeout:
        if text and len(active) != shown:
            shown = len(active)
            click.echo(f"waiting for {shown} task(s) to end: {', '.join(map(_task_name, active))}")
        time.sleep(min(1.0, max(0.0, timeout - (time.monotonic() - started))))
        active, held = _claims(cluster.tasks(ns), worker)
    now = _now()
    drained = not active
    report: dict[str, Any] = {
        "namespace": ns,
        "worker": worker,
        "paused": True,
        "wasPaused": was_paused,
        "drained": drained,
        "waitedSeconds": round(time.monotonic() - started, 1) if wait else 0.0,
        "holding": [_claim_dict(t, now) for t in active],
        "held": [_task_name(t) for t in held],
    }
    if text:
        if drained:
            click.echo(f"agentworker/{worker} holds no claims: it is drained")
        else:
            click.echo(f"agentworker/{worker} still holds {len(active)} claim(s):")
            for claim in report["holding"]:
                age = claim["heldForSeconds"]
                click.echo(
                    f"  {claim['name']}  {claim['phase']}  attempt {claim['attempt']}"
                    f"  token {claim['fencingToken']}"
                    + (f"  for {explaining.human_seconds(age)}" if age is not None else "")
                    + (f"  progress {claim['progress']!r}" if claim["progress"] else "")
                )
        if held:
            click.echo(
                f"{len(held)} Held task(s) name it and wait for a person: "
                f"{', '.join(report['held'])} (`agentq explain TASK -n {ns}`)"
            )
    else:
        render.emit(report, output)
    if wait and not drained:
        if text:
            click.echo(
                f"error: timed out after {explaining.human_seconds(timeout)} with claims still "
                "held; wait longer, or stop the agent and let the leases expire",
                err=True,
            )
        sys.exit(int(Exit.TIMEOUT))


@click.command(epilog=EXIT_CODES_HELP)
@click.argument("worker")
@cluster_options
@output_option
@handles_errors
def uncordon(
    worker: str, namespace: str | None, kubeconfig: str | None, context: str | None, output: str
) -> None:
    """Let WORKER (an AgentWorker) take new tasks again (clears spec.paused).

    \b
      agentq uncordon gpu-pool-1 -n agents
    """
    cluster = connect(kubeconfig, context, namespace)
    before = cluster.worker(worker)
    ns = str(before["metadata"].get("namespace") or cluster.namespace)
    was_paused = bool((before.get("spec") or {}).get("paused", False))
    after = cluster.set_paused(worker, False, ns) if was_paused else before
    phase = (after.get("status") or {}).get("phase")
    if output != "text":
        render.emit(
            {"namespace": ns, "worker": worker, "paused": False, "wasPaused": was_paused}, output
        )
        return
    note = "" if was_paused else " (it was not paused)"
    click.echo(f"agentworker/{worker} uncordoned: it takes new tasks again{note}")
    if phase == "NotReady":
        click.echo(
            "note: it is NotReady: it gets tasks once its agent's sidecar renews its Lease "
            "(`agentq explain` on a Pending task says more)"
        )
