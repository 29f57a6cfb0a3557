"""Operator settings: a flag and an AGENTQ_* environment variable for every field (flags
override variables, which override defaults), and docs/operator.md in step with them."""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import subprocess
import sys
import typing
from pathlib import Path
from typing import Any
from unittest.mock import patch

import click
import pytest
from click.testing import CliRunner

from agentq.operator import command
from agentq.operator.config import OperatorConfig, env_name, flag_name, flag_of, shown_default


def _config(args: list[str], env: dict[str, str] | None = None) -> OperatorConfig:
    """The config ``agentq operator ARGS`` runs with, ENV set (the command's own parsing)."""
    seen: list[OperatorConfig] = []

    async def run(config: OperatorConfig) -> None:
        seen.append(config)

    kopf_level = logging.getLogger("kopf").level
    with patch("agentq.operator.main.run", run), patch.object(command.jsonlog, "setup"):
        done = CliRunner().invoke(command.operator, args, env=env or {}, catch_exceptions=False)
    logging.getLogger("kopf").setLevel(kopf_level)
    assert done.exit_code == 0, done.output
    return seen[-1]


def test_environment_overrides_defaults_and_flags_override_both() -> None:
    env = {
        "AGENTQ_MAX_RECLAIMS": "7",
        "AGENTQ_NAMESPACES": "a,,b",
        "AGENTQ_LEADER_ELECTION": "false",
        "AGENTQ_RECONCILE_INTERVAL": "0.25",
        "AGENTQ_LEADER_RENEW_SECONDS": "3.5",
    }
    config = _config([], env)
    assert config.max_reclaims == 7
    assert config.namespaces == ("a", "b")
    assert config.leader_election is False
    assert config.reconcile_interval == 0.25
    assert config.leader_renew_seconds == 3.5
    flagged = _config(["--max-reclaims", "5", "--namespace", "c", "--leader-election"], env)
    assert (flagged.max_reclaims, flagged.namespaces, flagged.leader_election) == (5, ("c",), True)
    defaults = _config([])
    assert defaults == OperatorConfig(identity=defaults.identity)


def test_every_setting_has_a_flag_and_an_environment_variable() -> None:
    """OperatorConfig said every field had a flag and an environment variable: 10 of 26
    had a flag. Each field now gets both, made from its name."""
    options = {p.name: p for p in command.operator.params if isinstance(p, click.Option)}
    hints = typing.get_type_hints(OperatorConfig)
    for field in dataclasses.fields(OperatorConfig):
        option = options.pop(field.name)
        assert option.envvar == "AGENTQ_" + field.name.upper(), field.name
        assert option.opts[0] == flag_name(field), field.name
        # Each is given for real, by flag and by variable, and lands in its field.
        value = _example(field, hints[field.name])
        text = ",".join(value) if isinstance(value, tuple) else str(value).lower()
        by_env = _config([], {option.envvar: text})
        assert getattr(by_env, field.name) == value, field.name
        if isinstance(value, bool):
            args = [option.opts[0] if value else option.secondary_opts[0]]
        elif isinstance(value, tuple):
            args = [a for v in value for a in (option.opts[0], v)]
        else:
            args = [option.opts[0], str(value)]
        assert getattr(_config(args), field.name) == value, field.name
    assert set(options) == {"log_level"}


def _example(field: dataclasses.Field[Any], annotation: Any) -> Any:
    """A valid value unlike the default."""
    flag = flag_of(field)
    if flag.choices:
        return next(c for c in flag.choices if c != field.default)
    base = next((a for a in typing.get_args(annotation) if a is not type(None)), annotation)
    if base is bool:
        return not field.default
    if base is int:
        return (field.default or 0) + 1
    if base is float:
        return 3.5 if field.name != "leader_retry_seconds" else 1.5
    if typing.get_origin(annotation) is tuple:
        return ("ns-a", "ns-b")
    return f"x-{field.name.replace('_', '-')}"


def test_the_documented_settings_are_the_real_ones_with_their_defaults() -> None:
    """docs/operator.md's Configuration table: one row per setting, with its flag, its
    variable and its default as the command shows them."""
    rows = {}
    text = (Path(__file__).resolve().parents[3] / "docs" / "operator.md").read_text()
    section = text.split("## Configuration", 1)[1].split("\n## ", 1)[0]
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[1].startswith("`AGENTQ_"):
            env = re.findall(r"`(AGENTQ_\w+)`", cells[1])[0]
            rows[env] = (re.findall(r"`(--[\w-]+)", cells[0])[0], cells[2])
    expected = {
        env_name(f.name): (flag_name(f), shown_default(f))
        for f in dataclasses.fields(OperatorConfig)
    }
    expected["AGENTQ_LOG_LEVEL"] = ("--log-level", "INFO")
    assert rows == expected


def test_no_setting_is_dead() -> None:
    """default_lease_seconds was read by nothing: every field is read somewhere."""
    source = Path(command.__file__).resolve().parents[1]
    code = "\n".join(p.read_text() for p in source.rglob("*.py") if p.name != "command.py")
    for field in dataclasses.fields(OperatorConfig):
        assert re.search(rf"\.{field.name}\b", code), f"{field.name} is read by nothing"


def test_bad_flags_are_refused_with_the_flag_named() -> None:
    agentq = os.path.join(os.path.dirname(sys.executable), "agentq")
    done = subprocess.run(
        [agentq, "operator", "--max-reclaims", "-1"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert "--max-reclaims" in done.stderr


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--reconcile-interval", "inf"),
        ("--reconcile-interval", "nan"),
        ("--leader-lease-seconds", "1e999"),
        ("--ttl-after-finished", "31536001"),
        ("--ttl-after-finished", "9" * 400),
    ],
)
def test_numbers_no_timer_can_take_are_refused_with_the_flag_named(flag: str, value: str) -> None:
    """Not a traceback at start-up (a float too large for a timedelta) nor a loop that
    sleeps for ever: a usage error naming the flag."""
    with patch("agentq.operator.main.run"), patch.object(command.jsonlog, "setup"):
        done = CliRunner().invoke(command.operator, [flag, value])
    assert done.exit_code == 2, (done.exit_code, done.output, done.exception)
    assert flag in done.output


def test_logs_are_one_json_object_per_line() -> None:
    import json
    import logging

    from agentq.jsonlog import JsonFormatter

    record = logging.LogRecord("agentq.x", logging.INFO, __file__, 1, 'said "%s"', ("hi",), None)
    line = JsonFormatter().format(record)
    assert json.loads(line)["msg"] == 'said "hi"'
    assert json.loads(line)["level"] == "INFO"
    record.created = 1_700_000_000.25
    # UTC with milliseconds: lines of the operator and the sidecar can be ordered.
    assert json.loads(JsonFormatter().format(record))["time"] == "2023-11-14T22:13:20.250Z"
