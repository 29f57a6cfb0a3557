"""Ctrl-C: in `agentq top` the first asks the live view to end in order, a second
interrupts; the other verbs stop at once, say so in one line and exit 130."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import NoReturn

import pytest
from click.testing import CliRunner

from agentq import requeue
from agentq.cli import main
from agentq.ops import commands
from agentq.ops import tasks as ops_tasks
from agentq.ops.commands import ctrl_c
from agentq.ops.errors import Exit

pytestmark = pytest.mark.unit


def test_the_first_ctrl_c_sets_the_event_and_a_second_interrupts() -> None:
    before = signal.getsignal(signal.SIGINT)
    with ctrl_c() as asked:
        assert not asked.is_set()
        os.kill(os.getpid(), signal.SIGINT)  # handled before the next bytecode: no exception
        assert asked.wait(1)
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            asked.wait(1)  # the handler runs here at the latest
    assert signal.getsignal(signal.SIGINT) is before, "the previous handler is back"


def ctrl_c_now(*_: object) -> NoReturn:
    raise KeyboardInterrupt


@pytest.mark.parametrize(
    ("args", "module", "where"),
    [
        (["wait", "a"], ops_tasks, "find_config"),
        (["submit", "-f", "{manifest}", "--wait"], ops_tasks, "find_config"),
        (["cancel", "a", "b", "--rate", "5"], ops_tasks, "find_config"),
        (["requeue", "a", "b", "--rate", "5"], requeue, "connect"),
        (["drain", "w", "--wait"], commands, "connect"),
    ],
)
def test_a_verb_interrupted_exits_130_with_one_line(
    args: list[str], module: object, where: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not click's "Aborted!" and 1, which scripts could not tell from a refusal."""
    manifest = tmp_path / "task.yaml"
    manifest.write_text(
        "apiVersion: agentq.dev/v1alpha1\nkind: AgentTask\nmetadata: {name: a}\n"
        "spec: {queue: q, payload: {}}\n"
    )
    monkeypatch.setattr(module, where, ctrl_c_now)
    result = CliRunner().invoke(main, [a.format(manifest=manifest) for a in args])
    assert result.exit_code == Exit.INTERRUPTED == 130, result.output
    assert result.stderr == "interrupted\n"
    assert result.stdout == ""
