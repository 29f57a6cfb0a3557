"""``agentq submit``, ``wait`` and ``cancel`` as a user runs them: the installed executable
against the real API server, with the operator and real agents; the exit code of each
outcome; ``requeue`` of a cancelled task; bad input and no cluster."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from test_ops_cli import agentq

from builders import task, worker
from fleet import AGENTQ, Fleet

# The exit codes (agentq.ops.errors.Exit), spelled out: scripts rely on the numbers.
OK, PARTIAL, USAGE, NO_CLUSTER, NOT_FOUND, TIMEOUT, FAILED, CANCELLED = 0, 1, 2, 3, 4, 5, 6, 7


def ns(fleet: Fleet) -> tuple[str, str]:
    return ("-n", fleet.namespace)


def manifests(tmp_path: Path, *builders: object, name: str = "tasks.yaml") -> str:
    path = tmp_path / name
    path.write_text("---\n".join(b.yaml() for b in builders))  # type: ignore[attr-defined]
    return str(path)


def phase(fleet: Fleet, name: str) -> str | None:
    return (fleet.task(name).get("status") or {}).get("phase")


def start(fleet: Fleet, *args: str) -> subprocess.Popen[str]:
    """``agentq ARGS`` in the background (stopped by the caller, by its pid)."""
    return subprocess.Popen(
        [AGENTQ, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={"KUBECONFIG": fleet.kubeconfig, "PATH": str(Path(AGENTQ).parent) + ":/usr/bin:/bin"},
    )


def task_watches(fleet: Fleet) -> int:
    """WATCHes of one AgentTask by name open on the API server now (its own gauge: the
    operator's watches are of a namespace or the cluster)."""
    for line in fleet.kubectl("get", "--raw", "/metrics").splitlines():
        if (
            line.startswith("apiserver_longrunning_requests{")
            and 'resource="agenttasks"' in line
            and 'scope="resource"' in line
            and 'verb="WATCH"' in line
        ):
            return int(float(line.rsplit(" ", 1)[1]))
    return 0


def wait_watching(fleet: Fleet, before: int, waiter: subprocess.Popen[str]) -> None:
    """Until ``waiter`` has opened its WATCH (so it listed the task first), as far as the
    API server's gauge can tell: it counts every client's WATCH of one task, and another
    test's closing in the same moment hides ours. So after 10 s with the waiter still
    running it is taken as watching; the caller's assertion on what the waiter says
    ("deleted while waited on", not "not found") checks that it was."""
    deadline = time.monotonic() + 10
    while task_watches(fleet) <= before and time.monotonic() < deadline:
        assert waiter.poll() is None, waiter.communicate()
        time.sleep(0.1)
    assert waiter.poll() is None, waiter.communicate()


def test_submit_creates_prints_names_and_waits_for_success(fleet: Fleet, tmp_path: Path) -> None:
    fleet.add_worker(worker("w", "llm").max_in_flight(4))
    fleet.agent("w", "complete", work_seconds=0.2)
    fleet.operator("--no-leader-election")
    files = manifests(
        tmp_path, task("a").requires("llm"), task("b").requires("llm").payload({"doc": 1})
    )
    generated = task("x").requires("llm").obj()
    generated["metadata"] = {"generateName": "gen-"}
    done = subprocess.run(
        [AGENTQ, "submit", "-f", files, "-f", "-", *ns(fleet), "--wait", "--timeout", "60"],
        input=yaml.safe_dump(generated),
        capture_output=True,
        text=True,
        timeout=90,
        env={"KUBECONFIG": fleet.kubeconfig, "PATH": "/usr/bin:/bin"},
        check=False,
    )
    assert done.returncode == OK, done.stderr
    lines = done.stdout.splitlines()
    assert lines[:2] == ["agenttask/a created", "agenttask/b created"]
    assert lines[2].startswith("agenttask/gen-") and lines[2].endswith(" created")
    succeeded = sorted(line for line in lines[3:])
    assert succeeded[0] == 'agenttask/a Succeeded: {"by":"w"}'
    assert len(succeeded) == 3 and all("Succeeded" in s for s in succeeded)

    # -o name prints what `agentq wait` (and kubectl) take back.
    named = agentq(fleet, "submit", "-f", manifests(tmp_path, task("c").requires("llm"),
                   name="c.yaml"), *ns(fleet), "-o", "name")  # fmt: skip
    assert named.returncode == OK and named.stdout == "agenttask.agentq.dev/c\n"
    waited = agentq(fleet, "wait", named.stdout.strip(), *ns(fleet), "-o", "json")
    assert waited.returncode == OK, waited.stderr
    report = json.loads(waited.stdout)
    assert [(t["name"], t["outcome"], t["result"]) for t in report["tasks"]] == [
        ("c", "Succeeded", {"by": "w"})
    ]


def test_submit_strict_refuses_bad_manifests_with_the_api_servers_message(
    fleet: Fleet, tmp_path: Path
) -> None:
    files = manifests(
        tmp_path,
        task("good"),
        task("typo").set("spec.leaseDuration", 3),
        task("bad").cost(-1),
    )
    done = agentq(fleet, "submit", "-f", files, *ns(fleet))
    assert done.returncode == PARTIAL
    assert done.stdout == "agenttask/good created\n"
    assert 'strict decoding error: unknown field "spec.leaseDuration"' in done.stderr
    assert f"{files}#2: agenttask/typo:" in done.stderr
    assert "spec.cost: Invalid value: -1: spec.cost in body should be greater than 0" in (
        done.stderr
    )
    assert [t["metadata"]["name"] for t in fleet.tasks()] == ["good"]

    dry = agentq(fleet, "submit", "-f", manifests(tmp_path, task("dry"), name="d.yaml"),
                 *ns(fleet), "--dry-run")  # fmt: skip
    assert dry.returncode == OK and dry.stdout == "agenttask/dry created (dry run)\n"
    assert [t["metadata"]["name"] for t in fleet.tasks()] == ["good"]

    other = task("elsewhere").namespace("other-ns")
    mismatch = agentq(fleet, "submit", "-f", manifests(tmp_path, other, name="o.yaml"),
                      *ns(fleet))  # fmt: skip
    assert mismatch.returncode == USAGE
    assert "does not match the namespace asked for" in mismatch.stderr
    missing_ns = agentq(fleet, "submit", "-f", manifests(tmp_path, other, name="o.yaml"))
    assert missing_ns.returncode == NOT_FOUND, missing_ns.stderr
    assert 'namespaces "other-ns" not found' in missing_ns.stderr


def test_each_outcome_has_its_exit_code(fleet: Fleet, tmp_path: Path) -> None:
    fleet.add_worker(worker("w", "llm").max_in_flight(4))
    fleet.add_worker(worker("fatal", "fatal"))
    fleet.add_worker(worker("flaky", "flaky"))
    fleet.agent("w", "complete", work_seconds=0.2)
    fleet.agent("fatal", "fatal", work_seconds=0.1)
    fleet.agent("flaky", "fail", work_seconds=0.1)
    fleet.operator("--no-leader-election")

    def submit_wait(builder: object, *extra: str) -> subprocess.CompletedProcess[str]:
        name = builder.name  # type: ignore[attr-defined]
        path = manifests(tmp_path, builder, name=f"{name}.yaml")
        return agentq(fleet, "submit", "-f", path, *ns(fleet), "--wait", *extra, timeout=90)

    ok = submit_wait(task("ok").requires("llm"))
    assert ok.returncode == OK, ok.stderr
    failed = submit_wait(task("failed").requires("fatal"))
    assert failed.returncode == FAILED, failed.stderr
    assert "error: agenttask/failed Failed: AgentError: simulated failure" in failed.stderr
    dead = submit_wait(task("dead").requires("flaky").max_reclaims(0))
    assert dead.returncode == FAILED, dead.stderr
    assert "agenttask/dead DeadLettered after 1 failed attempts" in dead.stderr
    stuck = submit_wait(task("stuck").requires("gpu"), "--timeout", "2")
    assert stuck.returncode == TIMEOUT, stuck.stderr
    assert "agenttask/stuck not finished within 2s: it is Pending" in stuck.stderr

    # `wait` on several: the worst outcome wins (4 > 6 > 7 > 5), each printed.
    mixed = agentq(fleet, "wait", "ok", "failed", "stuck", *ns(fleet), "--timeout", "1")
    assert mixed.returncode == FAILED
    assert "agenttask/ok Succeeded" in mixed.stdout
    ghost = agentq(fleet, "wait", "ok", "ghost", "failed", *ns(fleet), "--timeout", "1")
    assert ghost.returncode == NOT_FOUND
    assert "error: agenttask/ghost not found" in ghost.stderr
    nothing = agentq(fleet, "wait", "-l", "batch=none", *ns(fleet))
    assert nothing.returncode == NOT_FOUND
    assert "no AgentTask matches 'batch=none'" in nothing.stderr

    # A cancel while `wait` waits: exit 7.
    waiting = start(fleet, "wait", "stuck", *ns(fleet), "--timeout", "60")
    try:
        time.sleep(1.0)
        cancelled = agentq(fleet, "cancel", "stuck", *ns(fleet))
        assert cancelled.returncode == OK, cancelled.stderr
        assert cancelled.stdout == "agenttask/stuck cancel requested (was Pending)\n"
        _out, err = waiting.communicate(timeout=30)
    finally:
        if waiting.poll() is None:
            waiting.kill()
            waiting.communicate()  # reaps it and closes its pipes (no ResourceWarning later)
    assert waiting.returncode == CANCELLED, err
    assert "error: agenttask/stuck Cancelled: Cancelled: cancelled (spec.cancel)" in err


def test_wait_over_a_selector(fleet: Fleet) -> None:
    fleet.add_worker(worker("w", "llm").max_in_flight(4))
    fleet.agent("w", "complete", work_seconds=0.5)
    fleet.operator("--no-leader-election")
    for i in range(4):
        fleet.add_task(task(f"job-{i}").requires("llm").label("batch", "7"))
    fleet.add_task(task("elsewhere").requires("gpu").label("batch", "8"))
    done = agentq(fleet, "wait", "-l", "batch=7", *ns(fleet), "--timeout", "60", "-o", "yaml")
    assert done.returncode == OK, done.stderr
    report = yaml.safe_load(done.stdout)
    assert sorted(t["name"] for t in report["tasks"]) == [f"job-{i}" for i in range(4)]
    assert {t["outcome"] for t in report["tasks"]} == {"Succeeded"}


def test_a_task_deleted_while_waited_on_exits_4(fleet: Fleet) -> None:
    """The waiter must list the task before it goes; the gauge that tells us it is
    watching counts every test's watches, so under load the delete can come first and
    the waiter rightly says "not found": that set-up race is tried again, with a task
    of a new name, up to three times."""
    fleet.operator("--no-leader-election")
    for attempt in range(3):
        name = f"doomed-{attempt}"
        fleet.add_task(task(name).requires("gpu"))
        before = task_watches(fleet)
        waiting = start(fleet, "wait", f"agenttask/{name}", *ns(fleet))
        try:
            wait_watching(fleet, before, waiting)
            fleet.kubectl("delete", "agenttask", name)
            _out, err = waiting.communicate(timeout=30)
        finally:
            if waiting.poll() is None:
                waiting.kill()
                waiting.communicate()  # reaps it and closes its pipes (no ResourceWarning later)
        assert waiting.returncode == NOT_FOUND, err
        if err != f"error: agenttask/{name} not found\n":  # else it listed after the delete
            break
    assert f"error: agenttask/{name} deleted while waited on" in err


def test_cancel_a_running_task_then_requeue_it(fleet: Fleet) -> None:
    fleet.add_worker(worker("w", "llm"))
    holder = fleet.agent("w", "hold")
    fleet.operator("--no-leader-election")
    fleet.add_task(task("job").requires("llm").lease(9).heartbeat(3))
    fleet.wait_phase("job", "Running", timeout=30)
    cancelled = agentq(fleet, "cancel", "job", *ns(fleet))
    assert cancelled.returncode == OK, cancelled.stderr
    assert cancelled.stdout == (
        "agenttask/job cancel requested (was Running: its agent is told at its next heartbeat)\n"
    )
    again = agentq(fleet, "cancel", "job", *ns(fleet))
    assert again.returncode == OK
    assert again.stdout in (
        "agenttask/job cancel already requested (it is Running)\n",
        "agenttask/job already Cancelled\n",
    )
    waited = agentq(fleet, "wait", "job", *ns(fleet), "--timeout", "30")
    assert waited.returncode == CANCELLED, waited.stderr
    assert agentq(fleet, "cancel", "job", *ns(fleet)).stdout == "agenttask/job already Cancelled\n"

    # A requeue undoes the cancel: it runs again, to completion.
    holder.stop()
    fleet.agent("w", "complete", work_seconds=0.2)
    requeued = agentq(fleet, "requeue", "job", *ns(fleet))
    assert requeued.returncode == OK, requeued.stderr
    assert "agenttask/job requeued (was Cancelled" in requeued.stdout
    assert fleet.task("job")["spec"]["cancel"] is False
    final = agentq(fleet, "wait", "job", *ns(fleet), "--timeout", "60")
    assert final.returncode == OK, final.stderr + final.stdout
    assert phase(fleet, "job") == "Succeeded"


def test_cancel_by_name_and_selector(fleet: Fleet) -> None:
    fleet.add_worker(worker("w", "llm"))
    fleet.agent("w", "complete", work_seconds=0.1)
    fleet.operator("--no-leader-election")
    fleet.add_task(task("done").requires("llm").label("batch", "7"))
    fleet.wait_phase("done", "Succeeded", timeout=30)
    for i in range(5):
        fleet.add_task(task(f"gpu-{i}").requires("gpu").label("batch", "7"))

    finished = agentq(fleet, "cancel", "done", "gpu-0", "ghost", *ns(fleet))
    assert finished.returncode == NOT_FOUND  # a missing name wins over a refusal
    assert "error: agenttask/done not cancelled: it already finished (Succeeded)" in (
        finished.stderr
    )
    assert "error: agenttask 'ghost' not found" in finished.stderr
    assert "agenttask/gpu-0 cancel requested (was Pending)" in finished.stdout
    assert fleet.task("done")["spec"].get("cancel") is not True  # left as it was
    only_finished = agentq(fleet, "cancel", "done", *ns(fleet))
    assert only_finished.returncode == PARTIAL

    dry = agentq(fleet, "cancel", "-l", "batch=7", *ns(fleet), "--dry-run")
    assert dry.returncode == OK, dry.stderr
    assert (
        f"4 task(s) to cancel of 6 matched in namespace {fleet.namespace} "
        "(1 already finished): gpu-1, gpu-2, gpu-3, gpu-4"
    ) in dry.stdout
    assert "dry run: would cancel 4 task(s); nothing changed" in dry.stdout
    assert phase(fleet, "gpu-1") != "Cancelled"

    started = time.monotonic()
    paced = agentq(fleet, "cancel", "-l", "batch=7", *ns(fleet), "--rate", "5", "-o", "json")
    elapsed = time.monotonic() - started
    assert paced.returncode == OK, paced.stderr
    report = json.loads(paced.stdout)
    assert [r["name"] for r in report["requested"]] == [f"gpu-{i}" for i in range(1, 5)]
    assert [r["name"] for r in report["finished"]] == ["done"]
    assert elapsed >= 3 / 5  # four cancels at 5/s: three gaps of 0.2 s
    waited = agentq(fleet, "wait", "-l", "batch=7", *ns(fleet), "--timeout", "30", "-o", "json")
    assert waited.returncode == CANCELLED, waited.stderr
    outcomes = {t["name"]: t["outcome"] for t in json.loads(waited.stdout)["tasks"]}
    assert outcomes == {"done": "Succeeded", **{f"gpu-{i}": "Cancelled" for i in range(5)}}


@pytest.mark.parametrize("verb", [("submit", "-f", "-"), ("wait", "x"), ("cancel", "x")])
def test_without_a_cluster_the_verbs_say_what_to_do(
    fleet: Fleet, tmp_path: Path, verb: tuple[str, ...]
) -> None:
    absent = {"KUBECONFIG": str(tmp_path / "absent"), "HOME": str(tmp_path)}
    done = subprocess.run(
        [AGENTQ, *verb],
        input=task("t").yaml(),
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", **absent},
        check=False,
    )
    assert done.returncode == NO_CLUSTER, done.stderr
    assert "no kubeconfig found" in done.stderr and "agentq cluster up" in done.stderr
