"""The alerts and the dashboard in monitoring/, checked by a real Prometheus.

A Prometheus process (Debian's ``prometheus`` package, installed by ``make``) scrapes a
real operator every second during short scenarios on the real API server: a healthy
run fires nothing; a poison task fires AgentqDeadLettersRising and AgentqReclaimsHigh
(reason AgentError) and nothing else; the operator killed fires AgentqNoLeader; a task
no worker can take fires AgentqTasksUnschedulable (and AgentqQueueStalled's expression
selects it); an API server killed fires AgentqWatchUnhealthy. The
rules are loaded as shipped except that ``for:`` is 0 s (the promtool unit tests in
monitoring/agentq-rules.test.yaml pin the real durations). Every dashboard query is
valid PromQL for that Prometheus and names only metrics the operator (or the sidecar,
for the claim port's panels and AgentqSidecarClaimTLSFailing) declares.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import re
import shutil
import signal
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import generate_latest

from agentq.controlplane.cluster import free_port
from agentq.sidecar import metrics as sidecar_metrics
from builders import task, worker
from fleet import AGENTQ, Fleet

MONITORING = Path(__file__).resolve().parents[2] / "monitoring"
RULES = MONITORING / "agentq-rules.yaml"
_METRIC = re.compile(r"(?<![:\w])((?:agentq|process)_[a-z0-9_]+)(?![:\w(])")


def tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is not installed: `make system-deps` installs Debian's prometheus")
    return path


def _die_with_parent() -> None:
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class Prometheus:
    """A Prometheus process on a free port with its own storage; stopped by pid."""

    def __init__(self, workdir: Path, target: str, rules: Path) -> None:
        self.port = free_port()
        config = {
            "global": {
                "scrape_interval": "1s",
                "evaluation_interval": "1s",
                "scrape_timeout": "1s",
            },
            "rule_files": [str(rules)],
            "scrape_configs": [{"job_name": "agentq", "static_configs": [{"targets": [target]}]}],
        }
        path = workdir / "prometheus.yml"
        path.write_text(yaml.safe_dump(config))
        self.log = workdir / "prometheus.log"
        with open(self.log, "wb") as out:
            self.popen = subprocess.Popen(
                [
                    tool("prometheus"),
                    f"--config.file={path}",
                    f"--storage.tsdb.path={workdir / 'data'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                    "--log.level=warn",
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                preexec_fn=_die_with_parent,
            )
        self.wait(lambda: self._get("/-/ready") is not None, 60, "Prometheus ready")

    def _get(self, path: str) -> bytes | None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=5) as rsp:
                body: bytes = rsp.read()
                return body
        except OSError:
            return None

    def api(self, path: str, **params: str) -> Any:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        with urllib.request.urlopen(
            f"http://127.0.0.1:{self.port}/api/v1/{path}{query}", timeout=10
        ) as rsp:
            body = json.loads(rsp.read())
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self.api("query", query=expr)["result"]
        return result

    def firing(self) -> dict[str, list[dict[str, str]]]:
        """alertname -> the label sets of its firing alerts."""
        out: dict[str, list[dict[str, str]]] = {}
        for alert in self.api("alerts")["alerts"]:
            if alert["state"] == "firing":
                out.setdefault(alert["labels"]["alertname"], []).append(alert["labels"])
        return out

    def wait(self, done: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not done():
            if self.popen.poll() is not None:
                raise AssertionError(f"prometheus exited: {self.log.read_text()[-2000:]}")
            if time.monotonic() > deadline:
                raise AssertionError(f"{what}: not within {timeout}s")
            time.sleep(0.5)

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()


@pytest.fixture
def start_prometheus(tmp_path: Path) -> Iterator[Callable[[str], Prometheus]]:
    started: list[Prometheus] = []

    def start(target: str) -> Prometheus:
        # The shipped rules with `for:` made 0 s, so a short scenario can see them fire.
        fast = tmp_path / "agentq-rules.yaml"
        fast.write_text(re.sub(r"(?m)^(\s+for:) \S+$", r"\1 0s", RULES.read_text()))
        instance = Prometheus(tmp_path, target, fast)
        started.append(instance)
        return instance

    yield start
    for instance in started:
        instance.stop()


def test_the_rules_pass_promtool_and_both_files_say_the_same() -> None:
    promtool = tool("promtool")
    checked = subprocess.run(
        [promtool, "check", "rules", str(RULES)], capture_output=True, text=True, check=False
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS: 18 rules found" in checked.stdout
    tested = subprocess.run(
        [promtool, "test", "rules", "agentq-rules.test.yaml"],
        cwd=MONITORING,
        capture_output=True,
        text=True,
        check=False,
    )
    assert tested.returncode == 0, tested.stdout + tested.stderr
    wrapped = yaml.safe_load((MONITORING / "prometheusrule.yaml").read_text())
    assert wrapped["kind"] == "PrometheusRule"
    assert wrapped["spec"] == yaml.safe_load(RULES.read_text())
    alerts = {r["alert"] for g in wrapped["spec"]["groups"] for r in g["rules"] if "alert" in r}
    docs = (MONITORING.parent / "docs" / "operations.md").read_text()
    for alert in alerts:  # every alert has its runbook
        assert f"### {alert}" in docs, alert


def declared(metrics_text: str) -> set[str]:
    return set(re.findall(r"^# TYPE (\S+) ", metrics_text, flags=re.M))


def used_metrics(expr: str) -> set[str]:
    names = set()
    for name in _METRIC.findall(expr):
        for suffix in ("_bucket", "_sum", "_count"):
            name = name.removesuffix(suffix)
        names.add(name)
    return names


def test_alerts_fire_on_their_fault_and_not_on_a_healthy_run(
    fleet: Fleet, start_prometheus: Callable[[str], Prometheus]
) -> None:
    fleet.add_worker(worker("a").capabilities("llm").max_in_flight(4))
    fleet.add_worker(worker("flaky").capabilities("flaky"))
    fleet.agent("a", "complete", work_seconds=0.3)
    fleet.agent("flaky", "fail", work_seconds=0.2)
    port = free_port()
    operator = fleet.operator("--metrics-port", str(port))
    prom = start_prometheus(f"127.0.0.1:{port}")
    prom.wait(lambda: bool(prom.query("agentq_leader == 1")), 60, "the operator scraped, leading")

    # Healthy: eight tasks complete. Nothing fires, nothing is even pending.
    for i in range(8):
        fleet.add_task(task(f"ok-{i}").requires("llm"))
    fleet.wait_all(
        lambda items: all((t.get("status") or {}).get("phase") == "Succeeded" for t in items)
    )
    prom.wait(
        lambda: prom.query('sum(agentq_completions_total{outcome="Succeeded"}) == 8') != [],
        30,
        "the completions scraped",
    )
    time.sleep(5)  # several more scrapes and rule evaluations
    assert prom.api("alerts")["alerts"] == []
    assert prom.query("namespace:agentq_dead_letters:increase15m > 0") == []

    # Fault: a poison task. Its dead letter and its reclaims fire, nothing else; the agent's
    # own reason ("AgentError") is counted as "Reported" (agent text is no label value).
    fleet.add_task(task("poison").requires("flaky").max_reclaims(2).backoff(initial=0.2, max=1))
    fleet.wait_phase("poison", "DeadLettered", timeout=60)
    prom.wait(
        lambda: {"AgentqDeadLettersRising", "AgentqReclaimsHigh"} <= set(prom.firing()),
        60,
        "the poison task's alerts firing",
    )
    time.sleep(3)
    firing = prom.firing()
    assert set(firing) == {"AgentqDeadLettersRising", "AgentqReclaimsHigh"}, firing
    assert [a["namespace"] for a in firing["AgentqDeadLettersRising"]] == [fleet.namespace]
    assert [a["reason"] for a in firing["AgentqReclaimsHigh"]] == ["Reported"]
    (dead,) = prom.query("namespace:agentq_dead_letters:increase15m")
    assert float(dead["value"][1]) == 1.0  # the counter was born at 1: still counted
    (reclaimed,) = prom.query('reason:agentq_reclaims:increase15m{reason="Reported"}')
    assert float(reclaimed["value"][1]) == 3.0  # maxReclaims + 1 failed attempts

    # Every dashboard query is valid here and names only metrics the operator declares.
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as rsp:
        exported = declared(rsp.read().decode())
    # The plain HTTP claim port has no TLS sample, and so no TLS alert (not even pending).
    assert prom.query("agentq_claim_tls_ready or agentq_claim_tls_not_after_seconds") == []
    # ... and the sidecars' (AgentqSidecarClaimTLSFailing, the claim port row).
    exported |= declared(generate_latest(sidecar_metrics.REGISTRY).decode())
    dashboard = json.loads((MONITORING / "grafana-dashboard.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    rules = yaml.safe_load(RULES.read_text())
    exprs += [r["expr"] for g in rules["groups"] for r in g["rules"]]
    used: set[str] = set()
    for expr in exprs:
        concrete = expr.replace("$__rate_interval", "1m").replace("$namespace", ".*")
        prom.query(concrete)  # asserts status success: the query parses and runs
        used |= used_metrics(expr)
    assert used - exported == set(), "the rules or the dashboard name undeclared metrics"

    # Fault: the operator dies. No replica leads.
    operator.kill()
    prom.wait(lambda: "AgentqNoLeader" in prom.firing(), 60, "AgentqNoLeader firing")


def test_the_dashboard_is_grafana_json_with_a_datasource_and_namespace_variable() -> None:
    dashboard = json.loads((MONITORING / "grafana-dashboard.json").read_text())
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["namespace"]["includeAll"] is True
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            continue
        assert panel["datasource"]["uid"] == "${datasource}"
        assert panel["targets"] and all(t["expr"] for t in panel["targets"])
        with contextlib.suppress(KeyError):
            assert panel["gridPos"]["w"] <= 24
    assert os.path.getsize(MONITORING / "grafana-dashboard.json") < 100_000


def test_queue_alerts_fire_on_their_fault(
    fleet: Fleet, start_prometheus: Callable[[str], Prometheus]
) -> None:
    fleet.add_worker(worker("a").capabilities("llm"))
    fleet.agent("a", "hold")
    port = free_port()
    fleet.operator("--metrics-port", str(port))
    prom = start_prometheus(f"127.0.0.1:{port}")
    prom.wait(lambda: bool(prom.query("agentq_leader == 1")), 60, "the operator scraped, leading")
    ns = fleet.namespace

    # Unschedulable: a task needing a capability no worker has.
    fleet.add_task(task("impossible").requires("quantum"))
    prom.wait(
        lambda: "AgentqTasksUnschedulable" in prom.firing(), 60, "AgentqTasksUnschedulable firing"
    )
    assert [a["namespace"] for a in prom.firing()["AgentqTasksUnschedulable"]] == [ns]

    # A stalled queue: the oldest Pending task's age grows. The alert's own threshold is
    # 15 minutes; its expression is evaluated here with the threshold at 3 s.
    stalled = next(
        r["expr"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]
        if r.get("alert") == "AgentqQueueStalled"
    )  # fmt: skip
    assert stalled.strip().endswith("> 900")
    prom.wait(lambda: bool(prom.query(stalled.replace("> 900", "> 3"))), 60, "a stalled queue")
    (row,) = prom.query(stalled.replace("> 900", "> 3"))
    assert (row["metric"]["namespace"], row["metric"]["capabilities"]) == (ns, "quantum")

    # (AgentqOperatorLoopLag is pinned by the promtool tests only: the operator's
    # agentq_loop_lag_seconds holds the last watchdog tick's lag, which after a stall is
    # back to 0 within milliseconds, so no scrape sees it; see docs/operations.md.)


def _cluster(*args: str, state_dir: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [AGENTQ, "cluster", *args, "--state-dir", str(state_dir)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


@pytest.mark.slow
@pytest.mark.xdist_group("own-cluster")
def test_watch_alert_fires_when_the_api_server_dies(
    tmp_path: Path, start_prometheus: Callable[[str], Prometheus]
) -> None:
    # A control plane of its own (started as a user does), as this test kills its API server.
    plane = tmp_path / "plane"
    started = _cluster("up", state_dir=plane)
    assert started.returncode == 0, started.stderr
    operator = None
    try:
        state = json.loads(_cluster("status", "--json", state_dir=plane).stdout)
        env = {**os.environ, "KUBECONFIG": state["kubeconfig"]}
        crds = MONITORING.parent / "crds"
        subprocess.run(
            [state["binaries"]["kubectl"], "apply", "-f", str(crds)],
            env=env,
            check=True,
            capture_output=True,
        )
        port = free_port()
        with open(tmp_path / "operator.log", "wb") as log:
            operator = subprocess.Popen(
                [AGENTQ, "operator", "--metrics-port", str(port), "--reconcile-interval", "0.5",
                 "--no-leader-election"],
                env=env, stdout=log, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent,
            )  # fmt: skip
        prom = start_prometheus(f"127.0.0.1:{port}")
        prom.wait(lambda: bool(prom.query("agentq_leader == 1")), 60, "the operator scraped")
        prom.wait(
            lambda: bool(prom.query("min(agentq_watch_healthy) == 1")), 60, "the watches healthy"
        )
        assert "AgentqWatchUnhealthy" not in prom.firing()

        os.kill(state["pids"]["kube-apiserver"], signal.SIGKILL)
        prom.wait(
            lambda: "AgentqWatchUnhealthy" in prom.firing(), 90, "AgentqWatchUnhealthy firing"
        )
        resources = {a["resource"] for a in prom.firing()["AgentqWatchUnhealthy"]}
        assert resources and resources <= {"agenttasks", "agentworkers", "leases"}
    finally:
        if operator is not None and operator.poll() is None:
            operator.terminate()
            try:
                operator.wait(timeout=15)
            except subprocess.TimeoutExpired:
                operator.kill()
                operator.wait()
        stopped = _cluster("down", state_dir=plane)
        assert stopped.returncode == 0, stopped.stderr
