"""``agentq requeue``: redrive Held, DeadLettered, Failed or Cancelled tasks, like SQS's
redrive.

The operator is the only writer of AgentTask status, so this command does not
touch the status: it sets the ``agentq.dev/requeue`` annotation to a fresh
request id (a merge patch carrying the resourceVersion it read, so it never
acts on stale evidence), and the operator moves the task back to Pending (with
a fresh failure budget, and a new fencing token at its next grant) and records
the id in ``status.requeueHandled`` so each request is honoured once.

Selection (``agentq.ops.redrive``) and pacing are pure; the API calls go through
``agentq.ops.kube``.
"""

from __future__ import annotations

import datetime
import sys
import time
from collections.abc import Mapping
from typing import Any

import click

from agentq.ops.commands import EXIT_CODES_HELP, RATE, cluster_options, connect, handles_errors
from agentq.ops.errors import Exit, OpsError
from agentq.ops.kube import Body, Cluster
from agentq.ops.redrive import (
    REQUEUABLE,
    Pacer,
    Selection,
    Skipped,
    key_of,
    phase_of,
    refusal,
    request_id,
    select,
)
from agentq.ops.render import FORMATS, emit

__all__ = ["REQUEUABLE", "requeue"]


def _by_name(cluster: Cluster, names: tuple[str, ...]) -> tuple[Selection, list[str]]:
    selection = Selection(matched=len(names))
    missing = []
    for name in dict.fromkeys(names):  # each once, in the order given
        try:
            task = cluster.task(name)
        except OpsError as err:
            if err.code is not Exit.NOT_FOUND:
                raise
            missing.append(name)
            continue
        why = refusal(task)
        if why is None:
            selection.chosen.append(task)
        else:
            namespace, _ = key_of(task)
            selection.skipped.append(Skipped(namespace, name, phase_of(task), why))
    return selection, missing


def _send(cluster: Cluster, task: Mapping[str, Any]) -> tuple[Body | None, str]:
    """Request a requeue of ``task``; on a conflict re-read once and decide again.

    Returns (the request's record, "") or (None, why it was not sent).
    """
    for _ in range(2):
        request = request_id(datetime.datetime.now(datetime.UTC))
        updated = cluster.request_requeue(task, request)
        if updated is not None:
            namespace, name = key_of(task)
            return {
                "namespace": namespace,
                "name": name,
                "phase": phase_of(task),
                "request": request,
            }, ""
        namespace, name = key_of(task)
        task = cluster.task(name, namespace)  # changed since we read it: look again
        why = refusal(task)
        if why is not None:
            return None, f"it changed meanwhile: {why}"
    return None, "it kept changing while we wrote (conflicts); try again"


@click.command(epilog=EXIT_CODES_HELP)
@click.argument("tasks", nargs=-1)
@click.option(
    "-l", "--selector", metavar="SELECTOR", help="label selector, as kubectl: team=nlp,tier!=batch"
)
@click.option(
    "--all-dead-lettered",
    is_flag=True,
    help="every DeadLettered task of the namespace (-A: of all; with -l: those matching)",
)
@click.option(
    "-A", "--all-namespaces", is_flag=True, help="with -l / --all-dead-lettered: every namespace"
)
@click.option(
    "--rate",
    type=RATE,
    default=None,
    metavar="PER_SECOND",
    help="at most this many requeues per second [default: as fast as the API server takes them]",
)
@click.option("--dry-run", is_flag=True, help="say which tasks would be requeued; change nothing")
@cluster_options
@click.option(
    "-o",
    "--output",
    type=click.Choice(FORMATS),
    default="text",
    show_default=True,
    help="text for people; json or yaml for scripts",
)
@handles_errors
def requeue(
    tasks: tuple[str, ...],
    selector: str | None,
    all_dead_lettered: bool,
    all_namespaces: bool,
    rate: float | None,
    dry_run: bool,
    namespace: str | None,
    kubeconfig: str | None,
    context: str | None,
    output: str,
) -> None:
    """Redrive Held, DeadLettered, Failed or Cancelled tasks: back to Pending with a fresh
    failure budget (a new fencing token at the next grant); a cancel is undone.

    Choose the tasks by NAME, by label selector (-l: the requeuable ones among the
    matches), or with --all-dead-lettered. It prints how many and which,
    then one line per request. Fix the cause first: a poison task dead-letters again.

    \b
      agentq requeue summarise-42 -n agents
      agentq requeue -l team=nlp --dry-run
      agentq requeue --all-dead-lettered --rate 5
    """
    listing = selector is not None or all_dead_lettered
    if tasks and listing:
        raise click.UsageError("give task names, or -l/--all-dead-lettered, not both")
    if not tasks and not listing:
        raise click.UsageError(
            "which tasks? give NAMEs, -l SELECTOR or --all-dead-lettered "
            "(`kubectl get agenttasks` lists them)"
        )
    if all_namespaces and not listing:
        raise click.UsageError("-A/--all-namespaces goes with -l or --all-dead-lettered")
    cluster = connect(kubeconfig, context, namespace)
    missing: list[str] = []
    if tasks:
        selection, missing = _by_name(cluster, tasks)
    else:
        phases = ("DeadLettered",) if all_dead_lettered else REQUEUABLE
        selection = select(
            cluster.tasks(all_namespaces=all_namespaces, selector=selector), phases=phases
        )
    where = "all namespaces" if all_namespaces else f"namespace {cluster.namespace}"
    text = output == "text"
    say = click.echo if text else (lambda *_a, **_k: None)
    for name in missing:
        click.echo(f"error: agenttask {name!r} not found in {where}", err=True)
    for skip in selection.skipped:
        click.echo(f"error: agenttask/{skip.name} not requeued: {skip.reason}", err=True)

    names = [key_of(t)[1] for t in selection.chosen]
    what = "DeadLettered" if all_dead_lettered else "requeuable"
    if listing:
        say(
            f"{len(names)} {what} task(s) of {selection.matched} matched in {where}"
            + (f": {', '.join(names)}" if names else "")
        )
    pace = f" at {rate:g}/s" if rate else ""
    requested: list[dict[str, Any]] = []
    if dry_run:
        say(f"dry run: would requeue {len(names)} task(s){pace}; nothing changed")
    elif names:
        say(f"requeueing {len(names)} task(s){pace}")
        pacer = Pacer(rate, clock=time.monotonic, sleep=time.sleep)
        for task in selection.chosen:
            pacer.wait()
            record, why = _send(cluster, task)
            namespace_, name = key_of(task)
            if record is None:
                selection.skipped.append(Skipped(namespace_, name, phase_of(task), why))
                click.echo(f"error: agenttask/{name} not requeued: {why}", err=True)
                continue
            requested.append(record)
            say(f"agenttask/{name} requeued (was {record['phase']}; request {record['request']})")
        say(f"requeued {len(requested)} of {len(names)}")
    if not text:
        emit(
            {
                "dryRun": dry_run,
                "rate": rate,
                "matched": selection.matched,
                "selected": [
                    {"namespace": key_of(t)[0], "name": key_of(t)[1], "phase": phase_of(t)}
                    for t in selection.chosen
                ],
                "requested": requested,
                "skipped": [s.to_dict() for s in selection.skipped],
                "missing": missing,
            },
            output,
        )
    if missing:
        sys.exit(int(Exit.NOT_FOUND))
    if selection.skipped:
        sys.exit(int(Exit.PARTIAL))
