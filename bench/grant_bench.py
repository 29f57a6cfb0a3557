"""Report -> the slot's next grant, tree against tree, in one run on one control plane.

The latency rows of ``make bench-e2e``'s backlog (``bench/e2e_bench.py``) without its
ceiling runs and cost tables: the operator and K real sidecar + agent-sim pairs
(processes, no pods), N no-op tasks created at once, each step of each task stamped
from a watch of tasks and Leases on this process's clock (``e2e_common.Recorder``).

Each ``--variant`` is a source tree (``git archive REV | tar -x -C DIR``; none: this
tree) and settings; the rounds alternate between the variants (ABBA...), each round on
a fresh namespace of the same control plane, so a before/after comparison is one run
of one command even on a machine whose load moves. Percentiles pool every round of a
variant.

    --variant NAME[:SRC][:KEY=VALUE,...]
        before:/tmp/before                      another tree
        c8::AGENTQ_WRITE_CONCURRENCY=8          this tree, an operator setting
        prio::nice=-10                          the control plane's CPU share raised
                                                (its processes' autogroup nice value)
        op::operator_nice=-5                    the operator's CPU share raised
        sa::accounts=1                          the operator and the sidecars with
                                                their ServiceAccounts' tokens, under the
                                                install's RBAC and admission policies

usage: python bench/grant_bench.py --variant before:/tmp/before --variant after
       [--rounds 3] [--tasks 400] [--agents 4] [--slots 8] [--profile] [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import collections
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from e2e_bench import agentq_run, loadavg  # noqa: E402
from e2e_common import (  # noqa: E402
    Rig,
    activity,
    fresh_workdir,
    next_grants,
    percentile,
    quiet,
    remove,
)

STEPS = (
    ("create -> granted", "created", "granted"),
    ("granted -> the agent sees it", "granted", "seen"),
    ("the agent sees it -> its report on the Lease", "seen", "report"),
    ("report on the Lease -> committed (Succeeded)", "report", "committed"),
)
COMMITTED_NEXT = "committed -> the slot's next grant"
REPORT_NEXT = "report on the Lease -> the slot's next grant"


@dataclass
class Variant:
    """What one round runs: a source tree (None: this one), environment for the
    operator and the sidecars (``AGENTQ_*`` settings), the control plane's nice value."""

    name: str
    src: Path | None = None
    env: dict[str, str] = field(default_factory=dict)
    nice: int = 0
    accounts: bool = False
    operator_nice: int = 0


def parse_variant(text: str) -> Variant:
    """``NAME[:SRC][:KEY=VALUE,...]`` (see the module docstring)."""
    name, _, rest = text.partition(":")
    src, _, settings = rest.partition(":")
    env = dict(item.split("=", 1) for item in settings.split(",") if item)
    nice = int(env.pop("nice", "0"))
    accounts = env.pop("accounts", "0") not in ("0", "")
    operator_nice = int(env.pop("operator_nice", "0"))
    src_path = Path(src).resolve() if src and src != "." else None
    return Variant(name, src_path, env, nice, accounts, operator_nice)


def spans(sample: dict[str, Any]) -> dict[str, list[float]]:
    """Each step's durations (s) for the backlog's tasks of one round, taken as
    ``e2e_bench.latencies`` takes them."""
    times = {n: t for n, t in sample["times"].items() if n.startswith("b")}
    out: dict[str, list[float]] = collections.defaultdict(list)
    for label, a, b in STEPS:
        for t in times.values():
            if t.get(a) is not None and t.get(b) is not None:
                out[label].append(t[b] - t[a])
    created = sorted(t["created"] for t in times.values() if t.get("created") is not None)
    granted = sorted(t["granted"] for t in times.values() if t.get("granted") is not None)

    def pending_at(when: float) -> int:
        return bisect.bisect_right(created, when) - bisect.bisect_right(granted, when)

    done = [t for t in times.values() if t.get("committed") is not None]
    grants = [(g, w) for g, w, n in sample["grants"] if n in times]
    nexts = next_grants([(t["committed"], t["worker"]) for t in done], grants, pending_at)
    for t, g in zip(done, nexts, strict=True):
        if g is None:
            continue
        out[COMMITTED_NEXT].append(g - t["committed"])
        if t.get("report") is not None:
            out[REPORT_NEXT].append(g - t["report"])
    return out


def set_controlplane_nice(rig: Rig, nice: int) -> None:
    """Each control plane process runs in a session of its own, so in an autogroup of
    its own: its CPU share against the agentq processes is its autogroup's nice value."""
    for pid in rig.pids.values():
        Path(f"/proc/{pid}/autogroup").write_text(str(nice))


def table(results: dict[str, dict[str, Any]]) -> str:
    names = list(results)
    rows = [
        "| step | " + " | ".join(f"{n}: p50 | p99" for n in names) + " |",
        "|---|" + "--:|--:|" * len(names),
    ]
    for label in [s[0] for s in STEPS] + [COMMITTED_NEXT, REPORT_NEXT]:
        cells = []
        for n in names:
            values = results[n]["spans"].get(label, [])
            cells += [
                f"{1000 * percentile(values, 50):,.0f}",
                f"{1000 * percentile(values, 99):,.0f}",
            ]
        rows.append(f"| {label} | " + " | ".join(cells) + " |")
    cells = []
    for n in names:
        cells += [" / ".join(f"{r:.1f}" for r in results[n]["rates"]), ""]
    rows.append("| tasks/s (each round) | " + " | ".join(cells) + " |")
    cells = []
    for n in names:
        cells += [" / ".join(f"{x:.1f}" for x in results[n]["load"]), ""]
    rows.append("| load average at its start | " + " | ".join(cells) + " |")
    return "\n".join(rows)


async def run(args: argparse.Namespace, variants: list[Variant]) -> dict[str, dict[str, Any]]:
    workdir = fresh_workdir("agentq-bench-grant-")
    rig = Rig(
        workdir,
        log_level=args.log_level,
        src=variants[0].src,
        apiserver_flags=tuple(args.apiserver_flag),
    )
    results: dict[str, dict[str, Any]] = {
        v.name: {"spans": collections.defaultdict(list), "rates": [], "load": [], "cpu_ms": []}
        for v in variants
    }
    saved = dict(os.environ)
    try:
        rig.up()
        if any(v.accounts for v in variants):
            rig.install_policies()
        await quiet(rig.api, activity, limit=60.0)
        run_args = argparse.Namespace(
            agents=args.agents,
            slots=args.slots,
            tasks=args.tasks,
            paced=0,
            paced_rate=0.0,
            profile=args.profile,
            idle_seconds=1.0,
            work_seconds=args.work_seconds,
        )
        for r in range(args.rounds):
            for variant in variants if r % 2 == 0 else list(reversed(variants)):
                rig.src = variant.src
                rig.accounts = variant.accounts
                rig.operator_nice = variant.operator_nice
                set_controlplane_nice(rig, variant.nice)
                os.environ.clear()
                os.environ.update({**saved, **variant.env})  # the processes' environment
                print(f"== round {r + 1}: {variant.name}", flush=True)
                load = os.getloadavg()[0]
                phases, _, sample = await agentq_run(rig, run_args)
                backlog, got = phases[0], spans(sample)
                result = results[variant.name]
                for label, values in got.items():
                    result["spans"][label].extend(values)
                result["rates"].append(backlog.rate)
                result["load"].append(load)
                result["cpu_ms"].append(backlog.cpu_ms)
                if args.json:
                    result.setdefault("samples", []).append(sample)
                print(
                    f"   {backlog.rate:.1f} tasks/s, load {load:.1f}; report -> next grant "
                    f"p50 {1000 * percentile(got[REPORT_NEXT], 50):.0f} ms, "
                    f"p99 {1000 * percentile(got[REPORT_NEXT], 99):.0f} ms; CPU ms per task: "
                    + ", ".join(f"{k} {v:.1f}" for k, v in backlog.cpu_ms.items()),
                    flush=True,
                )
                answer = {
                    f"{r} {v}": backlog.latency_ms.get((r, v), 0.0) / n
                    for (r, v), n in backlog.requests.items()
                    if n > 0.5 and (r, v) in backlog.latency_ms
                }
                result.setdefault("answer_ms", []).append(answer)
                print(
                    "   the API server's mean answer time, ms: "
                    + ", ".join(f"{k} {v:.0f}" for k, v in sorted(answer.items())),
                    flush=True,
                )
                if backlog.errors:
                    print(f"   errors: {backlog.errors}", flush=True)
    finally:
        os.environ.clear()
        os.environ.update(saved)
        await rig.down()
        if args.keep:
            print(f"logs kept in {workdir}", flush=True)
        else:
            remove(workdir)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        help="NAME[:SRC][:KEY=VALUE,...] (repeat; default: this tree alone)",
    )
    parser.add_argument("--rounds", type=int, default=2, help="backlogs per variant")
    parser.add_argument("--tasks", type=int, default=400, help="the backlog's tasks (N)")
    parser.add_argument("--agents", type=int, default=4, help="agent pods (K)")
    parser.add_argument("--slots", type=int, default=8, help="slots (maxInFlight) per agent")
    parser.add_argument(
        "--work-seconds",
        type=float,
        default=0.0,
        help="agent-sim works this long on each task (0: no-op tasks)",
    )
    parser.add_argument("--log-level", help="of the operator and the sidecars")
    parser.add_argument(
        "--profile", action="store_true", help="py-spy the operator and a sidecar (bench/out/)"
    )
    parser.add_argument(
        "--apiserver-flag",
        action="append",
        default=[],
        help="a kube-apiserver flag beyond the defaults (repeat; e.g. --profiling=true)",
    )
    parser.add_argument("--json", type=Path, help="also write the raw figures here")
    parser.add_argument("--keep", action="store_true", help="keep the logs")
    args = parser.parse_args()
    started = time.monotonic()
    load0 = os.getloadavg()
    variants = [parse_variant(v) for v in args.variant] or [Variant(".")]
    results = asyncio.run(run(args, variants))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    print(table(results))
    print(
        f"\npython bench/grant_bench.py {' '.join(sys.argv[1:])}\n"
        f"load average at the start {loadavg(load0)}, at the end {loadavg(os.getloadavg())}; "
        f"{time.monotonic() - started:.0f} s"
    )


if __name__ == "__main__":
    main()
