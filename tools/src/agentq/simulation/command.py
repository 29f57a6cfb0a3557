"""``agentq simulate``: run one workload under agentq's DRR and the baselines, print a table.

Flags adjust the chosen scenario (a preset or a YAML file); see
``docs/scheduling.md`` for the YAML schema and what each figure means.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import click
import yaml
from rich.console import Console

from agentq.simulation import compare, tenants
from agentq.simulation.baselines import POLICIES
from agentq.simulation.report import as_json, as_markdown, plot, print_tables
from agentq.simulation.scenario import (
    DISTRIBUTIONS,
    EXECUTIONS,
    PRESETS,
    Scenario,
    ScenarioError,
    WorkerConfig,
    preset,
    scenario_from_mapping,
)

__all__ = ["simulate"]


def _floats(text: str, option: str) -> list[float]:
    try:
        values = [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise click.BadParameter(f"expected numbers separated by commas, got {text!r}") from None
    if not values:
        raise click.BadParameter("expected at least one number", param_hint=option)
    return values


def _crashes(scenario: Scenario, specs: tuple[str, ...]) -> Scenario:
    names = {w.name for w in scenario.workers}
    crash_at: dict[str, float] = {}
    for spec in specs:
        name, _, when = spec.partition("@")
        if name not in names:
            raise click.BadParameter(
                f"no worker named {name!r} (workers: {', '.join(sorted(names))})",
                param_hint="--crash",
            )
        try:
            crash_at[name] = float(when)
        except ValueError:
            raise click.BadParameter(
                f"expected WORKER@SECONDS, got {spec!r}", param_hint="--crash"
            ) from None
    workers = tuple(
        replace(w, crash_at=crash_at[w.name]) if w.name in crash_at else w for w in scenario.workers
    )
    return replace(scenario, workers=workers)


@click.command("simulate")
@click.option(
    "--scenario",
    "preset_name",
    type=click.Choice(sorted(PRESETS)),
    default="weighted",
    show_default=True,
    help="A built-in scenario to start from.",
)
@click.option(
    "--config",
    "config_path",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="A YAML scenario (replaces --scenario).",
)
@click.option("--seed", type=int, help="Seed of the workload.")
@click.option("--tasks", type=click.IntRange(min=1), help="Number of tasks.")
@click.option(
    "--load",
    type=click.FloatRange(min=0, min_open=True),
    help="Arrival rate as a fraction of the fleet's capacity.",
)
@click.option(
    "--rate", type=click.FloatRange(min=0, min_open=True), help="Tasks per second (not --load)."
)
@click.option(
    "--weights", help="Replace the fleet: one worker per weight, e.g. 1,2,4 (speed = weight)."
)
@click.option("--speeds", help="Speeds of the --weights workers, e.g. 1,1,1.")
@click.option("--max-in-flight", type=click.IntRange(min=1), help="Every worker's max in flight.")
@click.option(
    "--execution",
    type=click.Choice(EXECUTIONS),
    help="How a worker works off what it holds (see docs/scheduling.md).",
)
@click.option("--cost", "distribution", type=click.Choice(DISTRIBUTIONS), help="Cost law.")
@click.option("--alpha", type=click.FloatRange(min=1, min_open=True), help="Pareto shape.")
@click.option(
    "--crash", multiple=True, metavar="WORKER@SECONDS", help="Crash a worker (repeatable)."
)
@click.option(
    "--policy",
    "policies",
    multiple=True,
    type=click.Choice(list(POLICIES)),
    help="Policies to compare (repeatable; default all).",
)
@click.option("--json", "as_json_flag", is_flag=True, help="Print JSON instead of tables.")
@click.option("--markdown", is_flag=True, help="Print Markdown tables instead.")
@click.option(
    "--plot",
    "plot_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Draw cumulative service per worker over time to this PNG.",
)
def simulate(
    preset_name: str,
    config_path: Path | None,
    seed: int | None,
    tasks: int | None,
    load: float | None,
    rate: float | None,
    weights: str | None,
    speeds: str | None,
    max_in_flight: int | None,
    execution: str | None,
    distribution: str | None,
    alpha: float | None,
    crash: tuple[str, ...],
    policies: tuple[str, ...],
    as_json_flag: bool,
    markdown: bool,
    plot_path: Path | None,
) -> None:
    """Simulate a fleet and a workload under agentq's DRR, round-robin and least-loaded.

    Prints each policy's share error (in units of the largest task cost), Jain's
    index of weight-normalized service, makespan, p50/p99 queue wait and the
    number of tasks never dispatched, then each worker's share of served cost.

    The tenants scenarios (--scenario tenants, tenants-weighted, tenants-nested, or a
    YAML file with teams) compare AgentQueues (hierarchical DRR by cost, then the
    workers' DRR) with one queue of every team's tasks, and print each queue's
    share of the cost granted while every queue is backlogged.
    """
    try:
        if config_path is not None:
            scenario = scenario_from_mapping(yaml.safe_load(config_path.read_text()))
        else:
            scenario = preset(preset_name)
        if weights is not None:
            weight_list = _floats(weights, "--weights")
            speed_list = _floats(speeds, "--speeds") if speeds else weight_list
            if len(speed_list) != len(weight_list):
                raise click.BadParameter("give one speed per weight", param_hint="--speeds")
            scenario = replace(
                scenario,
                workers=tuple(
                    WorkerConfig(f"w{i + 1}", weight=w, speed=s)
                    for i, (w, s) in enumerate(zip(weight_list, speed_list, strict=True))
                ),
            )
        elif speeds is not None:
            raise click.BadParameter("--speeds goes with --weights", param_hint="--speeds")
        if max_in_flight is not None:
            scenario = replace(
                scenario,
                workers=tuple(replace(w, max_in_flight=max_in_flight) for w in scenario.workers),
            )
        if distribution is not None:
            scenario = replace(scenario, cost=replace(scenario.cost, distribution=distribution))
        if alpha is not None:
            scenario = replace(scenario, cost=replace(scenario.cost, alpha=alpha))
        if load is not None:
            scenario = replace(scenario, load=load, arrival_rate=None)
        elif rate is not None:
            scenario = replace(scenario, load=None, arrival_rate=rate)
        if seed is not None:
            scenario = replace(scenario, seed=seed)
        if tasks is not None:
            scenario = replace(scenario, tasks=tasks)
        if execution is not None:
            scenario = replace(scenario, execution=execution)
        scenario = _crashes(scenario, crash).check()
        if scenario.tenants:
            # Each team says how many tasks it sends and when; the policies compared are
            # the queue level's, over the workers' DRR.
            given = [
                flag
                for flag, value in (
                    ("--tasks", tasks),
                    ("--load", load),
                    ("--rate", rate),
                    ("--policy", policies or None),
                )
                if value is not None
            ]
            if given:
                raise ScenarioError(
                    f"{', '.join(given)}: does not apply to a tenants scenario (its teams say "
                    "how many tasks they send and when; it compares queues with no-queues)"
                )
    except (ScenarioError, yaml.YAMLError, OSError) as error:
        raise click.UsageError(str(error)) from error

    if scenario.tenants:
        _tenants(scenario, as_json_flag=as_json_flag, markdown=markdown, plot_path=plot_path)
        return
    results = compare(scenario, policies or tuple(POLICIES))
    summaries = [summary for _, summary in results]
    fleet = ", ".join(f"{w.name} (w={w.weight:g})" for w in scenario.workers)
    title = (
        f"{scenario.tasks} tasks, {scenario.cost.distribution} costs, load "
        f"{scenario.load if scenario.load is not None else '-'}, {scenario.execution} "
        f"execution, seed {scenario.seed}: {fleet}"
    )
    if plot_path is not None:
        plot([run for run, _ in results], plot_path, title=title)
    if as_json_flag:
        click.echo(as_json(summaries))
    elif markdown:
        click.echo(as_markdown(summaries))
    else:
        print_tables(summaries, title=title, console=Console())
        if plot_path is not None:
            click.echo(f"plot written to {plot_path}")


def _tenants(
    scenario: Scenario, *, as_json_flag: bool, markdown: bool, plot_path: Path | None
) -> None:
    results = tenants.compare_tenants(scenario)
    queues = ", ".join(f"{q.name} (w={q.weight:g})" for q in scenario.queues)
    floods = ", ".join(
        f"{t.queue} {t.tasks}"
        + (f" after {t.after_completions} completions" if t.after_completions else " at once")
        for t in scenario.teams
    )
    title = (
        f"{floods}; queues {queues}; {len(scenario.workers)} workers; "
        f"{scenario.cost.distribution} costs, {scenario.execution} execution, seed {scenario.seed}"
    )
    if plot_path is not None:
        tenants.plot(results, plot_path, title=title)
    if as_json_flag:
        click.echo(tenants.as_json(results))
    elif markdown:
        click.echo(tenants.as_markdown(results))
    else:
        tenants.print_tables(results, title=title, console=Console())
        if plot_path is not None:
            click.echo(f"plot written to {plot_path}")
