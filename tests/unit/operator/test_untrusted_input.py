"""What someone else writes cannot break the operator for everyone: a fencing token no
operator issued, and agent text as a metric label."""

from __future__ import annotations

import json

from agentq import protocol
from agentq.operator import metrics
from builders import task
from harness import NS, Harness, run


@run
async def test_a_status_token_above_every_issued_one_fails_that_task_and_no_other() -> None:
    h = Harness()
    h.worker("w1", "llm", lease_seconds=100_000)
    h.task(task("first").requires("llm"))
    await h.settle()
    issued = h.status("first")["fencingToken"]
    # Someone with status rights writes a huge token into another task.
    h.task(task("forged").requires("gpu"))  # pending: nothing takes it
    await h.settle()
    h.kube.edit("agenttasks", NS, "forged", lambda b: b["status"].update(fencingToken=2**53 - 1))
    h.kube.edit(
        "agenttasks", NS, "forged", lambda b: b["spec"].update(requiredCapabilities=["llm"])
    )
    await h.settle()
    status = h.status("forged")
    assert status["phase"] == "Failed" and status["error"]["reason"] == "FencingTokenForged"
    assert "Unprocessable" in h.kube.reasons("forged")
    # Tokens go on from the counter, not from the forged value.
    h.task(task("next").requires("llm"))
    h.report("first", outcome="Succeeded")
    await h.settle()
    assert h.phase("first") == "Succeeded" and h.phase("next") == "Assigned"
    token = h.status("next")["fencingToken"]
    assert issued < token < issued + 2000, token


@run
async def test_a_reclaim_reason_written_by_an_agent_is_no_metric_label() -> None:
    h = Harness()
    h.worker("w1", "llm", lease_seconds=100_000)
    h.task(task("t").requires("llm").backoff(initial=0))
    await h.settle()
    h.renew("t")
    await h.settle()
    status = h.status("t")
    body = {
        "token": status["fencingToken"],
        "worker": "w1",
        "outcome": "Failed",
        "error": {"reason": "out of memory at 0x7f3a9c", "retryable": True},
    }
    h.annotate_lease("t", protocol.ANNOTATION_REPORT, json.dumps(body))
    await h.settle()
    assert h.status("t")["reclaims"] == 1
    labels = {s.labels["reason"] for m in metrics.RECLAIMS.collect() for s in m.samples}
    assert "out of memory at 0x7f3a9c" not in labels
    assert "Reported" in labels


@run
async def test_a_token_the_other_replica_issued_while_we_did_not_lead_is_not_forged() -> None:
    """A replica remembers the ceiling of its own last reservation. Another replica led
    meanwhile, reserved the next block and granted from it (the chaos run: leader kills
    and stops). When this one led again, it judged those grants' tokens -- above its old
    ceiling -- forged, and failed healthy tasks (134 of 1,000)."""
    from agentq.operator.tokens import ANNOTATION_CEILING

    h = Harness()
    h.worker("w1", "llm", lease_seconds=100_000)
    h.task(task("first").requires("llm"))
    await h.settle()
    issued = h.status("first")["fencingToken"]
    h.controller.set_leading(False)
    await h.settle()
    # The other replica leads: it reserves the next block and grants from it.
    counter = h.config.token_lease
    theirs = issued + 1500
    h.kube.edit(
        "leases",
        NS,
        counter,
        lambda b: b["metadata"]["annotations"].update({ANNOTATION_CEILING: str(issued + 2000)}),
    )
    h.task(task("theirs").requires("llm"))
    h.kube.edit(
        "agenttasks",
        NS,
        "theirs",
        lambda b: b["status"].update(
            phase="Assigned",
            worker="w1",
            fencingToken=theirs,
            attempt=1,
            leaseName="agentq-task-theirs",
        ),
    )
    await h.settle()
    h.controller.set_leading(True)
    await h.settle()
    assert h.phase("theirs") != "Failed", h.status("theirs")
    # And tokens go on above theirs.
    h.task(task("next").requires("llm"))
    h.report("first", outcome="Succeeded")
    await h.settle()
    assert h.phase("next") == "Assigned"
    assert h.status("next")["fencingToken"] > theirs
