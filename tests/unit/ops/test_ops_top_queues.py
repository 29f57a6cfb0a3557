"""``agentq top``'s AgentQueue table: from the queues' status, with an estimated wait
in the live view; and a user who may not list AgentQueues still gets the rest."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from click.testing import CliRunner

from agentq import kube
from agentq.cli import main
from agentq.kube.sync import SyncClient
from agentq.ops import commands
from agentq.ops.fleet import FORBIDDEN_QUEUES, RateWindow, build
from agentq.ops.kube import Cluster
from opsdata import NOW, NS, agent_queue, task, worker

pytestmark = pytest.mark.unit


def tree() -> list[dict]:
    return [
        agent_queue("team-b", parent="org", weight=1, weight_share=0.25, share=0.4, pending=2),
        agent_queue("org", weight=2, weight_share=1.0, share=1.0, pending=8, in_flight=4),
        agent_queue(
            "team-a",
            parent="org",
            weight=3,
            weight_share=0.75,
            share=0.6,
            pending=6,
            in_flight=4,
            max_in_flight=4,
            served=30,
        ),
        agent_queue("lost", parent="gone", ready="NotAttached", weight_share=None),
    ]


def test_each_agent_queue_is_a_row_parents_first_from_its_status() -> None:
    view = build([], [], now=NOW, agent_queues=tree())
    rows = {q.name: q for q in view.agent_queues}
    assert [q.name for q in view.agent_queues] == ["lost", "org", "team-a", "team-b"]
    assert (rows["team-a"].parent, rows["team-a"].depth, rows["org"].depth) == ("org", 1, 0)
    a = rows["team-a"]
    assert (a.weight, a.weight_share, a.share, a.pending) == (3, 0.75, 0.6, 6)
    assert (a.in_flight, a.max_in_flight, a.capped, a.served_cost) == (4, 4, True, 30)
    assert not rows["org"].capped and rows["org"].max_in_flight is None
    assert (rows["lost"].state, rows["lost"].weight_share, rows["org"].state) == (
        "NotAttached",
        None,
        "Ready",
    )
    # One snapshot: no rate, so no estimated wait.
    assert all(q.wait_seconds is None for q in view.agent_queues)
    data = view.to_dict()
    assert data["agentQueues"][2]["maxInFlight"] == 4 and data["agentQueuesNote"] is None


def test_the_wait_is_the_pending_cost_over_the_served_cost_rate() -> None:
    window = RateWindow(seconds=60)
    queues = [agent_queue("team-a", pending=6, served=10), agent_queue("idle", pending=3)]
    window.add(0, queues)
    assert window.rates() == {}
    queues = [agent_queue("team-a", pending=6, served=40), agent_queue("idle", pending=3)]
    window.add(30, queues)
    assert window.rates() == {"team-a": pytest.approx(1.0), "idle": 0.0}
    # The listed pending tasks of the queue cost 2 on average: 6 of them take 12 s.
    tasks = [
        task("a", queue="team-a", cost=1, status={"phase": "Pending"}),
        task("b", queue="team-a", cost=3),
        task("c", queue="team-a", cost=50, status={"phase": "Running", "worker": "w"}),
    ]
    view = build(tasks, [], now=NOW, agent_queues=queues, queue_rates=window.rates())
    rows = {q.name: q for q in view.agent_queues}
    assert rows["team-a"].wait_seconds == pytest.approx(12.0)
    assert rows["idle"].wait_seconds is None  # served nothing lately: no estimate


def test_no_agent_queues_means_no_queue_table_and_no_note() -> None:
    view = build([task("t")], [worker("w", "llm")], now=NOW, agent_queues=[])
    assert view.agent_queues == () and view.agent_queues_note is None


# --- the verb, against an HTTP server that answers as an API server would ---------------


@pytest.fixture
def api() -> Iterator[dict[str, tuple[int, Any]]]:
    """Path -> (status, JSON body); the test fills it, ``top`` reads it."""
    answers: dict[str, tuple[int, Any]] = {}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            status, body = answers.get(self.path.split("?")[0], (404, {"message": "nope"}))
            raw = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02})
    thread.start()
    answers["/port"] = (200, server.server_address[1])
    try:
        yield answers
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def top(api: dict[str, tuple[int, Any]], monkeypatch: pytest.MonkeyPatch, *args: str) -> Any:
    config = kube.KubeConfig(
        server=f"http://127.0.0.1:{api['/port'][1]}", credentials=kube.Credentials()
    )

    opened: list[Cluster] = []

    def connect(*_: object) -> Cluster:
        opened.append(Cluster(SyncClient(config), namespace=NS, source="test"))
        return opened[-1]

    monkeypatch.setattr(commands, "connect", connect)
    api[f"/apis/agentq.dev/v1alpha1/namespaces/{NS}/agenttasks"] = (200, {"items": [task("t")]})
    api[f"/apis/agentq.dev/v1alpha1/namespaces/{NS}/agentworkers"] = (
        200,
        {"items": [worker("w", "llm")]},
    )
    try:
        return CliRunner().invoke(main, ["top", "--once", *args])
    finally:
        for cluster in opened:  # the verb leaves that to the process's exit
            cluster.close()


QUEUES = "/apis/agentq.dev/v1alpha1/agentqueues"


def test_top_shows_the_agent_queue_table(api: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    api[QUEUES] = (200, {"items": tree()})
    result = top(api, monkeypatch)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    header = next(line for line in lines if line.startswith("AGENTQUEUE"))
    assert "WEIGHT SHARE" in header and "IN FLIGHT" in header and "EST. WAIT" not in header
    team_a = next(line for line in lines if line.strip().startswith("team-a"))
    assert team_a.startswith("  team-a") and "4/4" in team_a and "75%" in team_a
    assert "note:" not in result.output


def test_top_without_rights_on_agent_queues_shows_the_rest_and_one_note(
    api: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    api[QUEUES] = (403, {"kind": "Status", "message": "agentqueues is forbidden", "code": 403})
    result = top(api, monkeypatch)
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output
    assert "WORKER" in result.output and "tasks in agents" in result.output
    assert "AGENTQUEUE" not in result.output
    notes = [line for line in result.output.splitlines() if line.startswith("note:")]
    assert notes == [f"note: {FORBIDDEN_QUEUES}"]
    data = json.loads(top(api, monkeypatch, "-o", "json").output)
    assert data["agentQueues"] == [] and data["agentQueuesNote"] == FORBIDDEN_QUEUES


@pytest.mark.parametrize("answer", [(200, {"items": []}), (404, {"message": "not found"})])
def test_top_with_no_agent_queues_shows_no_queue_table(
    api: dict, monkeypatch: pytest.MonkeyPatch, answer: tuple[int, Any]
) -> None:
    """None exist, or the AgentQueue CRD is not installed (an older install)."""
    api[QUEUES] = answer
    result = top(api, monkeypatch)
    assert result.exit_code == 0, result.output
    assert "AGENTQUEUE" not in result.output and "note:" not in result.output
    assert "WORKER" in result.output


BUDGETS = "/apis/agentq.dev/v1alpha1/agentbudgets"


def test_top_shows_the_agent_budgets_use_against_their_limits(
    api: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    api[BUDGETS] = (
        200,
        {
            "items": [
                {
                    "metadata": {"name": "openai"},
                    "spec": {"requestsPerMinute": 60, "maxConcurrent": 2},
                    "status": {
                        "inUse": 2,
                        "usedRequests": 40,
                        "reservedRequests": 2,
                        "waiting": 5,
                        "conditions": [
                            {"type": "Saturated", "status": "True", "reason": "MaxConcurrent"}
                        ],
                    },
                }
            ]
        },
    )
    result = top(api, monkeypatch)
    assert result.exit_code == 0, result.output
    row = next(line for line in result.output.splitlines() if line.startswith("openai"))
    assert "42/60" in row and "2/2" in row and "Saturated (MaxConcurrent)" in row
    data = json.loads(top(api, monkeypatch, "-o", "json").output)
    assert data["agentBudgets"][0]["inUse"] == 2


def test_top_without_rights_on_agent_budgets_shows_the_rest(
    api: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    api[BUDGETS] = (403, {"kind": "Status", "message": "forbidden", "code": 403})
    result = top(api, monkeypatch)
    assert result.exit_code == 0, result.output
    assert "AGENTBUDGET" not in result.output and "WORKER" in result.output
