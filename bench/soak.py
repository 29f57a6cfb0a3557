"""``make soak``: agentq at a steady rate for a long while, with a short TTL: does
anything grow that should not?

On the embedded control plane: the operator (one replica) and K agent pods (an
``agentq sidecar`` + ``agentq agent-sim`` pair of processes each; agent-sim completes
each task at once), no-op AgentTasks submitted at a steady rate for ``--minutes``,
each with ``spec.ttlSecondsAfterFinished`` (``--ttl``, 60 s). Sampled every minute:
etcd's database size (on disk and in use, from etcd's own metrics), the namespace's
AgentTasks, Leases and Events (a LIST with limit=1 and its remainingItemCount), the
resident memory of the operator, the sidecars, the API server and etcd. At the end:
the slope per hour of each series over the samples after the first TTL period (and a
minute), with its standard error; the tasks lost (created, never seen Succeeded) and
those committed twice (seen entering Succeeded twice, or with two Succeeded entries in
their history), from a watch of the tasks held for the whole run.

``ttlSecondsAfterFinished`` is in branch ``life`` (issue 18): on a tree without it the
API server prunes the field, nothing is deleted, and the table says so. ``--src DIR``
runs agentq from another source tree (``git archive life | tar -x -C DIR``).

usage: python bench/soak.py [--minutes 30] [--rate 5] [--ttl 60] [--write-docs]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import docsection  # noqa: E402
from e2e_common import (  # noqa: E402
    EVENTS,
    LEASES,
    ROOT,
    TASKS,
    Recorder,
    Rig,
    count,
    etcd_metrics,
    fresh_workdir,
    remove,
    rss_mb,
    slope_per_hour,
    task_body,
)

DOCS = ROOT / "docs" / "benchmarks.md"
SECTION_START = "<!-- soak:start -->"
SECTION_END = "<!-- soak:end -->"
#: The API server compacts etcd's history this often (--etcd-compaction-interval default).
COMPACTION_SECONDS = 300.0

# (key, label, unit): the series sampled each minute, in the table's order.
SERIES = (
    ("etcd_db_mb", "etcd database size on disk", "MB"),
    ("etcd_db_in_use_mb", "etcd database size in use", "MB"),
    ("tasks", "AgentTasks in the namespace", "objects"),
    ("leases", "Leases in the namespace", "objects"),
    ("events", "Events in the namespace", "objects"),
    ("operator_rss_mb", "operator RSS", "MB"),
    ("sidecar_rss_mb", "sidecar RSS (the largest)", "MB"),
    ("apiserver_rss_mb", "API server RSS", "MB"),
    ("etcd_rss_mb", "etcd RSS", "MB"),
)


@dataclass
class Soak:
    ns: str
    rig: Rig
    rec: Recorder
    rate: float
    ttl: int
    created: list[str] = field(default_factory=list)
    refused: int = 0
    samples: list[dict[str, float]] = field(default_factory=list)
    ttl_kept: bool | None = None  # did the API server keep spec.ttlSecondsAfterFinished?

    async def submit(self, seconds: float) -> None:
        """Create tasks at ``rate`` per second for ``seconds`` (8 requests in flight at
        most; a slow API server delays them rather than piling them up)."""
        started = time.monotonic()
        slots = asyncio.Semaphore(8)
        pending: set[asyncio.Task[None]] = set()
        i = 0
        while True:
            due = started + i / self.rate
            if due - started >= seconds:
                break
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            await slots.acquire()
            job = asyncio.create_task(self._create(f"s{i:07d}", slots))
            pending.add(job)
            job.add_done_callback(pending.discard)
            i += 1
        await asyncio.gather(*pending)

    async def _create(self, name: str, slots: asyncio.Semaphore) -> None:
        try:
            body = task_body(name, ttlSecondsAfterFinished=self.ttl)
            status, created = await self.rig.api.request("POST", TASKS.format(ns=self.ns), body)
            if status not in (200, 201):
                self.refused += 1
                print(f"create {name}: HTTP {status}: {str(created)[:200]}", flush=True)
                return
            self.rec.tasks[name].created = time.monotonic()
            self.created.append(name)
            if self.ttl_kept is None:
                self.ttl_kept = "ttlSecondsAfterFinished" in (created.get("spec") or {})
        finally:
            slots.release()

    async def sample(self, started: float) -> dict[str, float]:
        assert self.rig.state is not None
        etcd = await etcd_metrics(self.rig.state.etcd_url)
        pids = self.rig.pids
        tasks = self.rec.tasks
        row = {
            "t": time.monotonic() - started,
            "etcd_db_mb": etcd["etcd_mvcc_db_total_size_in_bytes"] / 1e6,
            "etcd_db_in_use_mb": etcd["etcd_mvcc_db_total_size_in_use_in_bytes"] / 1e6,
            "tasks": float(await count(self.rig.api, TASKS.format(ns=self.ns))),
            "leases": float(await count(self.rig.api, LEASES.format(ns=self.ns))),
            "events": float(await count(self.rig.api, EVENTS.format(ns=self.ns))),
            "operator_rss_mb": self.rig.operator.rss() if self.rig.operator else math.nan,
            "sidecar_rss_mb": max((p.sidecar.rss() for p in self.rig.pairs), default=math.nan),
            "apiserver_rss_mb": rss_mb(pids["kube-apiserver"]),
            "etcd_rss_mb": rss_mb(pids["etcd"]),
            "created": float(len(self.created)),
            "succeeded": float(sum(1 for t in tasks.values() if t.committed is not None)),
            "deleted": float(sum(1 for t in tasks.values() if t.deleted is not None)),
        }
        self.samples.append(row)
        print(json.dumps({k: round(v, 2) for k, v in row.items()}), flush=True)
        return row


def verdict(rec: Recorder, created: list[str]) -> dict[str, Any]:
    """Lost (created, never seen Succeeded), ended otherwise, and committed twice."""
    lost = [n for n in created if rec.tasks[n].committed is None and rec.tasks[n].finished is None]
    other = [
        n for n in created if rec.tasks[n].committed is None and rec.tasks[n].finished is not None
    ]
    twice = [n for n in created if rec.tasks[n].successes > 1 or rec.tasks[n].history_successes > 1]
    return {
        "created": len(created),
        "succeeded": sum(1 for n in created if rec.tasks[n].committed is not None),
        "lost": len(lost),
        "lost_examples": lost[:5],
        "ended_otherwise": len(other),
        "ended_otherwise_examples": [(n, rec.tasks[n].phase) for n in other[:5]],
        "committed_twice": len(twice),
        "committed_twice_examples": twice[:5],
        "deleted": sum(1 for n in created if rec.tasks[n].deleted is not None),
        "watch_errors": rec.errors,
    }


def slopes(samples: list[dict[str, float]], after: float) -> dict[str, tuple[float, float]]:
    """Each series' slope per hour (and its standard error) over the samples at or
    after ``after`` seconds."""
    late = [s for s in samples if s["t"] >= after]
    return {key: slope_per_hour([(s["t"], s[key]) for s in late]) for key, _, _ in SERIES}


def flat(slope: float, se: float, mean: float, hours: float) -> str:
    """Within noise: the slope is under two standard errors, or the whole change over
    the window is under 5 % of the mean."""
    if math.isnan(slope):
        return "-"
    if abs(slope) <= 2 * se or abs(slope * hours) <= 0.05 * abs(mean):
        return "yes"
    return "**no**"


def fmt(value: float, digits: int = 1) -> str:
    return "-" if math.isnan(value) else f"{value:,.{digits}f}"


def render(result: dict[str, Any], command: str) -> str:
    samples = result["samples"]
    after = result["slope_after_s"]
    late = [s for s in samples if s["t"] >= after]
    hours = (late[-1]["t"] - late[0]["t"]) / 3600 if len(late) > 1 else 0.0
    v = result["verdict"]
    lines = [
        SECTION_START,
        "## Soak: a steady rate with a short TTL (`make soak`)",
        "",
        "<!-- Generated by bench/soak.py; edit that script, not this section. -->",
        "",
        f"Embedded control plane; the operator (one replica) and {result['agents']} agent "
        f"pods (sidecar + agent-sim processes, {result['slots']} slots each); no-op tasks "
        f"submitted at {result['rate']:g}/s for {result['minutes']:g} minutes, each with "
        f"`ttlSecondsAfterFinished: {result['ttl']}`. Sampled every "
        f"{result['sample_seconds']:g} s; slopes over the {len(late)} samples from "
        f"{after / 60:.0f} min on (after the first TTL periods), least squares, per hour, "
        "with their standard error.",
        "",
    ]
    if not result["ttl_kept"]:
        lines += [
            "**The API server dropped `spec.ttlSecondsAfterFinished`: this tree's CRD has no "
            "such field (it comes with branch `life`, issue 18), so no finished task is "
            "deleted and the object counts and etcd grow by design in this run.**",
            "",
        ]
    lines += [
        "| series | first sample | last sample | slope per hour (± SE) | within noise |",
        "|---|--:|--:|--:|:-:|",
    ]
    first, last = samples[0], samples[-1]
    for key, label, unit in SERIES:
        slope, se = result["slopes"][key]
        mean = sum(s[key] for s in late) / len(late) if late else math.nan
        digits = 0 if unit == "objects" else 1
        lines.append(
            f"| {label} ({unit}) | {fmt(first[key], digits)} | {fmt(last[key], digits)} | "
            f"{fmt(slope, digits)} (± {fmt(se, digits)}) | {flat(slope, se, mean, hours)} |"
        )
    lines += [
        "",
        f"Tasks: {v['created']:,} created ({result['refused']} refused), {v['succeeded']:,} "
        f"Succeeded, **{v['lost']} lost**, **{v['committed_twice']} committed twice**, "
        f"{v['ended_otherwise']} ended in another phase, {v['deleted']:,} deleted by their "
        f"TTL; the watch resumed {v['watch_errors']} times"
        + (" (a 410 would make the counts unreliable: see the log)" if v["watch_errors"] else "")
        + ".",
        "",
        f"Events are removed by the API server after its `--event-ttl`, here "
        f"{result.get('event_ttl_minutes', 60)} min (1 h by default), not by agentq: a run "
        "shorter than that period sees their count, and etcd, only grow. The slopes start "
        "after the longer of the two TTLs plus one of the API server's etcd compactions "
        "(every 5 min).",
    ]
    if v["lost_examples"] or v["committed_twice_examples"]:
        lines += [
            "",
            f"Examples: lost {v['lost_examples']}, committed twice "
            f"{v['committed_twice_examples']}, ended otherwise {v['ended_otherwise_examples']}.",
        ]
    load = result["load"]
    lines += [
        "",
        "Measured with:",
        "",
        "```",
        command,
        "```",
        "",
        f"- machine: {platform.machine()}, {os.cpu_count()} CPUs, "
        f"{platform.system()} {platform.release()}; Python {platform.python_version()}",
        "- load average (1, 5, 15 min) at the start: "
        + ", ".join(f"{x:.2f}" for x in load[0])
        + "; at the end: "
        + ", ".join(f"{x:.2f}" for x in load[1])
        + (" (other work was running on the machine)" if max(load[0][0], load[1][0]) > 1.5 else ""),
        SECTION_END,
    ]
    return "\n".join(lines) + "\n"


async def run(args: argparse.Namespace) -> dict[str, Any]:
    workdir = fresh_workdir("agentq-soak-")
    rig = Rig(
        workdir,
        log_level=args.log_level,
        src=args.src,
        apiserver_flags=(f"--event-ttl={args.event_ttl}m",),
    )
    load0 = os.getloadavg()
    try:
        rig.up()
        ns = await rig.namespace("soak")
        workers = await rig.create_workers(ns, args.agents, args.slots)
        rec = Recorder(rig.api, ns)
        await rec.start()
        rig.start_operator(ns)
        rig.start_agents(ns, workers, rec.on_agent_line)
        await rig.wait_workers_ready(ns, len(workers))
        soak = Soak(ns, rig, rec, args.rate, args.ttl)
        started = time.monotonic()
        submitting = asyncio.create_task(soak.submit(args.minutes * 60))
        await soak.sample(started)
        while not submitting.done():
            done, _ = await asyncio.wait({submitting}, timeout=args.sample_seconds)
            for proc in rig.procs:
                if not proc.alive():
                    raise RuntimeError(f"{proc.name} exited: see {proc.log}")
            if not done:
                await soak.sample(started)
        await submitting
        # The last tasks finish (a minute at most), then one more sample.
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and any(
            rec.tasks[n].finished is None for n in soak.created
        ):
            await asyncio.sleep(1.0)
        await soak.sample(started)
        await rec.stop()
        # After the first period of each TTL (the tasks', the Events') and one of the API
        # server's etcd compactions (every 5 minutes), and a sample's worth of slack.
        after = max(args.ttl, args.event_ttl * 60) + COMPACTION_SECONDS + args.sample_seconds
        return {
            "agents": args.agents,
            "slots": args.slots,
            "rate": args.rate,
            "minutes": args.minutes,
            "ttl": args.ttl,
            "event_ttl_minutes": args.event_ttl,
            "sample_seconds": args.sample_seconds,
            "ttl_kept": bool(soak.ttl_kept),
            "refused": soak.refused,
            "samples": soak.samples,
            "slope_after_s": after,
            "slopes": slopes(soak.samples, after),
            "verdict": verdict(rec, soak.created),
            "load": (load0, os.getloadavg()),
        }
    finally:
        await rig.down()
        if args.keep:
            print(f"logs kept in {workdir}", flush=True)
        else:
            remove(workdir)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0, help="how long tasks are submitted")
    parser.add_argument("--rate", type=float, default=5.0, help="tasks submitted per second")
    parser.add_argument("--ttl", type=int, default=60, help="spec.ttlSecondsAfterFinished (s)")
    parser.add_argument(
        "--event-ttl",
        type=int,
        default=5,
        help="the API server's --event-ttl in minutes (a cluster's is 1 h by default: the "
        "run must outlast it for the Events and etcd to level off)",
    )
    parser.add_argument("--agents", type=int, default=4, help="agent pods")
    parser.add_argument("--slots", type=int, default=8, help="slots (maxInFlight) per agent")
    parser.add_argument("--sample-seconds", type=float, default=60.0, help="between samples")
    parser.add_argument("--log-level", help="of the operator and the sidecars (default INFO)")
    parser.add_argument("--src", type=Path, help="run agentq from another source tree")
    parser.add_argument("--write-docs", action="store_true", help="update docs/benchmarks.md")
    parser.add_argument("--json", type=Path, help="also write the raw figures here")
    parser.add_argument("--keep", action="store_true", help="keep the logs")
    args = parser.parse_args()
    result = asyncio.run(run(args))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    section = render(result, "python bench/soak.py " + " ".join(sys.argv[1:]))
    print(section)
    if args.write_docs:
        docsection.write_section(DOCS, SECTION_START, SECTION_END, section)
    v = result["verdict"]
    if v["lost"] or v["committed_twice"]:
        sys.exit(1)


if __name__ == "__main__":
    main()
