"""``python -m chaos`` (with ``tests`` on PYTHONPATH): the command behind ``make chaos``.

Exit status 0 when every safety property held and no healthy claim was reclaimed,
1 otherwise, 2 when the harness itself could not run.
"""

from __future__ import annotations

import argparse
import shlex
import signal
import sys
import tempfile
from pathlib import Path

from chaos.agents import KITS, default_kit
from chaos.harness import ChaosError, ChaosRun, main_say
from chaos.plan import PROFILES, make_plan
from chaos.report import summary, write_into

DOC = Path(__file__).resolve().parents[2] / "docs" / "reliability.md"


def _interrupt(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    # Stop cleanly (every process stopped by pid, the control plane down) on SIGTERM,
    # and on SIGINT even when started in the background, where it arrives ignored.
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, _interrupt)
    parser = argparse.ArgumentParser(prog="python -m chaos", description=__doc__)
    parser.add_argument("--seed", type=int, default=1, help="the seed of workload and faults")
    parser.add_argument("--profile", choices=sorted(PROFILES), default="full")
    parser.add_argument("--tasks", type=int, default=None, help="override the profile's count")
    parser.add_argument(
        "--agents",
        choices=sorted(KITS),
        default=default_kit(),
        help="how an agent pod is run (chaos.agents) [default: %(default)s]",
    )
    parser.add_argument("--workdir", type=Path, default=None, help="keep logs here")
    parser.add_argument("--deadline", type=float, default=3600.0, help="seconds for the run")
    parser.add_argument(
        "--stall",
        type=float,
        default=300.0,
        help="verify as is when no task became terminal for this many seconds",
    )
    parser.add_argument(
        "--write-doc", action="store_true", help=f"write the summary into {DOC.name}"
    )
    parser.add_argument("--plan-only", action="store_true", help="print the plan and exit")
    args = parser.parse_args(argv)
    plan = make_plan(args.seed, args.profile, tasks=args.tasks)
    if args.plan_only:
        for fault in plan.faults:
            print(f"{fault.at:.3f} {fault.describe()}")
        return 0
    command = "make chaos" + (f" SEED={args.seed}" if args.seed != 1 else "")
    if args.profile != "full" or args.tasks:
        command = "PYTHONPATH=tests python -m chaos " + shlex.join(
            sys.argv[1:] if argv is None else argv
        )
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="agentq-chaos-"))
    main_say(f"chaos: logs in {workdir}")
    try:
        verdict = ChaosRun(
            plan,
            workdir,
            kit=args.agents,
            say=main_say,
            deadline_seconds=args.deadline,
            stall_seconds=args.stall,
        ).run()
    except ChaosError as err:
        main_say(f"chaos: the harness failed: {err}")
        return 2
    text = summary(plan, verdict, command)
    print(text)
    if args.write_doc:
        write_into(DOC, text)
        main_say(f"chaos: summary written into {DOC}")
    return 0 if verdict.ok else 1


if __name__ == "__main__":
    sys.exit(main())
