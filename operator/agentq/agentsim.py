"""``agentq agent-sim``: a simulated agent that talks ONLY to its sidecar, over HTTP.

It is what demos and integration tests run beside ``agentq sidecar``: a real
process using the public client (``agentq.agent``) and, optionally, a fenced
sink (``agentq.fencing``), never the Kubernetes API. For each new attempt it
behaves as told:

- ``complete``: heartbeat; do the work (one blocking call of ``--work-seconds``,
  or of the payload's ``workSeconds`` when it is a number from 0 to 3600, like a
  model call that checks nothing while it runs); write the output to the
  sink; report Succeeded with ``{"by": <worker>}``
- ``fail``:     the same, then report a retryable failure
- ``fatal``:    the same, then report a non-retryable failure
- ``hold``:     heartbeat with a new progress marker every beat, forever
- ``hang``:     never heartbeat (a hung agent: its sidecar stops renewing)
- ``stuck``:    heartbeat forever without progress (a busy loop that beats)

With ``--sink URL`` it claims the task's key in the sink with its token when it
starts (``fence``) and writes its output under that key when the work is done,
and writes and reports even if it was paused in between: the sink's fence and
the sidecar's 409 are what stop a zombie, and this process shows both. Every
event is one JSON line on stdout (``assigned``, ``sink-written``,
``sink-refused``, ``reported``, ``lost``, ``revoked``), for tests and people to read.

Budgets (docs/budgets.md): a task whose payload has ``"throttled": {"budget",
"retryAfterSeconds"}`` reports that throttle as its work starts (a provider's 429),
and one with ``"usage": {"<budget>": {"requests": n, "tokens": n}}`` records that
usage (``lease.record_usage``) when its work is done, so its report carries it
(``complete``, ``fail``, ``fatal``).

SIGTERM (the pod scaled down or evicted): ask the sidecar to drain (no new task
for this worker), finish the attempts in hand, and exit once none is left and the
sidecar lists none (``drained`` then). Its claims are never left to expire.

``pair_commands`` builds the argv of a sidecar + agent-sim pair (one agent pod's
two containers as processes), for the demo and the tests.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import click

from agentq.agent import (
    DEFAULT_TOKEN_FILE,
    TOKEN_FILE_ENV,
    AgentError,
    Assignment,
    Cancelled,
    HeldLease,
    LeaseLost,
    SidecarClient,
    SidecarUnavailable,
)

BEHAVIOURS = ("complete", "fail", "fatal", "hold", "hang", "stuck")
_print_lock = threading.Lock()


def emit(event: str, **fields: Any) -> None:
    with _print_lock:
        print(json.dumps({"event": event, **fields}), flush=True)


def pair_commands(
    *,
    worker: str,
    namespace: str,
    port: int,
    token_file: str,
    metrics_port: int = 0,
    behaviour: str = "complete",
    kubeconfig: str | None = None,
    identity: str | None = None,
    sink: str | None = None,
    sidecar_flags: dict[str, Any] | None = None,
    agent_flags: dict[str, Any] | None = None,
    python: str = sys.executable,
) -> tuple[list[str], list[str]]:
    """The argv of a sidecar and of its agent-sim, talking over 127.0.0.1:``port`` with
    the secret the sidecar writes to ``token_file``; the sidecar's metrics and health on
    127.0.0.1:``metrics_port`` (0: any free port, shown in its serving line).

        ``sidecar_flags`` / ``agent_flags`` map option names (``worker_lease_seconds``,
        ``capabilities``; ``work_seconds``, ``beat_seconds``) to values.
    """
    if behaviour not in BEHAVIOURS:
        raise ValueError(f"unknown behaviour {behaviour!r}; one of {', '.join(BEHAVIOURS)}")
    sidecar = [
        python,
        "-m",
        "agentq.cli",
        "sidecar",
        "--worker",
        worker,
        "--namespace",
        namespace,
        "--listen",
        f"127.0.0.1:{port}",
        "--token-file",
        str(token_file),
        "--metrics-listen",
        f"127.0.0.1:{metrics_port}",
    ]
    if kubeconfig:
        sidecar += ["--kubeconfig", kubeconfig]
    if identity:
        sidecar += ["--identity", identity]
    sidecar += _flags(sidecar_flags or {})
    agent = [
        python,
        "-m",
        "agentq.cli",
        "agent-sim",
        "--sidecar",
        f"http://127.0.0.1:{port}",
        "--token-file",
        str(token_file),
        "--behaviour",
        behaviour,
    ]
    if sink:
        agent += ["--sink", sink]
    agent += _flags(agent_flags or {})
    return sidecar, agent


def _flags(options: dict[str, Any]) -> list[str]:
    out: list[str] = []
    for key, value in options.items():
        out += [f"--{key.replace('_', '-')}", str(value)]
    return out


MAX_WORK_SECONDS = 3600.0


def work_seconds(payload: dict[str, Any], default: float) -> float:
    """How long an attempt's work takes: the payload's ``workSeconds`` (a number from 0
    to ``MAX_WORK_SECONDS``: tasks of different lengths in one run), else ``default``."""
    value = payload.get("workSeconds")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return default
    if not 0 <= value <= MAX_WORK_SECONDS:  # NaN fails both
        return default
    return float(value)


class AgentSim:
    def __init__(
        self,
        client: SidecarClient,
        *,
        behaviour: str,
        work_seconds: float,
        beat_seconds: float | None,
        sink_url: str | None,
    ) -> None:
        self.client = client
        self.behaviour = behaviour
        self.work_seconds = work_seconds
        self.beat_seconds = beat_seconds
        self.sink_url = sink_url
        self.stop = threading.Event()
        self._working: set[threading.Thread] = set()
        self._lock = threading.Lock()

    def run(self) -> None:
        emit("started", behaviour=self.behaviour, sidecar=self.client.url)
        for assignment in self.client.assignments(stop=self.stop):
            emit(
                "assigned",
                task=assignment.task,
                token=assignment.token,
                attempt=assignment.attempt,
            )
            thread = threading.Thread(
                target=self._attempt, args=(assignment,), name=assignment.task, daemon=True
            )
            with self._lock:
                self._working.add(thread)
            thread.start()

    def busy(self) -> int:
        with self._lock:
            return len(self._working)

    def drain(self, *, quiet_seconds: float = 3.0, poll: float = 0.5) -> None:
        """Tell the sidecar to drain, keep taking what it still hands out (a grant in
        flight when the operator heard), and return once nothing is in hand and the
        sidecar has listed nothing for ``quiet_seconds``."""
        try:
            self.client.drain()
        except Exception as err:  # an older sidecar, or away: finish what is in hand
            emit("drain-refused", why=repr(err))
        emit("draining", busy=self.busy())
        quiet_since: float | None = None
        while True:
            try:
                listed = len(self.client.list()[1])
            except Exception:
                listed = 0  # the sidecar is away: nothing more will come
            now = time.monotonic()
            if self.busy() == 0 and listed == 0:
                quiet_since = quiet_since if quiet_since is not None else now
                if now - quiet_since >= quiet_seconds:
                    break
            else:
                quiet_since = None
            time.sleep(poll)
        self.stop.set()
        emit("drained")

    def _attempt(self, assignment: Assignment) -> None:
        try:
            self._work(assignment)
        finally:
            with self._lock:
                self._working.discard(threading.current_thread())

    def _work(self, assignment: Assignment) -> None:
        try:
            self._behave(assignment)
        except Cancelled as revoked:
            emit(
                "revoked",
                task=assignment.task,
                token=assignment.token,
                reason=revoked.code,
                fence=revoked.fence_token,
            )
        except LeaseLost as lost:
            emit("lost", task=assignment.task, token=assignment.token, why=str(lost))
        except SidecarUnavailable as err:
            emit("sidecar-unavailable", task=assignment.task, token=assignment.token, why=str(err))
        except Exception as err:  # a simulated agent reports its own bugs, then goes on
            emit("error", task=assignment.task, token=assignment.token, why=repr(err))

    def _behave(self, a: Assignment) -> None:
        if self.behaviour == "hang":
            emit("hanging", task=a.task, token=a.token)
            return
        with self.client.hold(a, beat_seconds=self.beat_seconds) as lease:
            if self.sink_url:
                # A revoked claim (cancel, deadline) fences the task's key in the sink: this
                # attempt's own later write is refused, even from a thread that did not hear.
                lease.fence_on_revoke(_SinkFence(self.sink_url), a.task)
            if self.behaviour == "hold":
                step = 0
                while not self.stop.is_set():
                    step += 1
                    lease.progress(f"step-{step}")
                    time.sleep(lease.beat_seconds)
                return
            if self.behaviour == "stuck":
                while not self.stop.is_set():
                    lease.check()  # the heartbeat thread beats; progress never moves
                    time.sleep(lease.beat_seconds)
                return
            lease.progress("started")
            self._with_sink(lambda sink: sink.fence(a.task, a.token), a, "sink-fenced")
            payload = a.payload if isinstance(a.payload, dict) else {}
            _throttle(lease, a, payload.get("throttled"))
            # The work: one blocking call that checks nothing.
            time.sleep(work_seconds(payload, self.work_seconds))
            _record_usage(lease, a, payload.get("usage"))
            output = {
                "task": a.task,
                "token": a.token,
                "attempt": a.attempt,
                "by": a.worker,
                "payload": a.payload,
            }
            ref = self._with_sink(
                lambda sink: sink.write(a.task, a.token, output), a, "sink-written"
            )
            if self.behaviour == "complete":
                lease.complete({"by": a.worker}, result_ref=ref)
                emit("reported", task=a.task, token=a.token, outcome="Succeeded")
            else:
                retryable = self.behaviour == "fail"
                lease.fail("AgentError", "simulated failure", retryable=retryable)
                emit("reported", task=a.task, token=a.token, outcome="Failed", retryable=retryable)

    def _with_sink(self, action: Callable[[Any], Any], a: Assignment, event: str) -> str | None:
        """Run ``action`` on a fresh connection to the sink; a refusal is logged, not raised
        (the report that follows shows the sidecar's fence too)."""
        if not self.sink_url:
            return None
        from agentq.fencing import StaleTokenError, open_store

        with open_store(self.sink_url) as sink:
            try:
                record = action(sink)
            except StaleTokenError as err:
                emit(
                    "sink-refused",
                    task=a.task,
                    token=a.token,
                    highest=err.highest,
                    why=str(err),
                )
                return None
            emit(event, task=a.task, token=a.token, revision=record.revision)
            return str(sink.ref(a.task))


def _throttle(lease: HeldLease, a: Assignment, throttled: Any) -> None:
    """The payload's ``throttled``, reported as a provider's 429 would make an agent."""
    if not isinstance(throttled, dict):
        return
    seconds: Any = throttled.get("retryAfterSeconds", 0)
    try:
        lease.throttled(str(throttled.get("budget")), seconds)
    except (ValueError, AgentError) as err:
        emit("throttle-refused", task=a.task, token=a.token, why=str(err))
        return
    emit("throttled", task=a.task, token=a.token, budget=throttled.get("budget"))


def _record_usage(lease: HeldLease, a: Assignment, usage: Any) -> None:
    """The payload's ``usage``, recorded as spent by this attempt (the report sends it)."""
    if not isinstance(usage, dict):
        return
    for budget, spent in usage.items():
        spent = spent if isinstance(spent, dict) else {}
        try:
            lease.record_usage(
                str(budget), requests=spent.get("requests", 1), tokens=spent.get("tokens", 0)
            )
        except ValueError as err:
            emit("usage-refused", task=a.task, token=a.token, budget=budget, why=str(err))
    emit("usage-recorded", task=a.task, token=a.token, usage=lease.usage())


class _SinkFence:
    """Fences a key of the sink on a connection of its own (agent-sim keeps none open)."""

    def __init__(self, url: str) -> None:
        self.url = url

    def fence(self, key: str, token: int) -> None:
        from agentq.fencing import open_store

        with open_store(self.url) as sink:
            sink.fence(key, token)
        emit("sink-fenced", task=key, token=token, why="revoked")


@click.command("agent-sim")
@click.option(
    "--sidecar",
    "url",
    envvar="AGENTQ_SIDECAR_URL",
    default="http://127.0.0.1:8700",
    show_default=True,
    help="the sidecar's agent API [AGENTQ_SIDECAR_URL]",
)
@click.option(
    "--token-file",
    envvar=TOKEN_FILE_ENV,
    help=f"the sidecar's token file [{TOKEN_FILE_ENV}; default: {DEFAULT_TOKEN_FILE}]",
)
@click.option(
    "--behaviour",
    envvar="AGENTQ_BEHAVIOUR",
    type=click.Choice(BEHAVIOURS),
    default="complete",
    show_default=True,
)
@click.option(
    "--work-seconds",
    envvar="AGENTQ_WORK_SECONDS",
    type=click.FloatRange(min=0),
    default=0.5,
    show_default=True,
)
@click.option(
    "--beat-seconds",
    envvar="AGENTQ_BEAT_SECONDS",
    type=click.FloatRange(min=0.05),
    help="heartbeat period [default: a third of each task's heartbeat interval]",
)
@click.option(
    "--sink",
    envvar="AGENTQ_SINK",
    help="fenced sink URL: sqlite:///path, postgresql://..., configmap://ns/name",
)
def agent_sim(
    url: str,
    token_file: str | None,
    behaviour: str,
    work_seconds: float,
    beat_seconds: float | None,
    sink: str | None,
) -> None:
    """A simulated agent: takes its sidecar's assignments and behaves as told."""
    sim = AgentSim(
        SidecarClient(url, token_file=token_file),
        behaviour=behaviour,
        work_seconds=work_seconds,
        beat_seconds=beat_seconds,
        sink_url=sink,
    )
    draining = threading.Event()

    def on_sigterm(signum: int, frame: object) -> None:
        # Drain in a thread of its own: the assignments loop goes on meanwhile.
        if not draining.is_set():
            draining.set()
            threading.Thread(target=_drain_then_exit, args=(sim,), daemon=True).start()

    signal.signal(signal.SIGTERM, on_sigterm)
    try:
        sim.run()
    except KeyboardInterrupt:
        sim.stop.set()


def _drain_then_exit(sim: AgentSim) -> None:
    sim.drain()
    sys.stdout.flush()
    os._exit(0)  # the assignments loop may sit in a long poll: do not wait for it
