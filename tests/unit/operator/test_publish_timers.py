"""A worker's status catches up with every change, however its changes interleave.

The publish timer keeps one live entry per worker (the earliest); a write made
earlier than that entry for an urgent change (readiness, phase) moves the next
count write later than the entry. When the entry fires it must look again at the
new time, or the counts are never written (the demo showed a worker "1 in flight"
for good after its task succeeded).
"""

from __future__ import annotations

from builders import task
from harness import NS, Harness, run


@run
async def test_counts_are_written_after_an_urgent_write_moved_their_time() -> None:
    h = Harness(worker_status_interval=10.0)
    h.worker("w1", "llm")
    await h.settle()
    assert h.worker_status("w1")["phase"] == "Ready"
    await h.advance(1)
    h.task(task("a").requires("llm"))  # counts change: due 10 s after the first write
    await h.settle()
    await h.advance(1)
    # An urgent change (phase) is written at once, ahead of the pending count write.
    h.kube.edit("agentworkers", NS, "w1", lambda b: b["spec"].__setitem__("paused", True))
    await h.settle()
    assert h.worker_status("w1")["phase"] == "Draining"
    await h.advance(1)
    h.renew("a")
    await h.settle()
    h.report("a", outcome="Succeeded", result={"ok": True})
    await h.settle()
    assert h.phase("a") == "Succeeded"
    await h.run_for(25)
    status = h.worker_status("w1")
    assert status["inFlight"] == 0 and status["assignedTasks"] == [], status
    assert status["servedCost"] == 1 and status["phase"] == "Draining", status
