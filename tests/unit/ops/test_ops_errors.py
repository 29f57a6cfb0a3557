"""How the ops verbs turn API failures and bad input into exit codes and advice."""

from __future__ import annotations

import json

import click
import pytest
from click.testing import CliRunner

from agentq import kube
from agentq.cli import main
from agentq.kube.sync import SyncClient
from agentq.ops.commands import Duration
from agentq.ops.errors import Exit
from agentq.ops.kube import Cluster, Refused

pytestmark = pytest.mark.unit


def cluster() -> Cluster:
    config = kube.KubeConfig(server="https://127.0.0.1:6443", credentials=kube.Credentials())
    return Cluster(SyncClient(config), namespace="ns", source="test")


def failure(status: int, body: object) -> Refused:
    text = body if isinstance(body, str) else json.dumps(body)
    return Refused(status, body if isinstance(body, dict) else {}, text)


def test_a_missing_object_is_not_found() -> None:
    body = {"kind": "Status", "message": 'agenttasks.agentq.dev "x" not found',
            "details": {"name": "x", "group": "agentq.dev", "kind": "agenttasks"}}  # fmt: skip
    err = cluster()._api_error(failure(404, body), "agenttask 'x'")
    assert err.code is Exit.NOT_FOUND
    assert str(err) == "agenttask 'x' not found: agenttasks.agentq.dev \"x\" not found"


@pytest.mark.parametrize("body", ["404 page not found", {"message": "the server could not find"}])
def test_a_missing_resource_type_means_the_crds_are_not_installed(body: object) -> None:
    err = cluster()._api_error(failure(404, body), "agenttask 'x'")
    assert err.code is Exit.NO_CLUSTER
    assert "kubectl apply -f crds/" in str(err)


def test_refused_credentials_and_forbidden_say_what_to_do() -> None:
    unauthorized = cluster()._api_error(failure(401, {"message": "Unauthorized"}), "")
    assert unauthorized.code is Exit.NO_CLUSTER
    assert "refused our credentials" in str(unauthorized)
    forbidden = cluster()._api_error(
        failure(403, {"message": 'agentworkers.agentq.dev "w" is forbidden'}), ""
    )
    assert forbidden.code is Exit.PARTIAL
    assert "docs/cli.md#permissions" in str(forbidden)
    other = cluster()._api_error(failure(422, {"message": "spec.paused: Invalid value"}), "")
    assert (other.code, str(other)) == (
        Exit.PARTIAL,
        "the API server refused: 422 spec.paused: Invalid value",
    )


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90", 90.0), ("90s", 90.0), ("5m", 300.0), ("1h30m", 5400.0), ("1.5m", 90.0)],
)
def test_durations(text: str, seconds: float) -> None:
    assert Duration().convert(text, None, None) == seconds


@pytest.mark.parametrize("text", ["soon", "", "5x", "m5", "1h 30m"])
def test_bad_durations_are_refused(text: str) -> None:
    with pytest.raises(click.BadParameter, match="is not a duration"):
        Duration().convert(text, None, None)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["requeue"], "which tasks?"),
        (["requeue", "a", "-l", "x=y"], "not both"),
        (["requeue", "a", "-A"], "goes with -l or --all-dead-lettered"),
        (["requeue", "--all-dead-lettered", "--rate", "-1"], "--rate"),
        (["drain"], "Missing argument 'WORKER'"),
        (["top", "--interval", "0"], "--interval"),
        (["explain", "t", "-o", "wide"], "'wide' is not one of"),
    ],
)
def test_usage_errors_exit_2_before_touching_a_cluster(args: list[str], message: str) -> None:
    result = CliRunner().invoke(main, args, env={"KUBECONFIG": "/nonexistent"})
    assert result.exit_code == Exit.USAGE, result.output
    assert message in result.output


def test_every_verb_lists_the_exit_codes_in_its_help() -> None:
    for verb in ("explain", "top", "drain", "uncordon", "requeue"):
        result = CliRunner().invoke(main, [verb, "--help"])
        assert result.exit_code == 0
        assert "Exit codes: 0 ok" in result.output, verb


def test_a_429_with_retry_after_is_asked_once_more() -> None:
    """Just after `kubectl apply -f crds/` the API server answers 429 "storage is
    (re)initializing" with a Retry-After: the verbs wait it out once, as the kubernetes
    client's one retry did (the demo's first listing failed without it)."""
    import http.server
    import threading

    answers = [(429, b'{"message":"storage is (re)initializing"}'), (200, b'{"items":[]}')]

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            status, body = answers.pop(0) if len(answers) > 1 else answers[0]
            self.send_response(status)
            if status == 429:
                self.send_header("Retry-After", "0.1")
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever)
    thread.start()
    config = kube.KubeConfig(
        server=f"http://127.0.0.1:{server.server_address[1]}", credentials=kube.Credentials()
    )
    ops = Cluster(SyncClient(config), namespace="ns", source="test")
    try:
        assert ops.tasks() == []
    finally:
        ops.close()
        server.shutdown()
        server.server_close()
        thread.join()
