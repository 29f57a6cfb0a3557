"""Operator settings: environment variables override defaults, flags override both."""

from __future__ import annotations

import os
import subprocess
import sys

from agentq.operator.config import OperatorConfig


def test_environment_overrides_defaults() -> None:
    values = OperatorConfig.env_defaults(
        {
            "MAX_RECLAIMS": "7",
            "NAMESPACES": "a,b",
            "LEADER_ELECTION": "false",
            "RECONCILE_INTERVAL": "0.25",
        }
    )
    config = OperatorConfig(**values)  # type: ignore[arg-type]
    assert config.max_reclaims == 7
    assert config.namespaces == ("a", "b")
    assert config.leader_election is False
    assert config.reconcile_interval == 0.25
    assert OperatorConfig().max_reclaims == 3


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
