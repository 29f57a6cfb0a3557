"""agent-sim on SIGTERM (a scale-down): drain, finish what is in hand, then stop."""

from __future__ import annotations

import threading
import time
from typing import Any

from agentq.agentsim import AgentSim


class _Client:
    """The sidecar client's drain and listing, scripted: the sidecar still lists one
    assignment (a grant in flight when the operator heard) for a few polls."""

    url = "http://sidecar"

    def __init__(self, listed_polls: int) -> None:
        self.drains = 0
        self.listed_polls = listed_polls

    def drain(self) -> dict[str, Any]:
        self.drains += 1
        return {"draining": True}

    def list(self, **_: Any) -> tuple[int, list[object]]:
        if self.listed_polls > 0:
            self.listed_polls -= 1
            return 1, [object()]
        return 2, []


def test_drain_waits_for_work_in_hand_and_for_the_sidecar_to_list_nothing() -> None:
    client = _Client(listed_polls=3)
    sim = AgentSim(
        client,  # type: ignore[arg-type]
        behaviour="complete",
        work_seconds=0,
        beat_seconds=None,
        sink_url=None,
    )
    working = threading.Thread(target=time.sleep, args=(0.3,))
    sim._working.add(working)
    working.start()

    def finish() -> None:
        working.join()
        sim._working.discard(working)

    threading.Thread(target=finish).start()
    started = time.monotonic()
    sim.drain(quiet_seconds=0.2, poll=0.05)
    assert client.drains == 1
    assert sim.stop.is_set() and sim.busy() == 0 and client.listed_polls == 0
    assert time.monotonic() - started >= 0.3 + 0.2
