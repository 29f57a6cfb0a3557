"""The ``agentq`` command line (also installed as ``kubectl-agentq``).

Only argument parsing lives here; each command group is defined next to the
code it drives and registered below, imported lazily so that ``agentq --help``
stays fast and a missing optional dependency breaks only its own command.
"""

from __future__ import annotations

import importlib

import click

from agentq import __version__

# command name -> "module:attribute" of a click command or group.
_COMMANDS: dict[str, str] = {
    "cluster": "agentq.controlplane.command:cluster",
    "explain": "agentq.ops.commands:explain",
    "top": "agentq.ops.commands:top",
    "drain": "agentq.ops.commands:drain",
    "uncordon": "agentq.ops.commands:uncordon",
    "simulate": "agentq.simulation.command:simulate",
    "operator": "agentq.operator.command:operator",
    "requeue": "agentq.requeue:requeue",
    "sidecar": "agentq.sidecar.command:sidecar",
    "agent-sim": "agentq.agentsim:agent_sim",
}


class _LazyGroup(click.Group):
    """A click group whose subcommands are imported only when used."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *_COMMANDS})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = _COMMANDS.get(cmd_name)
        if target is None:
            return super().get_command(ctx, cmd_name)
        module_name, _, attribute = target.partition(":")
        command = getattr(importlib.import_module(module_name), attribute)
        assert isinstance(command, click.Command)
        return command


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="agentq")
def main() -> None:
    """agentq: a fair-share task queue for fleets of AI agents on Kubernetes."""


if __name__ == "__main__":
    main()
