"""Bad-input corpus: lifecycle abuse, on the real API server.

Requeues where none is allowed and requeue storms, pausing or deleting a worker
that holds claims, deleting a task mid-attempt, editing immutable fields,
shrinking a worker under its load, a task no worker can take. Each case asserts a
clear refusal or a visible state, that nothing else changed, and a terminal path;
after each case the shared operator must still run and dispatch a canary task.
"""

from __future__ import annotations

import glob
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client.rest import ApiException

from agentq import GROUP, VERSION, protocol
from builders import task, worker
from corpus import Arena, Case, Puppet, cases_as_params, running
from fleet import ControlPlane, Fleet

# The corpus is slow (make test, not make test-fast).
pytestmark = [pytest.mark.integration, pytest.mark.slow]

LEASE = 3
BOUND = LEASE + 0.5 + 6
AGENTQ = str(Path(sys.executable).with_name("agentq"))


@pytest.fixture(scope="module")
def arena(
    control_plane: ControlPlane, agentq_crds: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Arena]:
    arena = Arena(control_plane, tmp_path_factory.mktemp("bad-lifecycle"))
    try:
        yield arena
    finally:
        arena.close()


def requeue(arena: Arena, name: str, request: str) -> None:
    arena.fleet.annotate_task(name, protocol.ANNOTATION_REQUEUE, request)


def agentq_requeue(arena: Arena, name: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [AGENTQ, "requeue", name, "-n", arena.namespace],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={"KUBECONFIG": arena.fleet.kubeconfig, "PATH": "/usr/bin:/bin"},
    )


def dead_lettered(arena: Arena, prefix: str) -> tuple[Puppet, str, int]:
    """A task of puppet pa that failed its only attempt: DeadLettered."""
    p = arena.puppets["pa"]
    name = p.submit(prefix, lambda b: b.max_reclaims(0), lease=LEASE)
    token = p.wait_grant(name)
    p.report(
        name, token, outcome="Failed", error={"reason": "Boom", "message": "", "retryable": True}
    )
    arena.fleet.wait_phase(name, "DeadLettered", timeout=20)
    return p, name, token


def attempt_state(status: dict[str, Any]) -> dict[str, Any]:
    """What a requeue or a new attempt would move: everything but the progress marker and
    the conditions' messages and times (an ``Unschedulable`` message names the closest
    worker, so it is rewritten when another case's worker comes or goes)."""
    state = {k: v for k, v in status.items() if k not in ("progress", "conditions")}
    state["conditions"] = sorted(
        (c.get("type"), c.get("status"), c.get("reason")) for c in status.get("conditions") or ()
    )
    return state


def unchanged(arena: Arena, name: str, seconds: float = 3) -> None:
    """The task's attempt does not move (no requeue, no new attempt) for ``seconds``."""
    before = attempt_state(arena.status(name))
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        now = attempt_state(arena.status(name))
        assert now == before, f"{name} moved:\nbefore {before}\nafter  {now}"
        time.sleep(0.25)
    assert "Requeued" not in arena.reasons(name)


# --- requeues -------------------------------------------------------------------------


def requeue_running(arena: Arena) -> None:
    p, name, token = running(arena, "requeue-running")
    with p.renewing(name, token):
        requeue(arena, name, "by-hand-1")
        unchanged(arena, name)
        refused = agentq_requeue(arena, name)
        assert refused.returncode == 1 and "Running" in refused.stderr, refused
    p.report(name, token)
    arena.fleet.wait_phase(name, "Succeeded", timeout=20)


def requeue_storm(arena: Arena) -> None:
    p, name, token = dead_lettered(arena, "storm")
    for i in range(40):
        requeue(arena, name, f"storm-{i}")
    new = p.wait_grant(name, after=token, timeout=30)
    with p.renewing(name, new):  # the new attempt stays healthy while the storm ends
        time.sleep(2)  # the rest of the storm arrives while the task is Assigned: ignored
        status = arena.status(name)
        requeued = [h for h in status.get("history") or [] if h.get("outcome") == "Requeued"]
        assert len(requeued) == 1, status.get("history")
        assert status["fencingToken"] == new and status["attempt"] == 2
        p.report(name, new)
        arena.fleet.wait_phase(name, "Succeeded", timeout=20)
    assert arena.fleet.wait_reasons(name, {"Requeued": 1}).count("Requeued") == 1


def requeue_long_request(arena: Arena) -> None:
    _p, name, _token = dead_lettered(arena, "requeue-long")
    mark = arena.log_mark()
    requeue(arena, name, "r" * 300)  # status.requeueHandled holds at most 256 characters

    def requeues() -> int:
        history = arena.status(name).get("history") or []
        return sum(1 for h in history if h.get("outcome") == "Requeued")

    def refused() -> bool:
        return any("Requeue" in r and r != "Requeued" for r in arena.reasons(name))

    # Either honoured (the id stored in a form status accepts) or refused visibly; never
    # a status write refused on every pass.
    arena.wait("the request honoured or refused visibly", lambda: requeues() > 0 or refused())
    errors = arena.errors_since(mark)
    assert len(errors) <= 3, "\n".join(errors[:3])
    if requeues():
        # Honoured once: the redriven attempt runs out too (maxReclaims 0, nobody renews),
        # and the same request, still on the task, must not redrive it again.
        arena.fleet.wait_phase(name, "DeadLettered", timeout=20)
        arena.stays(
            f"{name} stays DeadLettered, requeued once",
            lambda: arena.status(name)["phase"] == "DeadLettered" and requeues() == 1,
            seconds=5,
        )


# The decision table of requeues (on a Pending, Succeeded, DeadLettered or Held task, an
# empty request, a storm on a Held task) is in tests/unit/operator/test_requeue_decisions.py;
# here one real-process case per behaviour.
REQUEUE_CASES = [
    Case("requeue-a-running-task", requeue_running),
    Case("requeue-storm-on-dead-lettered", requeue_storm),
    Case("requeue-request-over-256-chars", requeue_long_request),
]


# --- workers under load ---------------------------------------------------------------


def patch_worker(arena: Arena, name: str, spec: dict[str, object]) -> None:
    arena.custom.patch_namespaced_custom_object(
        GROUP, VERSION, arena.namespace, "agentworkers", name, {"spec": spec}
    )


def worker_phase(arena: Arena, name: str) -> str | None:
    phase: str | None = (arena.fleet.worker(name).get("status") or {}).get("phase")
    return phase


def pause_worker_with_claims(arena: Arena) -> None:
    p = arena.puppets["pb"]
    names = [p.submit("paused-claim", lease=LEASE) for _ in range(2)]
    tokens = [p.wait_grant(n) for n in names]
    patch_worker(arena, "pb", {"paused": True})
    try:
        arena.wait("pb Draining", lambda: worker_phase(arena, "pb") == "Draining", timeout=15)
        later = p.submit("after-pause", lease=LEASE)
        for n, t in zip(names, tokens, strict=True):
            p.renew(n, t)
            p.report(n, t)
        for n in names:
            arena.fleet.wait_phase(n, "Succeeded", timeout=20)  # claims run to their end
        arena.stays(
            f"{later} waits while pb is paused",
            lambda: arena.status(later).get("worker") is None,
            seconds=2,
        )
    finally:
        patch_worker(arena, "pb", {"paused": False})
    p.finish(later)


def delete_worker_with_claims(arena: Arena) -> None:
    p = arena.puppets["pb"]
    name = p.submit("orphaned", lease=LEASE)
    token = p.wait_grant(name)
    p.run(name, token)
    body = arena.fleet.worker("pb")
    arena.custom.delete_namespaced_custom_object(
        GROUP, VERSION, arena.namespace, "agentworkers", "pb"
    )
    try:
        time.sleep(2)
        assert arena.operator_alive()
    finally:
        arena.fleet.add_worker(
            worker("pb").capabilities(*body["spec"]["capabilities"]).max_in_flight(8)
        )
    # The claim has a terminal path: its holder finishes it, or it is reclaimed and
    # granted again once a worker can take it.
    p.finish(name, timeout=BOUND + 30)


def shrink_worker_below_its_load(arena: Arena) -> None:
    p = arena.puppets["pb"]
    names = [p.submit("shrunk", lease=LEASE) for _ in range(3)]
    tokens = [p.wait_grant(n) for n in names]
    patch_worker(arena, "pb", {"maxInFlight": 1})
    try:
        later = p.submit("after-shrink", lease=LEASE)
        for n, t in zip(names, tokens, strict=True):
            p.renew(n, t)
        time.sleep(1.5)
        # No preemption: all three still held; nothing new while 3 >= 1.
        assert all(arena.status(n)["phase"] in ("Assigned", "Running") for n in names)
        assert arena.status(later).get("worker") is None
        for n, t in zip(names, tokens, strict=True):
            p.report(n, t)
        p.finish(later, timeout=30)
    finally:
        patch_worker(arena, "pb", {"maxInFlight": 8})


def capability_removed_mid_claim(arena: Arena) -> None:
    p, name, token = running(arena, "cap-removed", puppet="pb")
    patch_worker(arena, "pb", {"capabilities": ["something-else"]})
    try:
        later = p.submit("needs-pb", lease=LEASE)
        with p.renewing(name, token):
            arena.stays(
                f"{name} keeps its claim",
                lambda: arena.status(name)["phase"] == "Running",
                seconds=2,
            )
            assert arena.status(later).get("worker") is None
        p.report(name, token)
        arena.fleet.wait_phase(name, "Succeeded", timeout=20)
    finally:
        patch_worker(arena, "pb", {"capabilities": ["pb"]})
    p.finish(later)


def weight_flapping(arena: Arena) -> None:
    for i in range(40):
        patch_worker(arena, "pb", {"weight": [0.001, 1000, 1, 3.5][i % 4]})
    patch_worker(arena, "pb", {"weight": 1})
    p = arena.puppets["pb"]
    p.finish(p.submit("after-flapping", lease=LEASE))


WORKER_CASES = [
    Case("pause-a-worker-with-claims", pause_worker_with_claims),
    Case("delete-a-worker-with-claims", delete_worker_with_claims),
    Case("shrink-max-in-flight-below-load", shrink_worker_below_its_load),
    Case("remove-a-capability-mid-claim", capability_removed_mid_claim),
    Case("weight-flapping", weight_flapping),
]


# --- tasks deleted or edited ----------------------------------------------------------


def delete_task_mid_attempt(arena: Arena) -> None:
    p, name, token = running(arena, "deleted-mid-attempt")
    mark = arena.log_mark()
    arena.delete_task(name)
    arena.wait(
        f"{name}'s Lease gone", lambda: arena.fleet.task_lease(name) is None, timeout=BOUND + 20
    )
    with pytest.raises(Exception):  # noqa: B017 - LeaseLost: the holder must stop
        p.renew(name, token)
    assert len(arena.errors_since(mark)) <= 3


def delete_tasks_while_dispatching(arena: Arena) -> None:
    p = arena.puppets["pa"]
    names = [p.submit("burst", lease=LEASE) for _ in range(20)]
    for name in names:
        arena.delete_task(name)
    time.sleep(3)
    leases = arena.leases.list_namespaced_lease(
        arena.namespace, label_selector=f"{protocol.LABEL_LEASE_KIND}=task"
    ).items
    leftover = [
        lease.metadata.name for lease in leases if lease.metadata.name.split("-task-")[-1] in names
    ]

    def no_orphans() -> bool:
        items = arena.leases.list_namespaced_lease(
            arena.namespace, label_selector=f"{protocol.LABEL_LEASE_KIND}=task"
        ).items
        return not [i for i in items if i.metadata.name.split("-task-")[-1] in names]

    arena.wait(f"no Lease left of the deleted tasks (had {leftover})", no_orphans, timeout=30)


def delete_task_with_a_finalizer(arena: Arena) -> None:
    p, name, token = running(arena, "finalized")
    arena.custom.patch_namespaced_custom_object(
        GROUP,
        VERSION,
        arena.namespace,
        "agenttasks",
        name,
        {"metadata": {"finalizers": ["example.com/keep"]}},
    )
    arena.delete_task(name)  # stays, Terminating, until the finalizer goes
    try:
        with p.renewing(name, token):
            time.sleep(2)
            assert arena.operator_alive()
    finally:
        arena.custom.patch_namespaced_custom_object(
            GROUP, VERSION, arena.namespace, "agenttasks", name, {"metadata": {"finalizers": None}}
        )
    arena.wait(f"{name} gone", lambda: _gone(arena, name), timeout=30)


def _gone(arena: Arena, name: str) -> bool:
    try:
        arena.task(name)
    except ApiException as err:
        return err.status == 404
    return False


def immutable(field: str, value: object) -> object:
    def run(arena: Arena) -> None:
        name = arena.name(f"immutable-{field.lower()}")
        arena.create_task(task(name).requires("nobody-has-this").cost(2).payload({"k": "v"}))
        before = arena.task(name)["spec"]
        with pytest.raises(ApiException) as refused:
            arena.custom.patch_namespaced_custom_object(
                GROUP, VERSION, arena.namespace, "agenttasks", name, {"spec": {field: value}}
            )
        assert refused.value.status == 422
        assert f"{field} is immutable" in refused.value.body, refused.value.body
        assert arena.task(name)["spec"] == before
        arena.delete_task(name)

    return run


def lease_shortened_mid_attempt(arena: Arena) -> None:
    p = arena.puppets["pa"]
    name = p.submit("shortened", lease=30)
    token = p.wait_grant(name)
    p.run(name, token)
    arena.custom.patch_namespaced_custom_object(
        GROUP, VERSION, arena.namespace, "agenttasks", name, {"spec": {"leaseDurationSeconds": 3}}
    )
    with p.renewing(name, token, every=1.0):
        arena.stays(
            f"{name} keeps a claim renewed within the new lease",
            lambda: arena.status(name).get("reclaims", 0) == 0,
            seconds=4,
        )
    p.report(name, token)
    arena.fleet.wait_phase(name, "Succeeded", timeout=20)


def max_reclaims_lowered_mid_run(arena: Arena) -> None:
    p = arena.puppets["pa"]
    name = p.submit("budget-cut", lambda b: b.max_reclaims(5), lease=LEASE)
    token = p.wait_grant(name)
    p.report(
        name, token, outcome="Failed", error={"reason": "Boom", "message": "", "retryable": True}
    )
    token = p.wait_grant(name, after=token)
    arena.custom.patch_namespaced_custom_object(
        GROUP, VERSION, arena.namespace, "agenttasks", name, {"spec": {"maxReclaims": 0}}
    )
    p.report(
        name, token, outcome="Failed", error={"reason": "Boom", "message": "", "retryable": True}
    )
    done = arena.fleet.wait_phase(name, "DeadLettered", timeout=20)["status"]
    assert done["reclaims"] == 2


def unschedulable(arena: Arena) -> None:
    name = arena.name("unschedulable")
    arena.create_task(task(name).requires("quantum", "pb").lease(LEASE))

    def condition() -> dict[str, str]:
        conditions = arena.status(name).get("conditions") or []
        return next((c for c in conditions if c["type"] == "Unschedulable"), {})

    arena.wait(
        "an Unschedulable condition naming the missing capability",
        lambda: condition().get("status") == "True" and "quantum" in condition().get("message", ""),
        timeout=15,
    )
    # Still a queued task in `kubectl get agenttasks`: Pending, with the reason beside it.
    assert arena.status(name).get("phase") == "Pending", arena.status(name)
    assert "Unschedulable" in arena.reasons(name)
    # The gauge is refreshed at most once a second, at the loop's next pass.
    arena.wait(
        "agentq_unschedulable_tasks counts it",
        lambda: arena.metric("agentq_unschedulable_tasks") >= 1,
        timeout=15,
    )
    patch_worker(arena, "pb", {"capabilities": ["pb", "quantum"]})
    try:
        arena.puppets["pb"].finish(name)
        assert condition().get("status") != "True"
    finally:
        patch_worker(arena, "pb", {"capabilities": ["pb"]})


TASK_CASES = [
    Case("delete-a-task-mid-attempt", delete_task_mid_attempt),
    Case("delete-tasks-while-dispatching", delete_tasks_while_dispatching),
    Case("delete-a-task-with-a-finalizer", delete_task_with_a_finalizer),
    Case("edit-immutable-required-capabilities", immutable("requiredCapabilities", ["gpu"])),
    Case("edit-immutable-cost", immutable("cost", 9)),
    Case("edit-immutable-payload", immutable("payload", {"k": "changed"})),
    Case("shorten-the-lease-mid-attempt", lease_shortened_mid_attempt),
    Case("lower-max-reclaims-mid-run", max_reclaims_lowered_mid_run),
    Case("no-worker-has-the-capability", unschedulable),
]

CASES = REQUEUE_CASES + WORKER_CASES + TASK_CASES


@pytest.mark.timeout(180)
@pytest.mark.parametrize("case", cases_as_params(CASES))
def test_lifecycle_abuse(arena: Arena, case: Case) -> None:
    with arena.case():
        case.run(arena)


# --- a replica whose wall clock is wrong ----------------------------------------------

LIBFAKETIME = next(iter(glob.glob("/usr/lib/*/faketime/libfaketime.so.1")), None)


@pytest.mark.skipif(LIBFAKETIME is None, reason="needs libfaketime (make test installs it)")
def test_a_retry_backoff_written_by_a_replica_two_hours_ahead_does_not_stall_its_successor(
    fleet: Fleet, tmp_path: Path
) -> None:
    clock = tmp_path / "faketime"
    clock.write_text("+2h\n")
    fleet.add_worker(worker("a").capabilities("llm"))
    fleet.agent("a", "fail", work_seconds=0.2)
    flags = ("--leader-election", "--leader-lease-seconds", "4")
    ahead = fleet.operator(
        *flags,
        env={
            "LD_PRELOAD": str(LIBFAKETIME),
            "FAKETIME_TIMESTAMP_FILE": str(clock),
            "FAKETIME_NO_CACHE": "1",
            "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        },
    )
    fleet.wait_all(
        lambda _: (
            "agentq-operator"
            in [
                lease.metadata.name
                for lease in fleet.leases.list_namespaced_lease(fleet.namespace).items
            ]
        ),
        timeout=30,
    )
    fleet.operator(*flags)  # the standby, on the right time
    fleet.add_task(
        task("retried").requires("llm").lease(5).max_reclaims(5).backoff(initial=2, max=2, jitter=0)
    )
    failed = fleet.wait_task(
        "retried", lambda b: (b.get("status") or {}).get("reclaims", 0) >= 1, timeout=30
    )["status"]
    assert failed["phase"] == "Pending" and failed.get("notBefore")
    ahead.kill()  # the standby takes over within its 4 s lease
    attempt = failed["attempt"]
    # The backoff was 2 s: the next attempt starts within backoff + failover + margin.
    fleet.wait_task(
        "retried",
        lambda b: (b.get("status") or {}).get("attempt", 0) > attempt,
        timeout=2 + 4 + 2 + 10,
        what="the retry after a 2 s backoff",
    )
