"""The task verbs (``submit``, ``wait``, ``cancel``) without a cluster: reading manifests,
naming tasks, what cancel does with a task, the exit code of several outcomes, usage
errors; and requeue undoing a cancel in the same write."""

from __future__ import annotations

import http.server
import json
import threading
from pathlib import Path
from typing import Any, ClassVar

import pytest
from click.testing import CliRunner

from agentq import kube, protocol
from agentq.cli import main
from agentq.client import End, Outcome
from agentq.kube.sync import SyncClient
from agentq.ops.commands import EXIT_CODES_HELP
from agentq.ops.errors import PRECEDENCE, Exit, OpsError, worst
from agentq.ops.kube import Cluster
from agentq.ops.tasks import (
    EXIT_BY_END,
    Cancels,
    cancel_verdict,
    outcome_line,
    outcomes_exit,
    read_documents,
    task_name,
)
from builders import task

pytestmark = pytest.mark.unit


def no_stdin() -> str:
    raise AssertionError("stdin read")


def test_manifests_are_read_from_files_directories_lists_and_stdin(tmp_path: Path) -> None:
    (tmp_path / "two.yaml").write_text(task("a").yaml() + "---\n" + task("b").yaml() + "---\n")
    listed = {"apiVersion": "v1", "kind": "List", "items": [task("c").obj(), task("d").obj()]}
    (tmp_path / "dir").mkdir()
    (tmp_path / "dir" / "list.json").write_text(json.dumps(listed))
    (tmp_path / "dir" / "notes.txt").write_text("not a manifest")
    docs = read_documents(
        [str(tmp_path / "two.yaml"), str(tmp_path / "dir"), "-"],
        stdin=lambda: task("e").yaml(),
    )
    assert [d.body["metadata"]["name"] for d in docs] == ["a", "b", "c", "d", "e"]
    assert docs[0].source == f"{tmp_path / 'two.yaml'}#1"
    assert docs[4].source == "-"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("a: [1", "not YAML or JSON"),
        ("- 1\n- 2\n", "a manifest is a mapping, not list"),
        ("", "no manifest in"),
        ("kind: List\nitems: 5\n", "a List's items are a list, not int"),
        ("kind: List\nitems: abc\n", "a List's items are a list, not str"),
        (
            "apiVersion: v\nkind: AgentTask\nspec: {payload: {when: 2024-01-01}}\n",
            "spec.payload.when is a date",
        ),
        ("kind: AgentTask\nspec: {payload: !!binary aGk=}\n", "spec.payload is a bytes"),
        ("kind: AgentTask\nspec: {payload: {1: a}}\n", "has a key that is not a string"),
        ("kind: AgentTask\nspec: {payload: .nan}\n", "spec.payload is a float"),
        (
            "a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n"
            + "".join(
                f"a{i}: &a{i} [*a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, "
                f"*a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}]\n"
                for i in range(1, 10)
            )
            + "kind: AgentTask\nspec: {payload: *a9}\n",
            "values once its YAML aliases are expanded",
        ),
    ],
)
def test_unreadable_manifests_are_bad_arguments(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "t.yaml"
    path.write_text(content)
    with pytest.raises(OpsError, match=message) as raised:
        read_documents([str(path)], stdin=no_stdin)
    assert raised.value.code is Exit.USAGE


def test_a_missing_file_is_a_bad_argument(tmp_path: Path) -> None:
    with pytest.raises(OpsError, match="cannot read") as raised:
        read_documents([str(tmp_path / "absent.yaml")], stdin=no_stdin)
    assert raised.value.code is Exit.USAGE


@pytest.mark.parametrize(
    ("arg", "name"),
    [
        ("job", "job"),
        ("agenttask/job", "job"),
        ("agenttasks/job", "job"),
        ("atask/job", "job"),
        ("agenttask.agentq.dev/job", "job"),
    ],
)
def test_a_task_is_named_as_kubectl_prints_it(arg: str, name: str) -> None:
    assert task_name(arg) == name


def test_another_kind_is_refused() -> None:
    with pytest.raises(Exception, match="is not an AgentTask"):
        task_name("pod/job")


def with_status(**status: Any) -> dict[str, Any]:
    body = task("t").obj()
    body["status"] = status
    return body


def requeued(phase: str, *, handled: str | None = None) -> dict[str, Any]:
    body = with_status(phase=phase, **({"requeueHandled": handled} if handled else {}))
    body["metadata"].setdefault("annotations", {})[protocol.ANNOTATION_REQUEUE] = "r1"
    return body


@pytest.mark.parametrize(
    ("body", "verdict"),
    [
        (with_status(), ("send", "Pending")),
        (with_status(phase="Running"), ("send", "Running")),
        (with_status(phase="Held"), ("send", "Held")),
        (with_status(phase="Cancelled"), ("already", "already Cancelled")),
        (
            {**task("t").cancel().obj(), "status": {"phase": "Running"}},
            ("already", "cancel already requested (it is Running)"),
        ),
        (with_status(phase="Succeeded"), ("finished", "it already finished (Succeeded)")),
        (with_status(phase="DeadLettered"), ("finished", "it already finished (DeadLettered)")),
        (with_status(phase="Failed"), ("finished", "it already finished (Failed)")),
        # a requeue not yet honoured: about to run again, so the cancel is sent
        (requeued("Failed"), ("send", "Failed")),
        (requeued("Cancelled"), ("send", "Cancelled")),
        (requeued("Failed", handled="r1"), ("finished", "it already finished (Failed)")),
    ],
)
def test_what_cancel_does_with_a_task(body: dict[str, Any], verdict: tuple[str, str]) -> None:
    assert cancel_verdict(body) == verdict


def test_cancel_sorts_the_tasks_it_found() -> None:
    cancels = Cancels()
    cancels.sort([with_status(phase="Running"), with_status(phase="Succeeded"),
                  with_status(phase="Cancelled")])  # fmt: skip
    assert cancels.matched == 3 and len(cancels.chosen) == 1
    assert [e["message"] for e in cancels.already] == ["already Cancelled"]
    assert cancels.finished == [
        {"namespace": None, "name": "t", "phase": "Succeeded",
         "message": "it already finished (Succeeded)"}
    ]  # fmt: skip
    assert cancels.to_dict()["selected"] == [{"namespace": None, "name": "t", "phase": "Running"}]


def test_several_outcomes_exit_with_the_worst() -> None:
    def outcomes(*ends: End) -> list[Outcome]:
        return [Outcome("ns", f"t{i}", e) for i, e in enumerate(ends)]

    assert outcomes_exit([]) is Exit.OK
    assert outcomes_exit(outcomes(End.SUCCEEDED, End.SUCCEEDED)) is Exit.OK
    assert outcomes_exit(outcomes(End.SUCCEEDED, End.TIMEOUT)) is Exit.TIMEOUT
    assert outcomes_exit(outcomes(End.TIMEOUT, End.CANCELLED)) is Exit.CANCELLED
    assert outcomes_exit(outcomes(End.CANCELLED, End.DEAD_LETTERED)) is Exit.FAILED
    assert outcomes_exit(outcomes(End.FAILED, End.DELETED)) is Exit.NOT_FOUND
    assert worst([Exit.NOT_FOUND, Exit.PARTIAL]) is Exit.PARTIAL


def test_every_end_has_its_own_exit_code_and_the_help_says_the_order() -> None:
    assert set(EXIT_BY_END) == set(End)
    codes = {EXIT_BY_END[e] for e in End}
    assert codes == {Exit.OK, Exit.FAILED, Exit.CANCELLED, Exit.NOT_FOUND, Exit.TIMEOUT}
    assert set(PRECEDENCE) == set(Exit) - {Exit.USAGE, Exit.INTERRUPTED}
    for code in Exit:
        assert f"{int(code)} " in EXIT_CODES_HELP
    order = ", ".join(str(int(c)) for c in PRECEDENCE if c is not Exit.OK)
    assert f"the first of {order}." in EXIT_CODES_HELP


def test_exit_codes_in_docs_match() -> None:
    text = (Path(__file__).parents[3] / "docs" / "cli.md").read_text()
    for code in Exit:
        assert f"\n| {int(code)} |" in text, code


def test_an_outcome_line_shows_a_result_or_the_error() -> None:
    ok = Outcome("ns", "a", End.SUCCEEDED, {"result": {"by": "w"}, "resultRef": "s3://x"})
    assert outcome_line(ok) == 'agenttask/a Succeeded: {"by":"w"} (result at s3://x)'
    long = outcome_line(Outcome("ns", "a", End.SUCCEEDED, {"result": "x" * 500}))
    assert len(long) < 240 and long.endswith("…")
    failed = Outcome("ns", "b", End.FAILED, {"error": {"reason": "AgentError", "message": "m"}})
    assert outcome_line(failed) == "agenttask/b Failed: AgentError: m"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["wait"], "which tasks?"),
        (["wait", "a", "-l", "x=y"], "not both"),
        (["wait", "a", "-A"], "-A/--all-namespaces goes with -l"),
        (["wait", "a", "--for", "Running"], "'Running' is not 'finished'"),
        (["wait", "a", "--timeout", "soon"], "is not a duration"),
        (["wait", "pod/a"], "is not an AgentTask"),
        (["cancel"], "which tasks?"),
        (["cancel", "a", "--rate", "0"], "--rate"),
        (["cancel", "a", "--rate", "nan"], "not a finite number"),
        (["cancel", "a", "--rate", "inf"], "--rate"),
        (["cancel", "a", "--rate", "1e-300"], "--rate"),
        (["submit"], "Missing option '-f'"),
        (["submit", "-f", "x.yaml", "--timeout", "5"], "--timeout goes with --wait"),
        (["submit", "-f", "x.yaml", "--wait", "--dry-run"], "creates nothing to wait for"),
    ],
)
def test_usage_errors_exit_2_before_touching_a_cluster(args: list[str], message: str) -> None:
    result = CliRunner().invoke(main, args, env={"KUBECONFIG": "/nonexistent"})
    assert result.exit_code == Exit.USAGE, result.output
    assert message in result.output


def test_a_manifest_of_another_kind_is_refused_before_connecting(tmp_path: Path) -> None:
    path = tmp_path / "pod.yaml"
    path.write_text("apiVersion: v1\nkind: Pod\nmetadata: {name: p}\n")
    result = CliRunner().invoke(main, ["submit", "-f", str(path)], env={"KUBECONFIG": "/none"})
    assert result.exit_code == Exit.USAGE, result.output
    assert "expected apiVersion agentq.dev/v1alpha1 and kind AgentTask, got v1 Pod" in result.output


@pytest.mark.parametrize(
    ("manifest", "args"),
    [
        ("metadata: {name: t}", ["-n", "../../x"]),
        ("metadata: {name: t, namespace: ../../x}", []),
        ("metadata: {name: a/b}", ["-n", "ns"]),
    ],
)
def test_a_name_that_would_be_another_path_is_refused_before_connecting(
    manifest: str, args: list[str]
) -> None:
    """A name or namespace is part of the request's path: '../../x' would address another
    resource."""
    text = f"apiVersion: agentq.dev/v1alpha1\nkind: AgentTask\n{manifest}\n"
    result = CliRunner().invoke(
        main, ["submit", "-f", "-", *args], input=text, env={"KUBECONFIG": "/none"}
    )
    assert result.exit_code == Exit.USAGE, result.output
    assert "is not a Kubernetes name" in result.output


def test_the_verbs_list_the_exit_codes_in_their_help() -> None:
    for verb in ("submit", "wait", "cancel"):
        result = CliRunner().invoke(main, [verb, "--help"])
        assert result.exit_code == 0
        assert "Exit codes: 0 ok" in result.output, verb
        assert "7 a task was Cancelled" in " ".join(result.output.split())


class Recorder(http.server.BaseHTTPRequestHandler):
    """Answers every PATCH with the body it was sent, and keeps it."""

    patches: ClassVar[list[Any]] = []

    def do_PATCH(self) -> None:
        sent = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        Recorder.patches.append(sent)
        raw = json.dumps(sent).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def log_message(self, *args: object) -> None:
        pass


@pytest.mark.parametrize(("cancelled", "spec"), [(True, {"cancel": False}), (False, None)])
def test_a_requeue_undoes_a_cancel_in_the_same_write(cancelled: bool, spec: Any) -> None:
    """Else the operator, seeing spec.cancel still set, cancels the task again at once."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    thread = threading.Thread(target=server.serve_forever)
    thread.start()
    Recorder.patches = []
    config = kube.KubeConfig(
        server=f"http://127.0.0.1:{server.server_address[1]}", credentials=kube.Credentials()
    )
    ops = Cluster(SyncClient(config), namespace="ns", source="test")
    body = task("t").cancel(cancelled).namespace("ns").obj()
    body["metadata"]["resourceVersion"] = "7"
    try:
        ops.request_requeue(body, "r1")
    finally:
        ops.close()
        server.shutdown()
        server.server_close()
        thread.join()
    [patch] = Recorder.patches
    assert patch["metadata"]["resourceVersion"] == "7"
    assert patch.get("spec") == spec
