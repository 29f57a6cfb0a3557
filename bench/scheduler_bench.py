"""Micro-benchmark of the dispatch core: decisions per second, index vs full scan.

Run from the repository root (``make bench`` does)::

    .venv/bin/python bench/scheduler_bench.py

For 100, 1,000 and 10,000 workers spread over 4 and 16 distinct capability
sets it measures the capability-group index (``agentq.scheduler.Scheduler``)
and the full-scan reference (``agentq.scheduler.reference.ReferenceScheduler``)
on the same fleet and the same task stream, in the same run, checks that they
made the same decisions, and writes the table to ``docs/benchmarks.md``.

Steady state: every worker has ``max_in_flight`` 8 and starts with 2 tasks in
flight (restored, so building the state costs no decisions); each timed step
plans one task and then completes the oldest task in flight, so the fleet
stays at the same load. A step's time therefore includes one ``plan`` of one
task and one ``release``. Each measurement is repeated and the fastest kept
(the machine may be busy with other work; the fastest run is the least
disturbed one).
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import sys
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "operator"))  # run from a checkout without installing

from docsection import write_section  # noqa: E402

from agentq.scheduler import Assignment, Scheduler, TaskSpec, WorkerSpec  # noqa: E402
from agentq.scheduler.ledger import Ledger  # noqa: E402
from agentq.scheduler.reference import ReferenceScheduler  # noqa: E402

BEGIN = "<!-- BEGIN scheduler benchmark (bench/scheduler_bench.py) -->"
END = "<!-- END scheduler benchmark -->"

CAPABILITIES = ("py", "go", "rust", "web", "gpu", "browser", "sql", "shell")
WEIGHTS = (1.0, 2.0, 4.0)
COSTS = (0.5, 1.0, 1.0, 2.0, 4.0)
MAX_IN_FLIGHT = 8
HELD_PER_WORKER = 2


@dataclass(frozen=True)
class Setup:
    """A fleet and a task stream, identical for both implementations."""

    workers: tuple[WorkerSpec, ...]
    held: tuple[Assignment, ...]
    stream: tuple[TaskSpec, ...]


def make_setup(workers: int, capability_sets: int, steps: int, *, seed: int = 7) -> Setup:
    rng = random.Random(seed)
    sets: list[frozenset[str]] = []
    while len(sets) < capability_sets:
        candidate = frozenset(rng.sample(CAPABILITIES, rng.randint(1, 4)))
        if candidate not in sets:
            sets.append(candidate)
    fleet = tuple(
        WorkerSpec(
            name=f"worker-{i:05d}",
            capabilities=sets[i % capability_sets],
            weight=rng.choice(WEIGHTS),
            max_in_flight=MAX_IN_FLIGHT,
        )
        for i in range(workers)
    )
    held = tuple(
        Assignment(f"held-{w.name}-{k}", w.name, rng.choice(COSTS))
        for k in range(HELD_PER_WORKER)
        for w in fleet
    )
    stream = []
    for i in range(steps):
        base = sorted(rng.choice(sets))
        required = frozenset(rng.sample(base, rng.randint(0, min(2, len(base)))))
        stream.append(TaskSpec(f"task-{i:07d}", required, rng.choice(COSTS)))
    return Setup(fleet, held, tuple(stream))


def measure(
    kind: type[Ledger], setup: Setup, steps: int, repeats: int
) -> tuple[float, list[Assignment]]:
    """Best seconds per step over ``repeats`` runs, and the decisions of the last run."""
    best = float("inf")
    decided: list[Assignment] = []
    for _ in range(repeats):
        core = kind()
        for spec in setup.workers:
            core.upsert_worker(spec)
        for assignment in setup.held:
            core.restore(assignment)
        in_flight = deque(a.task for a in setup.held)
        decided = []
        stream = setup.stream[:steps]
        start = time.perf_counter()
        for task in stream:
            for decision in core.plan((task,)):
                decided.append(decision)
                in_flight.append(decision.task)
            core.release(in_flight.popleft(), completed=True)
        elapsed = time.perf_counter() - start
        best = min(best, elapsed / len(stream))
    return best, decided


@dataclass(frozen=True)
class Row:
    workers: int
    capability_sets: int
    fast_us: float
    naive_us: float
    fast_steps: int
    naive_steps: int

    @property
    def speedup(self) -> float:
        return self.naive_us / self.fast_us


def run(
    sizes: Sequence[int], sets: Sequence[int], fast_steps: int, naive_budget: int, repeats: int
) -> list[Row]:
    rows = []
    for workers in sizes:
        for capability_sets in sets:
            # The naive scan costs O(workers) per step: give it a budget of
            # worker-visits instead of a step count, so every size takes similar time.
            naive_steps = max(100, min(fast_steps, naive_budget // workers))
            setup = make_setup(workers, capability_sets, fast_steps)
            fast, fast_decided = measure(Scheduler, setup, fast_steps, repeats)
            naive, naive_decided = measure(ReferenceScheduler, setup, naive_steps, repeats)
            if fast_decided[: len(naive_decided)] != naive_decided:
                raise SystemExit(f"{workers} workers / {capability_sets} sets: decisions differ")
            row = Row(workers, capability_sets, fast * 1e6, naive * 1e6, fast_steps, naive_steps)
            rows.append(row)
            print(
                f"{workers:>6} workers {capability_sets:>3} sets: index {row.fast_us:8.1f} us, "
                f"full scan {row.naive_us:9.1f} us, x{row.speedup:6.1f}",
                flush=True,
            )
    return rows


def render(rows: Sequence[Row], *, command: str, seconds: float, repeats: int) -> str:
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    lines = [
        BEGIN,
        "## Dispatch decisions: capability-group index vs full scan",
        "",
        "The operator's scheduler (`agentq.scheduler.Scheduler`) keeps workers in heaps",
        "per distinct capability set; the reference (`agentq.scheduler.reference`) scans",
        "the whole fleet for every task. Both apply the same rule on the same ledger and,",
        "in this run, made the same decisions (checked on every step the scan ran).",
        "",
        "Fleet: weights 1/2/4, `max_in_flight` 8, 2 tasks in flight per worker (steady",
        "state: each step plans one task, then completes the oldest one). Tasks require",
        "0-2 capabilities of one of the fleet's capability sets; costs 0.5-4.",
        "A step is one `plan()` of one task plus one `release()`; the fastest of",
        f"{repeats} repeats is kept.",
        "",
        "| workers | capability sets | index: us / decision | index: decisions / s "
        "| full scan: us / decision | full scan: decisions / s | speedup |",
        "|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for row in rows:
        lines.append(
            f"| {row.workers:,} | {row.capability_sets} | {row.fast_us:.1f} "
            f"| {1e6 / row.fast_us:,.0f} | {row.naive_us:.1f} | {1e6 / row.naive_us:,.0f} "
            f"| {row.speedup:.0f}x |"
        )
    lines += [
        "",
        "The index's cost per decision grows only with the logarithm of the fleet",
        "(a few heap operations per matching capability set: O(G log n), G the",
        "number of capability sets covering the task), the full scan's linearly.",
        "Target from issue 3: at 10,000 workers the index is at least 50x faster per",
        "decision than the scan, in the same run.",
        "",
        "Measured with:",
        "",
        "```",
        command,
        "```",
        "",
        f"- machine: {platform.machine()}, {os.cpu_count()} CPUs, {platform.system()}"
        f" {platform.release()}",
        f"- Python {platform.python_version()} ({platform.python_implementation()})",
        "- load average at the end: "
        + (", ".join(f"{x:.2f}" for x in load) if load else "unknown")
        + " (other work was running; figures are the best of the repeats)",
        f"- whole benchmark: {seconds:.0f} s",
        END,
    ]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="100,1000,10000", help="worker counts")
    parser.add_argument("--sets", default="4,16", help="numbers of capability sets")
    parser.add_argument("--steps", type=int, default=20_000, help="timed steps (index)")
    parser.add_argument(
        "--scan-budget",
        type=int,
        default=2_000_000,
        help="worker visits per full-scan measurement (steps = budget / workers)",
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--output", type=Path, default=ROOT / "docs" / "benchmarks.md")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    rows = run(
        [int(s) for s in args.sizes.split(",")],
        [int(s) for s in args.sets.split(",")],
        args.steps,
        args.scan_budget,
        args.repeats,
    )
    extra = list(sys.argv[1:] if argv is None else argv)
    command = " ".join([".venv/bin/python", "bench/scheduler_bench.py", *extra])
    seconds = time.perf_counter() - started
    section = render(rows, command=command, seconds=seconds, repeats=args.repeats)
    write_section(args.output, BEGIN, END, section)
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
