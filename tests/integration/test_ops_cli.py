"""The ops verbs (``explain``, ``top``, ``drain``, ``uncordon``, ``requeue``) as a user runs
them: the installed ``agentq`` executable against the real API server, with a real
operator and scripted agents; bad arguments; no cluster at all.
"""

from __future__ import annotations

import json
import os
import pty
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from agentq import GROUP, VERSION, protocol
from agentq.controlplane.cluster import free_port
from builders import queue, task, worker
from fleet import AGENTQ, ControlPlane, Fleet

BIN = str(Path(sys.executable).parent)


def agentq(
    fleet: Fleet, *args: str, timeout: float = 60, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [AGENTQ, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env={
            "KUBECONFIG": fleet.kubeconfig,
            "PATH": f"{BIN}:/usr/bin:/bin",
            "HOME": os.environ.get("HOME", "/root"),
            **(env or {}),
        },
    )


def ns(fleet: Fleet) -> tuple[str, str]:
    return ("-n", fleet.namespace)


def phase(fleet: Fleet, name: str) -> str | None:
    return (fleet.task(name).get("status") or {}).get("phase")


# --- explain --------------------------------------------------------------------------------


def test_explain_says_why_each_task_is_where_it_is(fleet: Fleet) -> None:
    fleet.add_worker(worker("llm-1").capabilities("llm").max_in_flight(1))
    fleet.add_worker(worker("flaky").capabilities("flaky"))
    fleet.add_worker(worker("resting").capabilities("gpu").paused())
    fleet.agent("llm-1", "hold")
    fleet.agent("flaky", "fail", work_seconds=0.2)
    fleet.operator()
    fleet.add_task(task("busy").requires("llm"))
    fleet.wait_phase("busy", "Running")
    fleet.add_task(task("queued").requires("llm"))
    fleet.add_task(task("impossible").requires("llm", "quantum"))
    fleet.add_task(task("gpu-job").requires("gpu"))
    fleet.add_task(task("poison").requires("flaky").max_reclaims(1).backoff(initial=0.2, max=1))
    fleet.wait_phase("poison", "DeadLettered", timeout=30)
    fleet.wait_reasons("poison", {"Assigned": 2, "DeadLettered": 1})

    def codes(name: str) -> list[str]:
        done = agentq(fleet, "explain", name, *ns(fleet), "-o", "json")
        assert done.returncode == 0, done.stderr
        return [f["code"] for f in json.loads(done.stdout)["findings"]]

    assert codes("impossible") == ["Unschedulable"]
    assert codes("gpu-job") == ["NoReadyWorker"]
    assert codes("queued") == ["NoFreeCapacity"]
    assert codes("busy") == ["Running"]
    assert codes("poison") == ["DeadLettered"]

    text = agentq(fleet, "explain", "impossible", *ns(fleet))
    assert "no AgentWorker in namespace" in text.stdout and "offers quantum" in text.stdout
    paused = agentq(fleet, "explain", "gpu-job", *ns(fleet)).stdout
    assert "resting: paused" in paused and "agentq uncordon resting" in paused

    shown = agentq(fleet, "explain", "poison", *ns(fleet), "-o", "yaml")
    data = yaml.safe_load(shown.stdout)
    assert data["phase"] == "DeadLettered"
    assert [(r["attempt"], r["worker"], r["outcome"]) for r in data["timeline"]] == [
        (1, "flaky", "Failed"),
        (2, "flaky", "Failed"),
    ]
    # The start of each attempt comes from its Assigned event (matched by token).
    assert all(r["started"] is not None for r in data["timeline"])
    assert data["timeline"][0]["token"] < data["timeline"][1]["token"]
    assert {"Assigned", "DeadLettered"} <= {e["reason"] for e in data["events"]}
    assert "agentq requeue poison" in data["findings"][0]["hint"]


def test_explain_shows_a_refused_zombie_report(fleet: Fleet) -> None:
    fleet.add_worker(worker("a").capabilities("llm"))
    fleet.agent("a", "hold")
    fleet.operator()
    fleet.add_task(task("job").requires("llm"))
    running = fleet.wait_phase("job", "Running")["status"]
    zombie = protocol.Report(
        token=running["fencingToken"] + 1000, worker="a", outcome="Succeeded", result={}
    )
    fleet.leases.patch_namespaced_lease(
        protocol.task_lease_name("job"),
        fleet.namespace,
        {"metadata": {"annotations": {protocol.ANNOTATION_REPORT: zombie.encode()}}},
    )
    fleet.wait_reasons("job", {"StaleReportRefused": 1})
    done = agentq(fleet, "explain", "job", *ns(fleet))
    assert done.returncode == 0, done.stderr
    assert "ReportsRefused: 1 report(s) from a holder that no longer owned the claim" in done.stdout
    assert f"token {running['fencingToken'] + 1000}" in done.stdout


def test_explain_and_top_show_agent_queues(fleet: Fleet) -> None:
    """A task in a capped queue: its place and the cap; a task its queue refuses, and one
    naming no queue that exists: the operator's verdict; top: a row per queue."""
    capped, shut = f"{fleet.namespace}-capped", f"{fleet.namespace}-shut"
    here = {"kubernetes.io/metadata.name": fleet.namespace}
    bodies = [
        queue(capped).selects(**here).workers_in(fleet.namespace).max_in_flight(1).obj(),
        queue(shut).selects(team="nobody").workers_in(fleet.namespace).obj(),
    ]
    for body in bodies:
        fleet.custom.create_cluster_custom_object(GROUP, VERSION, "agentqueues", body)
    try:
        fleet.add_worker(worker("w").capabilities("llm").max_in_flight(5))
        fleet.agent("w", "hold")
        fleet.operator()
        for name in ("q-0", "q-1", "q-2"):
            fleet.add_task(task(name).requires("llm").queue(capped))
        fleet.add_task(task("refused").requires("llm").queue(shut))
        fleet.add_task(task("lost").requires("llm").queue(f"{fleet.namespace}-missing"))

        def queued_false(t: dict) -> bool:
            return any(
                c.get("type") == "Queued" and c.get("status") == "False"
                for c in (t.get("status") or {}).get("conditions") or []
            )

        fleet.wait_all(
            lambda items: (
                phase(fleet, "q-0") == "Running" and sum(queued_false(t) for t in items) == 2
            )
        )
        deadline = time.monotonic() + 30  # the queue's counts are written every 5 s
        while True:
            status = (
                fleet.custom.get_cluster_custom_object(GROUP, VERSION, "agentqueues", capped).get(
                    "status"
                )
                or {}
            )
            if status.get("inFlight") == 1 or time.monotonic() > deadline:
                break
            time.sleep(0.5)

        def explained(name: str) -> dict:
            result = agentq(fleet, "explain", name, *ns(fleet), "-o", "json")
            assert result.returncode == 0, result.stderr
            data: dict = json.loads(result.stdout)
            return data

        last = explained("q-2")
        codes = [f["code"] for f in last["findings"]]
        assert codes[:2] == ["InQueue", "QueueAtCap"], codes
        assert (last["queue"], last["queuePosition"], last["queuePending"]) == (capped, 2, 2)
        assert [f["code"] for f in explained("refused")["findings"]] == ["QueueForbidden"]
        assert [f["code"] for f in explained("lost")["findings"]] == ["QueueNotFound"]
        text = agentq(fleet, "explain", "q-2", *ns(fleet))
        assert f"queue {capped} (position 2 of 2)" in text.stdout, text.stdout

        top = json.loads(agentq(fleet, "top", *ns(fleet), "-o", "json").stdout)
        rows = {q["name"]: q for q in top["agentQueues"]}
        assert (rows[capped]["inFlight"], rows[capped]["maxInFlight"]) == (1, 1)
        assert rows[capped]["pending"] == 2 and rows[capped]["state"] == "Ready"
        assert top["agentQueuesNote"] is None
        once = agentq(fleet, "top", *ns(fleet), "--once")
        assert "AGENTQUEUE" in once.stdout and capped in once.stdout
    finally:
        for body in bodies:
            name = body["metadata"]["name"]
            fleet.custom.delete_cluster_custom_object(GROUP, VERSION, "agentqueues", name)


def test_explain_bad_arguments_and_missing_tasks(fleet: Fleet) -> None:
    missing = agentq(fleet, "explain", "nope", *ns(fleet))
    assert missing.returncode == 4
    assert "agenttask 'nope' in namespace" in missing.stderr and "not found" in missing.stderr
    no_arg = agentq(fleet, "explain")
    assert no_arg.returncode == 2 and "Missing argument 'TASK'" in no_arg.stderr
    bad_format = agentq(fleet, "explain", "x", "-o", "xml")
    assert bad_format.returncode == 2 and "'xml' is not one of" in bad_format.stderr
    helped = agentq(fleet, "explain", "--help")
    assert helped.returncode == 0 and "Exit codes:" in helped.stdout


def test_kubectl_agentq_runs_the_same_code(fleet: Fleet, control_plane: ControlPlane) -> None:
    fleet.add_worker(worker("a").capabilities("llm"))
    fleet.add_task(task("impossible").requires("quantum"))
    done = subprocess.run(
        [control_plane.kubectl_path, "agentq", "explain", "impossible", *ns(fleet), "-o", "json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={"KUBECONFIG": fleet.kubeconfig, "PATH": f"{BIN}:/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stderr
    # No operator runs here. (Without a status the explanation also says NotSeenYet; a
    # CRD that defaults the phase to Pending makes that indistinguishable.)
    codes = [f["code"] for f in json.loads(done.stdout)["findings"]]
    assert codes[-1] == "Unschedulable" and set(codes) <= {"NotSeenYet", "Unschedulable"}


# --- top ------------------------------------------------------------------------------------


def test_top_once_shows_shares_queues_and_phases(fleet: Fleet) -> None:
    fleet.add_worker(worker("w1").capabilities("llm").weight(1).max_in_flight(20))
    fleet.add_worker(worker("w3").capabilities("llm").weight(3).max_in_flight(20))
    fleet.agent("w1", "hold")
    fleet.agent("w3", "hold")
    fleet.operator()
    fleet.wait_all(
        lambda _: all(
            fleet.worker(n).get("status", {}).get("phase") == "Ready" for n in ("w1", "w3")
        )
    )
    for i in range(8):
        fleet.add_task(task(f"job-{i}").requires("llm"))
    fleet.add_task(task("impossible").requires("quantum"))
    fleet.wait_all(
        lambda items: sum((t.get("status") or {}).get("phase") == "Running" for t in items) == 8
    )
    fleet.wait_all(lambda _: fleet.worker("w3").get("status", {}).get("inFlight") == 6)

    data = json.loads(agentq(fleet, "top", *ns(fleet), "-o", "json").stdout)
    rows = {w["name"]: w for w in data["workers"]}
    assert rows["w1"]["weightShare"] == 0.25 and rows["w3"]["weightShare"] == 0.75
    # The DRR core gives the weight-3 worker three of every four equal tasks.
    assert (rows["w1"]["inFlight"], rows["w3"]["inFlight"]) == (2, 6)
    assert data["phases"][fleet.namespace] == {"Pending": 1, "Running": 8}
    (queue,) = data["queues"]
    assert queue["capabilities"] == ["quantum"] and queue["unschedulable"] is True

    text = agentq(fleet, "top", *ns(fleet), "--once")
    assert text.returncode == 0, text.stderr
    assert "WEIGHT SHARE" in text.stdout and "0/0 unschedulable" in text.stdout
    assert "Running 8" in text.stdout
    everywhere = agentq(fleet, "top", "-A", "--once")
    assert fleet.namespace in everywhere.stdout


def test_top_live_refreshes_on_a_terminal_until_ctrl_c(fleet: Fleet) -> None:
    fleet.add_worker(worker("w1").capabilities("llm"))
    primary, secondary = pty.openpty()
    proc = subprocess.Popen(
        [AGENTQ, "top", *ns(fleet), "--interval", "0.5"],
        stdin=secondary,
        stdout=secondary,
        stderr=secondary,
        env={
            "KUBECONFIG": fleet.kubeconfig,
            "PATH": f"{BIN}:/usr/bin:/bin",
            "TERM": "xterm",
            "COLUMNS": "150",
            "LINES": "40",
        },
    )
    os.close(secondary)
    seen = b""
    try:
        deadline = time.monotonic() + 60
        # Wait for the view, then for a worker created while it runs to appear in it.
        while b"w1" not in seen and time.monotonic() < deadline:
            if select.select([primary], [], [], 0.5)[0]:
                seen += os.read(primary, 65536)
        fleet.add_worker(worker("late-joiner").capabilities("llm"))
        while b"late-joiner" not in seen and time.monotonic() < deadline:
            if select.select([primary], [], [], 0.5)[0]:
                seen += os.read(primary, 65536)
        assert b"agentq top" in seen and b"late-joiner" in seen, seen[-2000:]
        proc.send_signal(signal.SIGINT)
        # Read on, as a terminal does: a view that cannot write its last frame (the pty's
        # buffer full) cannot exit either.
        deadline = time.monotonic() + 10
        while proc.poll() is None and time.monotonic() < deadline:
            if select.select([primary], [], [], 0.2)[0]:
                try:
                    os.read(primary, 65536)
                except OSError:  # EIO: the child closed its side
                    break
        assert proc.wait(timeout=5) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(primary)


def test_top_rejects_a_bad_interval(fleet: Fleet) -> None:
    done = agentq(fleet, "top", "--interval", "0.01")
    assert done.returncode == 2 and "--interval" in done.stderr


# --- drain / uncordon --------------------------------------------------------------------------


def test_drain_stops_dispatch_waits_for_claims_and_uncordon_resumes(fleet: Fleet) -> None:
    fleet.add_worker(worker("a").capabilities("llm").max_in_flight(2))
    # Long enough to outlast the CLI's start on a loaded machine, so drain finds both held.
    fleet.agent("a", "complete", work_seconds=20)
    fleet.operator()
    fleet.add_task(task("first").requires("llm"))
    fleet.add_task(task("second").requires("llm"))
    fleet.wait_all(
        lambda items: all((t.get("status") or {}).get("phase") == "Running" for t in items)
    )

    started = time.monotonic()
    drained = agentq(fleet, "drain", "a", *ns(fleet), "--wait", "--timeout", "80s", timeout=120)
    assert drained.returncode == 0, drained.stderr
    assert "agentworker/a cordoned: no new tasks go to it" in drained.stdout
    assert "waiting for 2 task(s) to end: first, second" in drained.stdout
    assert "holds no claims: it is drained" in drained.stdout
    assert time.monotonic() - started < 90
    assert fleet.worker("a")["spec"]["paused"] is True
    assert phase(fleet, "first") == phase(fleet, "second") == "Succeeded"
    fleet.wait_all(lambda _: fleet.worker("a").get("status", {}).get("phase") == "Draining")

    fleet.add_task(task("third").requires("llm"))
    pending = json.loads(agentq(fleet, "explain", "third", *ns(fleet), "-o", "json").stdout)
    assert [f["code"] for f in pending["findings"]] == ["NoReadyWorker"]

    again = agentq(fleet, "drain", "a", *ns(fleet), "-o", "json")
    report = json.loads(again.stdout)
    assert report["wasPaused"] is True and report["drained"] is True
    # Several passes went by during those two commands: nothing went to the drained
    # worker (for minutes: tests/unit/operator/test_stays_put.py).
    assert phase(fleet, "third") == "Pending"

    resumed = agentq(fleet, "uncordon", "a", *ns(fleet))
    assert resumed.returncode == 0, resumed.stderr
    assert "uncordoned: it takes new tasks again" in resumed.stdout
    assert fleet.worker("a")["spec"]["paused"] is False
    fleet.wait_phase("third", "Running", "Succeeded", timeout=30)


def test_drain_times_out_listing_what_is_still_held(fleet: Fleet) -> None:
    fleet.add_worker(worker("a").capabilities("llm"))
    fleet.agent("a", "hold")
    fleet.operator()
    fleet.add_task(task("forever").requires("llm"))
    running = fleet.wait_phase("forever", "Running")["status"]
    started = time.monotonic()
    done = agentq(fleet, "drain", "a", *ns(fleet), "--wait", "--timeout", "2", "-o", "json")
    waited = time.monotonic() - started
    assert done.returncode == 5, (done.stdout, done.stderr)
    assert 2 <= waited < 60  # the timeout, plus the CLI's start on a loaded machine
    report = json.loads(done.stdout)
    assert report["drained"] is False
    (claim,) = report["holding"]
    assert claim["name"] == "forever" and claim["phase"] == "Running"
    assert claim["fencingToken"] == running["fencingToken"]
    text = agentq(fleet, "drain", "a", *ns(fleet), "--wait", "--timeout", "1")
    assert text.returncode == 5
    assert "still holds 1 claim(s):" in text.stdout and "forever  Running" in text.stdout
    assert "timed out after 1.0s with claims still held" in text.stderr
    # The claim was never disturbed: same attempt, still running.
    assert fleet.task("forever")["status"]["fencingToken"] == running["fencingToken"]


def test_drain_and_uncordon_bad_arguments(fleet: Fleet) -> None:
    missing = agentq(fleet, "drain", "ghost", *ns(fleet))
    assert missing.returncode == 4 and "agentworker 'ghost'" in missing.stderr
    assert agentq(fleet, "uncordon", "ghost", *ns(fleet)).returncode == 4
    bad = agentq(fleet, "drain", "a", "--timeout", "soon")
    assert bad.returncode == 2 and "'soon' is not a duration" in bad.stderr
    assert agentq(fleet, "drain").returncode == 2


# --- requeue ----------------------------------------------------------------------------------


def test_requeue_all_dead_lettered_at_a_rate_says_how_many_and_which(fleet: Fleet) -> None:
    fleet.add_worker(worker("flaky").capabilities("flaky").max_in_flight(10))
    fleet.add_worker(worker("ok").capabilities("llm"))
    flaky = fleet.agent("flaky", "fail", work_seconds=0.1)
    fleet.agent("ok", "hold")
    fleet.operator()
    poison = [f"poison-{i}" for i in range(5)]
    for name in poison:
        fleet.add_task(task(name).requires("flaky").max_reclaims(0).label("team", "nlp"))
    fleet.add_task(task("healthy").requires("llm").label("team", "nlp"))
    fleet.wait_all(
        lambda items: all(
            (t.get("status") or {}).get("phase") == "DeadLettered"
            for t in items
            if t["metadata"]["name"].startswith("poison")
        )
    )

    dry = agentq(fleet, "requeue", "--all-dead-lettered", *ns(fleet), "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert f"5 DeadLettered task(s) of 6 matched in namespace {fleet.namespace}" in dry.stdout
    assert ", ".join(poison) in dry.stdout
    assert "dry run: would requeue 5 task(s); nothing changed" in dry.stdout
    assert all(
        protocol.ANNOTATION_REQUEUE not in (fleet.task(n)["metadata"].get("annotations") or {})
        for n in poison
    )

    flaky.kill()
    fleet.agent("flaky", "complete", work_seconds=0.1)  # the cause is fixed
    started = time.monotonic()
    done = agentq(fleet, "requeue", "--all-dead-lettered", *ns(fleet), "--rate", "5", "-o", "json")
    elapsed = time.monotonic() - started
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert [r["name"] for r in report["requested"]] == poison
    assert elapsed >= 4 / 5  # five requests at 5/s: four gaps of 0.2 s
    for record in report["requested"]:
        final = fleet.wait_phase(record["name"], "Succeeded", timeout=30)
        assert final["status"]["requeueHandled"] == record["request"]
        assert final["metadata"]["annotations"][protocol.ANNOTATION_REQUEUE] == record["request"]

    nothing = agentq(fleet, "requeue", "--all-dead-lettered", *ns(fleet))
    assert nothing.returncode == 0
    assert "0 DeadLettered task(s) of 6 matched" in nothing.stdout


def test_requeue_by_name_and_selector_with_bad_arguments(fleet: Fleet) -> None:
    fleet.add_worker(worker("a").capabilities("llm"))
    fleet.agent("a", "fatal", work_seconds=0.1)
    fleet.operator()
    fleet.add_task(task("broken").requires("llm").label("batch", "7"))
    fleet.add_task(task("other").requires("llm").label("batch", "8"))
    fleet.add_task(task("never").requires("quantum").label("batch", "7"))
    fleet.wait_phase("broken", "Failed")
    fleet.wait_phase("other", "Failed")

    by_selector = agentq(fleet, "requeue", "-l", "batch=7", *ns(fleet), "-o", "json")
    assert by_selector.returncode == 0, by_selector.stderr
    report = json.loads(by_selector.stdout)
    assert report["matched"] == 2 and [r["name"] for r in report["requested"]] == ["broken"]
    fleet.wait_task(
        "broken",
        lambda b: (
            (b.get("status") or {}).get("requeueHandled") == report["requested"][0]["request"]
        ),
        what="requeue honoured",
    )

    mixed = agentq(fleet, "requeue", "other", "never", "ghost", *ns(fleet))
    assert mixed.returncode == 4  # a name was not found: that is the exit code
    assert "agenttask/other requeued (was Failed" in mixed.stdout
    assert "agenttask/never not requeued: it is Pending" in mixed.stderr
    assert "agenttask 'ghost' not found" in mixed.stderr
    not_requeuable = agentq(fleet, "requeue", "never", *ns(fleet))
    assert not_requeuable.returncode == 1

    for args, message in [
        ((), "which tasks?"),
        (("x", "-l", "a=b"), "not both"),
        (("x", "-A"), "-A/--all-namespaces goes with"),
        (("--all-dead-lettered", "--rate", "0"), "--rate"),
    ]:
        done = agentq(fleet, "requeue", *args)
        assert done.returncode == 2, (args, done.stderr)
        assert message in done.stderr


# --- no cluster -----------------------------------------------------------------------------


VERBS = [
    ("explain", "job"),
    ("top", "--once"),
    ("drain", "w"),
    ("uncordon", "w"),
    ("requeue", "job"),
]


@pytest.mark.parametrize(("verb", "arg"), VERBS)
def test_every_verb_says_what_to_do_without_a_kubeconfig(
    fleet: Fleet, tmp_path: Path, verb: str, arg: str
) -> None:
    done = agentq(
        fleet, verb, arg, env={"KUBECONFIG": str(tmp_path / "absent"), "HOME": str(tmp_path)}
    )
    assert done.returncode == 3, done.stderr
    assert "no kubeconfig found" in done.stderr
    assert "agentq cluster up" in done.stderr


@pytest.mark.parametrize(("verb", "arg"), VERBS)
def test_every_verb_says_when_the_api_server_is_unreachable(
    fleet: Fleet, tmp_path: Path, verb: str, arg: str
) -> None:
    # The real kubeconfig (valid certificates), pointed at a port nobody listens on.
    config = yaml.safe_load(Path(fleet.kubeconfig).read_text())
    for entry in config["clusters"]:
        entry["cluster"]["server"] = f"https://127.0.0.1:{free_port()}"
    dead = tmp_path / "kubeconfig"
    dead.write_text(yaml.safe_dump(config))
    started = time.monotonic()
    done = agentq(fleet, verb, arg, env={"KUBECONFIG": str(dead)})
    assert done.returncode == 3, done.stderr
    assert "cannot reach the API server at https://127.0.0.1:" in done.stderr
    assert "Is the cluster running?" in done.stderr
    assert time.monotonic() - started < 45  # fails in seconds; it does not hang
