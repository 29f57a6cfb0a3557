"""``agentq requeue``: ask the operator to redrive a Held, DeadLettered or Failed task.

The operator is the only writer of AgentTask status, so this command does not
touch the status: it sets the ``agentq.dev/requeue`` annotation to a fresh
request id, and the operator moves the task back to Pending (with a fresh
failure budget, and a new fencing token at its next grant) and records the id
in ``status.requeueHandled`` so each request is honoured once.
"""

from __future__ import annotations

import datetime
import uuid

import click
from kubernetes import client, config
from kubernetes.client.rest import ApiException

from agentq import GROUP, VERSION, protocol

REQUEUABLE = ("Held", "DeadLettered", "Failed")


@click.command()
@click.argument("tasks", nargs=-1, required=True)
@click.option("-n", "--namespace", default=None, help="Namespace [default: the kubeconfig's]")
def requeue(tasks: tuple[str, ...], namespace: str | None) -> None:
    """Redrive TASKS (AgentTask names) that are Held, DeadLettered or Failed."""
    try:
        config.load_kube_config()
    except config.ConfigException as err:
        raise click.ClickException(f"no usable kubeconfig: {err}") from err
    if namespace is None:
        _, context = config.list_kube_config_contexts()
        namespace = (context.get("context") or {}).get("namespace") or "default"
    custom = client.CustomObjectsApi()
    failed = False
    for name in tasks:
        try:
            task = custom.get_namespaced_custom_object(
                GROUP, VERSION, namespace, "agenttasks", name
            )
        except ApiException as err:
            click.echo(f"agenttask/{name}: {err.reason} ({err.status})", err=True)
            failed = True
            continue
        phase = (task.get("status") or {}).get("phase")
        if phase not in REQUEUABLE:
            click.echo(
                f"agenttask/{name} is {phase or 'new'}; only {', '.join(REQUEUABLE)} "
                "tasks can be requeued",
                err=True,
            )
            failed = True
            continue
        stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%SZ")
        request = f"{stamp}-{uuid.uuid4().hex[:8]}"
        custom.patch_namespaced_custom_object(
            GROUP,
            VERSION,
            namespace,
            "agenttasks",
            name,
            {"metadata": {"annotations": {protocol.ANNOTATION_REQUEUE: request}}},
        )
        click.echo(f"agenttask/{name} requeue requested ({request}; was {phase})")
    if failed:
        raise SystemExit(1)
