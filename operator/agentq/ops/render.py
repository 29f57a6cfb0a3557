"""Output of the ops verbs: rich text for people, JSON or YAML for scripts.

Data verbs take ``-o text|json|yaml``; text goes through rich (tables without
boxes, as kubectl prints them; plain when not on a terminal), data is emitted
as one JSON document or one YAML document on stdout.
"""

from __future__ import annotations

import datetime
import json
import re
import sys
from collections.abc import Iterable
from typing import Any

import yaml
from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from agentq.ops.explain import Explanation, human_seconds
from agentq.ops.fleet import FleetView

FORMATS = ("text", "json", "yaml")
_PHASE_STYLE = {
    "Pending": "yellow",
    "Assigned": "cyan",
    "Running": "blue",
    "Succeeded": "green",
    "Failed": "red",
    "DeadLettered": "bold red",
    "Held": "magenta",
    "Ready": "green",
    "NotReady": "red",
    "Draining": "yellow",
}
_FINDING_STYLE = {
    "DeadLettered": "bold red",
    "Failed": "red",
    "Unschedulable": "red",
    "NoReadyWorker": "red",
    "WorkerNotReady": "red",
    "ReportsRefused": "yellow",
    "Held": "magenta",
    "BackoffWait": "yellow",
    "NoFreeCapacity": "yellow",
    "GracePeriod": "yellow",
    "Succeeded": "green",
}


def console() -> Console:
    """A console on stdout; wide and plain when stdout is not a terminal (pipes, tests)."""
    out = Console(file=sys.stdout, highlight=False)
    if not out.is_terminal:
        out = Console(file=sys.stdout, highlight=False, width=160, no_color=True)
    return out


def emit(data: Any, fmt: str) -> None:
    """Print ``data`` as one JSON or YAML document."""
    if fmt == "json":
        sys.stdout.write(json.dumps(data, indent=2, sort_keys=False) + "\n")
    else:
        sys.stdout.write(yaml.safe_dump(data, sort_keys=False, allow_unicode=True))
    sys.stdout.flush()


def phase_text(phase: str) -> Text:
    return plain(phase, _PHASE_STYLE.get(phase, ""))


def _clock(moment: datetime.datetime | None) -> str:
    return moment.astimezone(datetime.UTC).strftime("%H:%M:%S") if moment else "-"


def _duration(seconds: float | None) -> str:
    # Event and history times have one-second resolution: below that, say so.
    if seconds is None:
        return "-"
    return "<1s" if seconds < 1 else human_seconds(seconds)


# C0 and C1 control characters but newline and tab: a terminal escape written by an agent
# (a reason, a message, a result) must reach the operator's terminal as text, not act.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def safe(text: object) -> str:
    """Untrusted text (an agent's, a user's) as plain printable text."""
    return _CONTROL.sub("\N{REPLACEMENT CHARACTER}", str(text))


def plain(text: object, style: str = "") -> Text:
    """Untrusted text as a rich Text: never read as markup (``[link=...]``, ``[/]``)."""
    return Text(safe(text), style=style)


def add_row(table: Table, *cells: object) -> None:
    """A table row whose str cells are plain text (rich would read them as markup)."""
    table.add_row(*(cell if isinstance(cell, Text) else plain(cell) for cell in cells))


def table(*columns: str) -> Table:
    table = Table(box=None, pad_edge=False, show_edge=False, header_style="bold")
    for column in columns:
        table.add_column(column, overflow="fold")
    return table


# --- explain ------------------------------------------------------------------------------


def _queue_head(exp: Explanation) -> str:
    if exp.queue is None:
        return ""
    place = exp.queue_place
    where = f" (position {place.position} of {place.pending})" if place is not None else ""
    return f" · queue {exp.queue}{where}"


def explanation(exp: Explanation) -> RenderableType:
    head = Text.assemble(
        (safe(f"agenttask/{exp.name}"), "bold"),
        safe(f"  (namespace {exp.namespace})\n  phase "),
        phase_text(exp.phase),
        f" · attempt {exp.attempt} · reclaims {exp.reclaims}",
        f" · maxReclaims {exp.max_reclaims if exp.max_reclaims is not None else 'default'}",
        f" · token {exp.fencing_token if exp.fencing_token is not None else '-'}",
        safe(f" · worker {exp.worker or '-'}"),
        safe(f" · requires {', '.join(exp.required) or '-'} · cost {exp.cost:g}"),
        safe(_queue_head(exp)),
    )
    why = Text("\nWhy\n", style="bold")
    for finding in exp.findings:
        why.append(f"  {finding.code}: ", style=_FINDING_STYLE.get(finding.code, "bold"))
        why.append(safe(finding.message) + "\n")
        if finding.hint:
            why.append(safe(f"    -> {finding.hint}") + "\n", style="dim")
    parts: list[RenderableType] = [head, why]
    if exp.timeline:
        attempts = table(
            "#", "WORKER", "TOKEN", "STARTED", "ENDED", "DURATION", "OUTCOME", "REASON"
        )
        for row in exp.timeline:
            duration = row.duration(exp.now)
            add_row(
                attempts,
                str(row.attempt if row.attempt is not None else "-"),
                row.worker or "-",
                str(row.token if row.token is not None else "-"),
                _clock(row.started),
                _clock(row.ended) if row.ended else "(now)",
                _duration(duration),
                phase_text(row.outcome),
                row.reason or "-",
            )
        title = "Attempts (UTC)" + (
            " - older attempts dropped: status keeps the last 20" if exp.history_truncated else ""
        )
        parts += [Text(title, style="bold"), attempts, Text("")]
    if exp.events:
        events = table("TIME", "TYPE", "REASON", "MESSAGE")
        for event in exp.events:
            count = f" (x{event.count})" if event.count > 1 else ""
            add_row(
                events,
                _clock(event.time),
                event.type,
                plain(event.reason, "red" if event.type == "Warning" else ""),
                event.message + count,
            )
        parts += [Text("Events (UTC, oldest first)", style="bold"), events]
    else:
        parts.append(Text("Events: none (the API server keeps events for an hour by default)"))
    return Group(*parts)


# --- top ----------------------------------------------------------------------------------


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.0f}%"


def phase_line(counts: dict[str, int]) -> Text:
    line = Text()
    for phase, count in counts.items():
        if line:
            line.append("  ")
        line.append(f"{phase} ", style=_PHASE_STYLE.get(phase, ""))
        line.append(str(count), style="bold")
    return line or Text("no tasks")


def fleet(view: FleetView, *, show_namespace: bool = False, live: bool = False) -> RenderableType:
    """The worker table, the queue table and the phase counts of ``view``."""
    parts: list[RenderableType] = []
    for namespace in view.namespaces:
        counts = view.phases.get(namespace, {})
        parts.append(Text.assemble((f"tasks in {namespace}: ", "bold"), phase_line(counts)))
    columns = ["WORKER", "PHASE", "WEIGHT", "WEIGHT SHARE", "SERVED SHARE"]
    if live:
        columns.append("LAST MINUTE")
    columns += ["SERVED COST", "DEFICIT", "IN FLIGHT", "CAPABILITIES"]
    if show_namespace:
        columns.insert(0, "NAMESPACE")
    workers = table(*columns)
    for w in view.workers:
        row: list[RenderableType] = [
            w.name,
            phase_text(w.phase),
            f"{w.weight:g}",
            _pct(w.weight_share),
            _pct(w.served_share),
        ]
        if live:
            row.append(_pct(w.recent_share))
        row += [
            f"{w.served_cost:g}",
            "-" if w.deficit is None else f"{w.deficit:.2f}",
            f"{w.in_flight}/{w.max_in_flight}",
            ",".join(w.capabilities),
        ]
        if show_namespace:
            row.insert(0, w.namespace)
        add_row(workers, *row)
    parts += [Text(""), workers if view.workers else Text("no AgentWorkers")]
    queue_columns = [
        "QUEUE (REQUIRES)",
        "PENDING",
        "IN BACKOFF",
        "OLDEST",
        "WORKERS READY/CAPABLE",
        "FREE SLOTS",
    ]
    if show_namespace:
        queue_columns.insert(0, "NAMESPACE")
    queues = table(*queue_columns)
    for q in view.queues:
        qrow: list[RenderableType] = [
            ",".join(q.capabilities) or "(any)",
            str(q.pending),
            str(q.backoff),
            human_seconds(q.oldest_seconds) if q.oldest_seconds is not None else "-",
            Text("0/0 unschedulable", style="red")
            if q.unschedulable
            else f"{q.ready_workers}/{q.capable_workers}",
            str(q.free_slots),
        ]
        if show_namespace:
            qrow.insert(0, q.namespace)
        add_row(queues, *qrow)
    parts += [Text(""), queues if view.queues else Text("queue: nothing Pending")]
    if view.agent_queues:
        parts += [Text(""), agent_queues(view, live=live)]
    if view.agent_queues_note:
        parts += [Text(""), Text(f"note: {view.agent_queues_note}", style="yellow")]
    if view.agent_budgets:
        parts += [Text(""), agent_budgets(view)]
    return Group(*parts)


def _of(used: int | None, reserved: int | None, limit: int | None) -> str:
    if limit is None:
        return "-"
    return f"{(used or 0) + (reserved or 0)}/{limit}"


def agent_budgets(view: FleetView) -> Table:
    """One row per AgentBudget: each limit's use (used + reserved, or claims in use)."""
    out = table("AGENTBUDGET", "REQUESTS/MIN", "TOKENS/MIN", "CONCURRENT", "WAITING", "STATE")
    for b in view.agent_budgets:
        concurrent = "-" if b.max_concurrent is None else f"{b.in_use or 0}/{b.max_concurrent}"
        if b.saturated:
            state = plain(f"Saturated ({b.saturated})", "yellow")
        elif b.throttled_until:
            state = plain(f"throttled until {b.throttled_until}", "")
        else:
            state = plain("-", "")
        add_row(
            out,
            b.name,
            _of(b.used_requests, b.reserved_requests, b.requests_per_minute),
            _of(b.used_tokens, b.reserved_tokens, b.tokens_per_minute),
            concurrent,
            str(b.waiting if b.waiting is not None else "-"),
            state,
        )
    return out


def agent_queues(view: FleetView, *, live: bool = False) -> Table:
    """One row per AgentQueue, children indented under their parent."""
    columns = [
        "AGENTQUEUE",
        "PARENT",
        "WEIGHT",
        "WEIGHT SHARE",
        "SHARE",
        "PENDING",
        "IN FLIGHT",
        "SERVED COST",
        "STATE",
    ]
    if live:
        columns.append("EST. WAIT")
    out = table(*columns)
    for q in view.agent_queues:
        cap = f"{q.in_flight}/{q.max_in_flight if q.max_in_flight is not None else '-'}"
        row: list[RenderableType] = [
            "  " * q.depth + q.name,
            q.parent or "-",
            f"{q.weight:g}",
            _pct(q.weight_share),
            _pct(q.share),
            str(q.pending),
            plain(cap, "yellow") if q.capped else cap,
            f"{q.served_cost:g}",
            plain(q.state, "" if q.state in ("Ready", "-") else "red"),
        ]
        if live:
            row.append(human_seconds(q.wait_seconds) if q.wait_seconds is not None else "-")
        add_row(out, *row)
    return out


def lines(items: Iterable[str]) -> str:
    return "\n".join(items)
