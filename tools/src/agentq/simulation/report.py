"""How a comparison is shown: a terminal table, JSON, Markdown (for the docs) or a plot."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console
from rich.table import Table

from agentq.simulation.engine import Run
from agentq.simulation.metrics import Summary

__all__ = ["as_json", "as_markdown", "plot", "print_tables"]

_HEADERS = (
    "policy",
    "max share error (x max cost)",
    "Jain index",
    "makespan (s)",
    "p50 wait (s)",
    "p99 wait (s)",
    "starved",
)
# Narrow terminals: shorter headers, never wrap the policy names.
_SHORT_HEADERS = ("policy", "share err (xC)", "Jain", "makespan", "p50 wait", "p99 wait", "starved")


def _number(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _row(summary: Summary) -> list[str]:
    return [
        summary.policy,
        _number(summary.max_share_error, 3),
        _number(summary.jain_index, 4),
        _number(summary.makespan, 1),
        _number(summary.p50_wait, 2),
        _number(summary.p99_wait, 2),
        str(summary.starved),
    ]


def _share_rows(summaries: Sequence[Summary]) -> tuple[list[str], list[list[str]]]:
    headers = ["worker", "weight share", *(s.policy for s in summaries)]
    rows = []
    for index, first in enumerate(summaries[0].shares if summaries else ()):
        rows.append(
            [first.name, f"{first.weight_share:.1%}"]
            + [f"{s.shares[index].share:.1%}" for s in summaries]
        )
    return headers, rows


def print_tables(summaries: Sequence[Summary], *, title: str, console: Console) -> None:
    """The comparison table, then each worker's share of the served cost."""
    table = Table(title=title, caption="times in seconds; C = the largest task cost")
    for header in _SHORT_HEADERS:
        if header == "policy":
            table.add_column(header, no_wrap=True, min_width=12)
        else:
            table.add_column(header, justify="right")
    for summary in summaries:
        table.add_row(*_row(summary))
    console.print(table)
    headers, rows = _share_rows(summaries)
    shares = Table(title="share of served cost per worker")
    for header in headers:
        shares.add_column(header, justify="left" if header == "worker" else "right")
    for row in rows:
        shares.add_row(*row)
    console.print(shares)


def as_json(summaries: Sequence[Summary]) -> str:
    """One object per policy; keys ``policy``, ``max_share_error``, ``jain_index``,
    ``makespan``, ``p50_wait``, ``p99_wait``, ``starved`` (and more)."""
    return json.dumps([s.as_dict() for s in summaries], indent=2)


def as_markdown(summaries: Sequence[Summary]) -> str:
    """The same two tables in Markdown."""

    def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
        lines = ["| " + " | ".join(headers) + " |"]
        lines.append("|" + "|".join(":--" if i == 0 else "--:" for i in range(len(headers))) + "|")
        lines += ["| " + " | ".join(row) + " |" for row in rows]
        return lines

    headers, rows = _share_rows(summaries)
    return "\n".join([*table(_HEADERS, [_row(s) for s in summaries]), "", *table(headers, rows)])


def plot(runs: Sequence[Run], path: Path, *, title: str) -> None:
    """Cumulative service per worker over time, one panel per policy (needs matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")  # files only; never open a window
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(
        1, len(runs), figsize=(5 * len(runs), 4), sharey=True, squeeze=False
    )
    for axis, run in zip(axes[0], runs, strict=True):
        for worker in run.workers:
            times = [0.0, *(t for t, _ in worker.timeline)]
            served = [0.0, *(s for _, s in worker.timeline)]
            axis.step(times, served, where="post", label=f"{worker.name} (w={worker.weight:g})")
        axis.set_title(run.policy)
        axis.set_xlabel("time (s)")
        axis.grid(alpha=0.3)
    axes[0][0].set_ylabel("cumulative served cost")
    axes[0][0].legend(loc="upper left", fontsize="small")
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
