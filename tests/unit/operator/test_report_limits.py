"""What the operator commits from a holder's report or progress marker that does not fit
the task's status, and what it does with a report from a holder that no longer owns the
claim: a decision table on the in-memory API server.

Moved here from test_operator_liveness.py, where each case started an operator and two
agents; the real-process case of each stays in the bad-input corpus
(tests/integration/test_bad_input_leases.py: report-reason-2000-chars,
report-message-40000-chars, report-resultref-5000-chars, progress-2000-chars) and in
test_operator_reclaim.py (a zombie's report refused).
"""

from __future__ import annotations

import json

import pytest

from agentq import protocol
from builders import task
from harness import Harness, run


async def running(h: Harness, name: str, *, max_reclaims: int = 3) -> int:
    h.worker("a", "llm", lease_seconds=1000)
    h.task(task(name).requires("llm").lease(30).max_reclaims(max_reclaims))
    await h.settle()
    h.renew(name, progress="started")
    await h.settle()
    assert h.phase(name) == "Running", h.status(name)
    token: int = h.status(name)["fencingToken"]
    return token


@pytest.mark.parametrize(
    ("field", "value", "limit"),
    [("reason", "r" * 2000, 1024), ("message", "m" * 40_000, 32768)],
)
@run
async def test_an_oversized_report_text_is_cut_and_committed(
    field: str, value: str, limit: int
) -> None:
    h = Harness()
    await running(h, "job", max_reclaims=0)
    error = {"reason": "Boom", "message": "", "retryable": False, field: value}
    h.report("job", outcome="Failed", error=error)
    await h.settle()
    done = h.status("job")
    assert done["phase"] == "Failed", done
    assert len(done["error"][field]) <= limit
    assert "truncated" in done["error"][field]


@run
async def test_a_report_that_cannot_be_committed_fails_the_attempt_visibly() -> None:
    h = Harness()
    await running(h, "job", max_reclaims=0)
    h.report("job", outcome="Succeeded", resultRef="s3://bucket/" + "k" * 5000)
    await h.settle()
    done = h.status("job")
    assert done["phase"] == "DeadLettered", done
    assert done["error"]["reason"] == "InvalidReport"
    assert "resultRef" in done["error"]["message"]


@run
async def test_a_long_progress_marker_is_cut_not_refused() -> None:
    h = Harness()
    await running(h, "job")
    h.renew("job", progress="p" * 2000)
    await h.run_for(10, renew=("job",))  # progress is copied into status at most so often
    got = h.status("job")
    assert got["phase"] == "Running"
    assert got["progress"].startswith("ppp")
    assert len(got["progress"]) <= protocol.MAX_PROGRESS_CHARS


@run
async def test_a_refused_report_is_counted_in_status() -> None:
    h = Harness()
    token = await running(h, "job")
    stale = {"token": token - 1 or 999, "worker": "a", "outcome": "Succeeded"}
    h.annotate_lease("job", protocol.ANNOTATION_REPORT, json.dumps(stale))
    await h.settle()
    status = h.status("job")
    assert status["refusedReports"] == 1 and status["phase"] == "Running", status
    assert h.kube.reasons("job").count("StaleReportRefused") == 1
