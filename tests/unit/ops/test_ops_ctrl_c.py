"""`agentq top` and Ctrl-C: the first asks the live view to end in order, a second interrupts."""

from __future__ import annotations

import os
import signal

import pytest

from agentq.ops.commands import ctrl_c


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
