"""How the chaos run starts an agent pod: the one place that knows its processes.

An agent pod is a set of *roles* (``agent``, ``sidecar``), each a real process the
harness can SIGKILL, SIGSTOP and restart. ``AgentKit.launch`` starts one role of
one worker; everything else in the harness is independent of what runs there.

- ``ScriptedAgents``: ``agentq.scripted_agent``, one process playing both roles
  (it renews the Leases and does the work); a fault on either role hits it. No
  sink: the committed result is checked against the reports the agent logged.

- ``SidecarAgents``: an agent pod as two processes, ``agentq sidecar`` and
  ``agentq agent-sim --sink sqlite:///...`` (agentq.agentsim.pair_commands); every
  attempt fences the task's key in one shared SQLite FencedStore when it starts and
  writes its output there with its token, so the run can check the sink at the end.

``default_kit()`` is the sidecar pair when ``agentq.agentsim`` is installed.
"""

from __future__ import annotations

import importlib.util
import json
import os
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from agentq import scripted_agent
from chaos.plan import WorkerPlan
from fleet import Process


@dataclass(frozen=True)
class Context:
    kubeconfig: str
    namespace: str
    logs: Path

    def env(self) -> dict[str, str]:
        return {**os.environ, "KUBECONFIG": self.kubeconfig, "PYTHONUNBUFFERED": "1"}


@dataclass(frozen=True)
class SinkRow:
    """What a fenced sink holds for a task: the token of the write it kept, and its data."""

    token: int
    data: object


class AgentKit(Protocol):
    name: str
    # Roles of an agent pod, and which process each fault role hits.
    roles: tuple[str, ...]
    # The error reasons the agents report for a failed attempt (not a reclaim).
    reported_reasons: frozenset[str]

    def process_role(self, role: str) -> str:
        """The role whose process a fault on ``role`` hits (they coincide in one process)."""
        ...

    def launch(self, ctx: Context, worker: WorkerPlan, role: str, serial: int) -> Process: ...

    def reports(self, ctx: Context) -> dict[str, set[tuple[str, int]]]:
        """Per task, the (worker, token) of every report an agent wrote."""
        ...

    def sink(self, ctx: Context, tasks: list[str]) -> dict[str, list[SinkRow]] | None:
        """Per task, what the fenced sink holds; None if this kit has no sink."""
        ...

    def refused_by_sink(self, ctx: Context) -> int:
        """Writes the sink refused for a stale token (zombies stopped by the fence)."""
        ...


class ScriptedAgents:
    """``agentq.scripted_agent``: one process per worker, both Lease holder and worker."""

    name = "scripted"
    roles = ("agent",)
    reported_reasons = frozenset({"AgentError"})

    def process_role(self, role: str) -> str:
        return "agent"

    def launch(self, ctx: Context, worker: WorkerPlan, role: str, serial: int) -> Process:
        args = scripted_agent.command(
            kubeconfig=ctx.kubeconfig,
            namespace=ctx.namespace,
            worker=worker.name,
            behaviour=worker.behaviour,
            work_seconds=worker.work_seconds,
            # Three renewals per 6 s lease: the scripted agent makes a few API calls per
            # beat, and twenty of them at 0.5 s would take a 2-core machine for themselves.
            beat_seconds=2.0,
            worker_lease_seconds=4,
        )
        return Process(args, ctx.logs / f"agent-{worker.name}-{serial}.log", ctx.env())

    def reports(self, ctx: Context) -> dict[str, set[tuple[str, int]]]:
        out: dict[str, set[tuple[str, int]]] = defaultdict(set)
        for log in ctx.logs.glob("agent-*.log"):
            worker = log.name.split("-")[1]
            for line in log.read_text(errors="replace").splitlines():
                if not line.startswith('{"reported"'):
                    continue
                entry = json.loads(line)
                out[entry["reported"]].add((worker, int(entry["token"])))
        return out

    def sink(self, ctx: Context, tasks: list[str]) -> dict[str, list[SinkRow]] | None:
        return None

    def refused_by_sink(self, ctx: Context) -> int:
        return 0


class SidecarAgents:
    """``agentq sidecar`` + ``agentq agent-sim`` per worker, with one fenced SQLite sink."""

    name = "sidecar"
    roles = ("sidecar", "agent")
    reported_reasons = frozenset({"AgentError"})

    def __init__(self) -> None:
        self._ports: dict[str, int] = {}

    def process_role(self, role: str) -> str:
        return role

    def sink_url(self, ctx: Context) -> str:
        return f"sqlite:///{ctx.logs.parent / 'sink.db'}"

    def launch(self, ctx: Context, worker: WorkerPlan, role: str, serial: int) -> Process:
        from agentq.agentsim import pair_commands
        from agentq.controlplane.cluster import free_port

        port = self._ports.setdefault(worker.name, free_port())
        sidecar, agent = pair_commands(
            worker=worker.name,
            namespace=ctx.namespace,
            port=port,
            # One file per worker: a sidecar started again replaces its secret, as a
            # restarted sidecar container does in its pod.
            token_file=str(ctx.logs / f"sidecar-token-{worker.name}"),
            behaviour=worker.behaviour,
            kubeconfig=ctx.kubeconfig,
            # The same pod restarted, not a new one: a sidecar started again keeps its
            # identity, as a container restarted in its pod would.
            identity=f"{worker.name}-pod",
            sink=self.sink_url(ctx),
            sidecar_flags={"worker_lease_seconds": 4},
            agent_flags={"work_seconds": worker.work_seconds},
        )
        argv = sidecar if role == "sidecar" else agent
        return Process(argv, ctx.logs / f"{role}-{worker.name}-{serial}.log", ctx.env())

    def reports(self, ctx: Context) -> dict[str, set[tuple[str, int]]]:
        out: dict[str, set[tuple[str, int]]] = defaultdict(set)
        for log in ctx.logs.glob("agent-*.log"):
            worker = log.name.split("-")[1]
            for line in log.read_text(errors="replace").splitlines():
                if '"event": "reported"' not in line:
                    continue
                entry = json.loads(line)
                if entry.get("outcome") == "Succeeded":
                    out[entry["task"]].add((worker, int(entry["token"])))
        return out

    def sink(self, ctx: Context, tasks: list[str]) -> dict[str, list[SinkRow]] | None:
        from agentq.fencing import open_store

        out: dict[str, list[SinkRow]] = {}
        with open_store(self.sink_url(ctx)) as store:
            for task in tasks:
                record = store.read(task)
                if record is not None and record.value is not None:
                    out[task] = [SinkRow(record.token, record.value)]
        return out

    def refused_by_sink(self, ctx: Context) -> int:
        """Zombie writes the sink refused (agent-sim logs a ``sink-refused`` event)."""
        return sum(
            log.read_text(errors="replace").count('"event": "sink-refused"')
            for log in ctx.logs.glob("agent-*.log")
        )


KITS: dict[str, AgentKit] = {"scripted": ScriptedAgents(), "sidecar": SidecarAgents()}


def default_kit() -> str:
    """The sidecar pair once it is installed (the sidecar branch), else the scripted agent."""
    return "sidecar" if importlib.util.find_spec("agentq.agentsim") else "scripted"
