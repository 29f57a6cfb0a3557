"""``agentq operator``: run the operator. Its options are made from OperatorConfig's
fields (config.py): one flag and one ``AGENTQ_*`` environment variable each; flags
override environment variables, which override the defaults."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import typing
from collections.abc import Callable
from typing import Any

import click

from agentq import jsonlog
from agentq.clicktypes import FiniteFloatRange
from agentq.operator.config import (
    OperatorConfig,
    env_name,
    flag_name,
    flag_of,
    settings,
    shown_default,
)

_Decorator = Callable[[Callable[..., Any]], Callable[..., Any]]


class _CommaList(click.types.StringParamType):
    """A repeatable flag whose environment variable is a comma-separated list."""

    envvar_list_splitter = ","


def _value_type(annotation: Any, field: dataclasses.Field[Any]) -> click.ParamType[Any]:
    flag = flag_of(field)
    if flag.choices:
        return click.Choice(flag.choices)
    base = next((a for a in typing.get_args(annotation) if a is not type(None)), annotation)
    if base is int:
        return click.IntRange(
            min=None if flag.at_least is None else int(flag.at_least),
            max=None if flag.at_most is None else int(flag.at_most),
        )
    if base is float:
        low = flag.at_least if flag.above is None else flag.above
        return FiniteFloatRange(min=low, max=flag.at_most, min_open=flag.above is not None)
    return click.STRING


def _option(field: dataclasses.Field[Any], annotation: Any) -> _Decorator:
    """The click option of one OperatorConfig field. Its default is None (not given): the
    dataclass default then applies, so it is written in one place."""
    name, flag = flag_name(field), flag_of(field)
    common: dict[str, Any] = {
        "envvar": env_name(field.name),
        "show_envvar": True,
        "default": None,
        "help": f"{flag.help} [default: {shown_default(field)}]",
    }
    if annotation is bool:
        negative = "--no-" + name.removeprefix("--")
        return click.option(f"{name}/{negative}", field.name, **common)
    if typing.get_origin(annotation) is tuple:
        common["default"] = ()
        return click.option(name, field.name, multiple=True, type=_CommaList(), **common)
    return click.option(name, field.name, type=_value_type(annotation, field), **common)


def _with_settings(command: Callable[..., Any]) -> Callable[..., Any]:
    hints = typing.get_type_hints(OperatorConfig)
    # click lists options in the order they were applied, last first.
    for field in reversed(settings()):
        command = _option(field, hints[field.name])(command)
    return command


def config_from(values: dict[str, Any]) -> OperatorConfig:
    """The config of the options given (None or an empty list: not given)."""
    given = {name: value for name, value in values.items() if value is not None and value != ()}
    if "namespaces" in given:
        given["namespaces"] = tuple(n for n in given["namespaces"] if n)
    return OperatorConfig(**given)


@click.command()
@_with_settings
@click.option(
    "--log-level",
    default="INFO",
    show_default=True,
    envvar=env_name("log_level"),
    show_envvar=True,
    type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"]),
    help="logs are JSON lines on stderr",
)
def operator(log_level: str, **values: Any) -> None:
    """Run the agentq operator against the current kubeconfig (or in-cluster account)."""
    jsonlog.setup(log_level)
    logging.getLogger("kopf").setLevel(max(logging.WARNING, logging.getLevelName(log_level)))
    config = config_from(values)
    try:
        config.check()
    except ValueError as err:
        raise click.UsageError(str(err)) from err
    from agentq.operator.main import run

    asyncio.run(run(config))
