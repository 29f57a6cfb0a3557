"""The ``agentq`` command line (also installed as ``kubectl-agentq``).

Only argument parsing lives here; each command group is defined next to the
code it drives and registered below, imported lazily so that ``agentq --help``
stays fast and a missing optional dependency breaks only its own command.
Commands of other distributions (``agentq cluster`` and ``agentq simulate`` come
with agentq-dev) register themselves in the ``agentq.commands`` entry-point group.
"""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points

import click

from agentq import __version__

# command name -> "module:attribute" of a click command or group.
_COMMANDS: dict[str, str] = {
    "explain": "agentq.ops.commands:explain",
    "top": "agentq.ops.commands:top",
    "drain": "agentq.ops.commands:drain",
    "uncordon": "agentq.ops.commands:uncordon",
    "operator": "agentq.operator.command:operator",
    "requeue": "agentq.requeue:requeue",
    "submit": "agentq.ops.tasks:submit",
    "wait": "agentq.ops.tasks:wait_command",
    "cancel": "agentq.ops.tasks:cancel",
    "sidecar": "agentq.sidecar.command:sidecar",
    "agent-sim": "agentq.agentsim:agent_sim",
}
ENTRY_POINTS = "agentq.commands"
# Named when asked for without agentq-dev installed (the image, a plain pip install).
_DEV_COMMANDS = ("cluster", "simulate")


def _plugins() -> dict[str, str]:
    """The commands other installed distributions register (name -> "module:attribute")."""
    return {ep.name: ep.value for ep in entry_points(group=ENTRY_POINTS)}


class _LazyGroup(click.Group):
    """A click group whose subcommands are imported only when used."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *_COMMANDS, *_plugins()})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = _COMMANDS.get(cmd_name) or _plugins().get(cmd_name)
        if target is None:
            return super().get_command(ctx, cmd_name)
        module_name, _, attribute = target.partition(":")
        command = getattr(importlib.import_module(module_name), attribute)
        assert isinstance(command, click.Command)
        return command

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        if args and args[0] in _DEV_COMMANDS and self.get_command(ctx, args[0]) is None:
            ctx.fail(
                f"'agentq {args[0]}' comes with agentq-dev, the development tools, which "
                "are not installed here: in a checkout of agentq, 'make venv' installs them"
            )
        return super().resolve_command(ctx, args)


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="agentq")
def main() -> None:
    """agentq: a fair-share task queue for fleets of AI agents on Kubernetes."""


if __name__ == "__main__":
    main()
