"""The chaos run's summary: a Markdown table, printed and written into docs/reliability.md.

``make chaos`` replaces the part of docs/reliability.md between the two markers
below with the last run's figures, its seed and the command that produced it.
"""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
from pathlib import Path

from chaos.plan import Plan
from chaos.verify import Verdict

BEGIN = "<!-- chaos-run:begin (written by make chaos) -->"
END = "<!-- chaos-run:end -->"


def _cell(value: object) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{k} {v}" for k, v in value.items()) or "none"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, list):
        return "; ".join(str(v) for v in value) or "none"
    return str(value)


def table(verdict: Verdict) -> str:
    rows = ["| figure | value |", "| --- | --- |"]
    rows += [f"| {k} | {_cell(v)} |" for k, v in verdict.figures.items()]
    return "\n".join(rows)


def summary(plan: Plan, verdict: Verdict, command: str) -> str:
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        f"Last run: {when}, `{command}` (seed {plan.seed}, profile {plan.profile}) on "
        f"commit {_commit()}, {platform.machine()} with {_cpus()} CPUs.",
        "",
        table(verdict),
        "",
        "Fault schedule (fired when this fraction of the tasks was terminal):",
        "",
        ", ".join(f"{f.at:.2f} {f.describe()}" for f in plan.faults) + ".",
        "",
        f"Verdict: safety {'held' if verdict.safe else 'VIOLATED'}; healthy claims reclaimed: "
        f"{len(verdict.liveness)}.",
    ]
    if verdict.violations:
        lines += ["", "Violations:", ""] + [f"- {v}" for v in verdict.violations[:30]]
    if verdict.liveness:
        lines += ["", "Healthy claims reclaimed:", ""] + [f"- {v}" for v in verdict.liveness[:30]]
    return "\n".join(lines)


def _cpus() -> int:
    return os.cpu_count() or 1


def _commit() -> str:
    """The checkout the run was made from (``+`` if it had uncommitted changes)."""
    root = Path(__file__).resolve().parents[2]
    try:
        head = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head + ("+" if dirty else "")


def write_into(doc: Path, text: str) -> None:
    """Replace the marked section of ``doc`` with ``text`` (append the markers if missing)."""
    current = doc.read_text() if doc.exists() else ""
    block = f"{BEGIN}\n{text}\n{END}"
    if BEGIN in current and END in current:
        head, rest = current.split(BEGIN, 1)
        _, tail = rest.split(END, 1)
        doc.write_text(head + block + tail)
    else:
        doc.write_text(current.rstrip("\n") + "\n\n" + block + "\n")
