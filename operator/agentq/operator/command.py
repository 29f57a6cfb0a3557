"""``agentq operator``: run the operator (flags override environment variables)."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import Any

import click

from agentq import jsonlog
from agentq.operator.config import OperatorConfig

# The one place defaults live; the help text shows them rather than restating them.
_DEFAULTS = OperatorConfig()


@click.command()
@click.option(
    "--max-reclaims",
    type=click.IntRange(min=0),
    help=f"MAX_RECLAIMS [default: {_DEFAULTS.max_reclaims}]",
)
@click.option(
    "--default-lease-seconds",
    type=click.IntRange(min=1),
    help=f"DEFAULT_LEASE_SECONDS [default: {_DEFAULTS.default_lease_seconds}]",
)
@click.option(
    "--reconcile-interval",
    type=click.FloatRange(min=0.1),
    help=f"RECONCILE_INTERVAL seconds [default: {_DEFAULTS.reconcile_interval}]",
)
@click.option(
    "--namespace",
    "namespaces",
    multiple=True,
    help="Namespace to watch (repeatable); NAMESPACES; default: all",
)
@click.option(
    "--metrics-port",
    type=click.IntRange(min=0),
    help=f"METRICS_PORT [default: {_DEFAULTS.metrics_port}]; 0 disables",
)
@click.option(
    "--leader-election/--no-leader-election", default=None, help="LEADER_ELECTION [default: on]"
)
@click.option(
    "--leader-namespace", help=f"LEADER_NAMESPACE [default: {_DEFAULTS.leader_namespace}]"
)
@click.option(
    "--leader-lease-seconds",
    type=click.FloatRange(min=1),
    help=f"LEADER_LEASE_SECONDS [default: {_DEFAULTS.leader_lease_seconds}]",
)
@click.option(
    "--watcher",
    type=click.Choice(["informer", "kopf"]),
    help="WATCHER: the watch machinery [default: informer; see docs/operator.md]",
)
@click.option(
    "--log-level",
    default="INFO",
    show_default=True,
    type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"]),
)
def operator(log_level: str, **flags: Any) -> None:
    """Run the agentq operator against the current kubeconfig (or in-cluster account)."""
    jsonlog.setup(log_level)
    logging.getLogger("kopf").setLevel(max(logging.WARNING, logging.getLevelName(log_level)))
    values: dict[str, Any] = OperatorConfig.env_defaults()
    for name, value in flags.items():
        if value is None or value == ():
            continue
        values[name] = tuple(value) if name == "namespaces" else value
    fields = {f.name for f in dataclasses.fields(OperatorConfig)}
    config = OperatorConfig(**{k: v for k, v in values.items() if k in fields})
    try:
        config.check()
    except ValueError as err:
        raise click.UsageError(str(err)) from err
    from agentq.operator.main import run

    asyncio.run(run(config))
