"""The task verbs ``submit``, ``wait`` and ``cancel``: reading manifests, argument
parsing, what to print and the exit code. The requests are ``agentq.client``'s (the
same code a Python user runs); its errors become ``OpsError``s here.

``wait`` exits as ``kubectl wait`` does, by outcome: 0 when every task Succeeded,
else the code of the worst outcome (``errors.PRECEDENCE``).
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

import click
import yaml

from agentq import GROUP
from agentq.client import (
    ApiError,
    Client,
    End,
    ListTimeout,
    ManifestError,
    NoCluster,
    Outcome,
    Task,
    TaskNotFound,
    Unreachable,
    check_manifest,
    final_end,
)
from agentq.ops.commands import (
    EXIT_CODES_HELP,
    RATE,
    Duration,
    cluster_options,
    handles_errors,
)
from agentq.ops.errors import Exit, OpsError, worst
from agentq.ops.kube import NO_CLUSTER_HINT, REQUEST_TIMEOUT, find_config, refusal
from agentq.ops.redrive import Pacer
from agentq.ops.render import FORMATS, emit

P = ParamSpec("P")
R = TypeVar("R")
Body = dict[str, Any]

EXIT_BY_END = {
    End.SUCCEEDED: Exit.OK,
    End.FAILED: Exit.FAILED,
    End.DEAD_LETTERED: Exit.FAILED,
    End.CANCELLED: Exit.CANCELLED,
    End.NOT_FOUND: Exit.NOT_FOUND,
    End.DELETED: Exit.NOT_FOUND,
    End.TIMEOUT: Exit.TIMEOUT,
}
# What a task may be called on the command line besides its name (kubectl's forms).
PREFIXES = (
    "agenttask/",
    "agenttasks/",
    "atask/",
    f"agenttask.{GROUP}/",
    f"agenttasks.{GROUP}/",
)
RESULT_SHOWN = 200  # characters of a result printed on a text line


# --- connecting, and the client's errors as OpsErrors ---------------------------------------


@contextlib.contextmanager
def connected(
    kubeconfig: str | None, context: str | None, namespace: str | None
) -> Iterator[Client]:
    """An ``agentq.client.Client`` as kubectl would connect, its errors as ``OpsError``s."""
    config = find_config(kubeconfig, context)
    connect, read = REQUEST_TIMEOUT
    client = Client(config, namespace=namespace, timeout=connect + read)
    try:
        with translated(config.server, config.source):
            yield client
    finally:
        client.close()


@contextlib.contextmanager
def translated(server: str, source: str, what: str = "") -> Iterator[None]:
    try:
        yield
    except Unreachable as err:
        raise OpsError(
            f"{err} ({source}). Is the cluster running? {NO_CLUSTER_HINT}", Exit.NO_CLUSTER
        ) from err
    except NoCluster as err:
        raise OpsError(f"{err} ({source})", Exit.NO_CLUSTER) from err
    except ApiError as err:
        raise refusal(err.status, err.body, err.text, what, server=server, source=source) from err


def task_name(arg: str) -> str:
    """NAME, or agenttask/NAME and the other forms kubectl prints."""
    for prefix in PREFIXES:
        if arg.startswith(prefix):
            return arg[len(prefix) :]
    if "/" in arg:
        raise click.BadParameter(
            f"{arg!r} is not an AgentTask (give NAME or agenttask/NAME)", param_hint="NAME"
        )
    return arg


# --- reading manifests ----------------------------------------------------------------------


@dataclass(frozen=True)
class Document:
    source: str  # file name (or "-"), with the document's index when there are several
    body: Body


def read_documents(files: Iterable[str], stdin: Callable[[], str]) -> list[Document]:
    """Every AgentTask of ``files`` (YAML or JSON, several documents each, a ``List``'s
    items, a directory's *.yaml / *.yml / *.json); ``OpsError(USAGE)`` for what cannot
    be read. Nothing is checked against the schema here: that is the API server's."""
    documents: list[Document] = []
    for name in files:
        for source, text in _texts(name, stdin):
            try:
                loaded = [d for d in yaml.safe_load_all(text) if d is not None]
            except yaml.YAMLError as err:
                raise OpsError(f"{source}: not YAML or JSON: {err}", Exit.USAGE) from err
            for index, doc in enumerate(_flatten(loaded, source)):
                label = f"{source}#{index + 1}" if len(loaded) > 1 else source
                if not isinstance(doc, dict):
                    raise OpsError(
                        f"{label}: a manifest is a mapping, not {type(doc).__name__}", Exit.USAGE
                    )
                problem = json_problem(doc)
                if problem is not None:
                    raise OpsError(f"{label}: {problem}", Exit.USAGE)
                documents.append(Document(label, doc))
    if not documents:
        raise OpsError(f"no manifest in {', '.join(files)}", Exit.USAGE)
    return documents


def _texts(name: str, stdin: Callable[[], str]) -> Iterator[tuple[str, str]]:
    if name == "-":
        yield "-", stdin()
        return
    path = Path(name)
    try:
        if path.is_dir():
            found = sorted(
                p for p in path.iterdir() if p.suffix in (".yaml", ".yml", ".json") and p.is_file()
            )
            for file in found:
                yield str(file), file.read_text()
            return
        yield name, path.read_text()
    except (OSError, UnicodeDecodeError) as err:
        raise OpsError(f"cannot read {name}: {err}", Exit.USAGE) from err


def _flatten(docs: list[Any], source: str) -> Iterator[Any]:
    for doc in docs:
        if isinstance(doc, dict) and str(doc.get("kind", "")).endswith("List"):
            items = doc.get("items") or []
            if not isinstance(items, list):
                raise OpsError(
                    f"{source}: a {doc.get('kind')}'s items are a list, not {type(items).__name__}",
                    Exit.USAGE,
                )
            yield from items
        else:
            yield doc


#: The most values a manifest may hold once YAML's aliases are expanded: far above any
#: AgentTask etcd stores (1.5 MiB), far below what a few bytes of nested aliases make.
MAX_MANIFEST_VALUES = 200_000
_JSON_SCALARS = (str, int, float, bool, type(None))


def json_problem(doc: Any) -> str | None:
    """Why ``doc`` cannot be sent as JSON, or None: a value YAML reads that JSON has not
    (a date, binary, a set, a non-string key), or more than ``MAX_MANIFEST_VALUES``
    values once aliases are expanded (a "billion laughs" of a few hundred bytes)."""
    stack: list[tuple[Any, str]] = [(doc, "")]
    seen = 0
    while stack:
        value, path = stack.pop()
        seen += 1
        if seen > MAX_MANIFEST_VALUES:
            return (
                f"more than {MAX_MANIFEST_VALUES:,} values once its YAML aliases are "
                "expanded: not a manifest the API server would take"
            )
        if isinstance(value, dict):
            for key, item in value.items():
                if not isinstance(key, str):
                    return f"{path or 'the manifest'} has a key that is not a string: {key!r}"
                stack.append((item, f"{path}.{key}" if path else key))
        elif isinstance(value, list):
            stack.extend((item, f"{path}[{i}]") for i, item in enumerate(value))
        elif not isinstance(value, _JSON_SCALARS) or (isinstance(value, float) and value != value):
            return (
                f"{path or 'the manifest'} is a {type(value).__name__} ({value!r:.60}), which "
                "JSON has not: quote it to send it as a string"
            )
    return None


# --- printing outcomes ----------------------------------------------------------------------


def outcome_line(outcome: Outcome) -> str:
    """``agenttask/x Succeeded: {"by": "w"}`` / ``agenttask/y Failed: AgentError: ...``."""
    line = f"agenttask/{outcome.name} {outcome.describe()}"
    if outcome.ok:
        if outcome.result is not None:
            shown = json.dumps(outcome.result, separators=(",", ":"), default=str)
            if len(shown) > RESULT_SHOWN:
                shown = shown[: RESULT_SHOWN - 1] + "…"
            line += f": {shown}"
        if outcome.result_ref:
            line += f" (result at {outcome.result_ref})"
    return line


def follow(
    client: Client,
    *,
    tasks: list[Task] | None = None,
    selector: str | None = None,
    all_namespaces: bool = False,
    timeout: float | None,
    text: bool,
) -> tuple[list[Outcome], float]:
    """Wait for the tasks (handles: those ``submit`` returned start from the create's
    answer), printing each outcome as it comes (text); the outcomes in the order they
    came and the seconds waited."""
    started = time.monotonic()
    outcomes: list[Outcome] = []
    try:
        for outcome in client.as_completed(
            tasks, selector=selector, all_namespaces=all_namespaces, timeout=timeout
        ):
            outcomes.append(outcome)
            if text:
                line = outcome_line(outcome)
                if outcome.ok:
                    click.echo(line)
                else:
                    click.echo(f"error: {line}", err=True)
    except ListTimeout as err:
        raise OpsError(f"timed out: {err}", Exit.TIMEOUT) from err
    return outcomes, time.monotonic() - started


def outcomes_exit(outcomes: Iterable[Outcome]) -> Exit:
    return worst(EXIT_BY_END[o.end] for o in outcomes)


def _timeout_option(help_text: str) -> Callable[[Callable[P, R]], Callable[P, R]]:
    return click.option(
        "--timeout",
        type=Duration(),
        default=None,
        metavar="DURATION",
        help=help_text,
    )


def _output_option(choices: tuple[str, ...]) -> Callable[[Callable[P, R]], Callable[P, R]]:
    return click.option(
        "-o",
        "--output",
        type=click.Choice(choices),
        default="text",
        show_default=True,
        help="text for people; json or yaml for scripts",
    )


# --- submit ---------------------------------------------------------------------------------


@click.command(epilog=EXIT_CODES_HELP)
@click.option(
    "-f",
    "--filename",
    "files",
    multiple=True,
    required=True,
    metavar="FILE",
    help="AgentTask manifests: a YAML or JSON file (several documents), a directory, "
    "or - for stdin; repeatable",
)
@click.option("--wait", is_flag=True, help="then wait for each task and exit by outcome")
@_timeout_option("with --wait: how long (90, 90s, 5m, 1h); then exit 5 [default: no limit]")
@click.option(
    "--dry-run", is_flag=True, help="the API server validates them (server-side); none is created"
)
@cluster_options
@_output_option((*FORMATS, "name"))
@handles_errors
def submit(
    files: tuple[str, ...],
    wait: bool,
    timeout: float | None,
    dry_run: bool,
    namespace: str | None,
    kubeconfig: str | None,
    context: str | None,
    output: str,
) -> None:
    """Create the AgentTasks of FILEs and print their names; with --wait, wait for them.

    Each manifest is sent with strict field validation (as kubectl does): an unknown
    field, a bad value or a taken name is refused by the API server, whose message is
    printed, and the others are still created (exit 1). A manifest may use
    metadata.generateName; the name made up is printed. With --wait it then waits as
    `agentq wait` does and exits by outcome.

    \b
      agentq submit -f task.yaml --wait --timeout 10m
      agentq submit -f batch/ -o name | xargs agentq wait
      envsubst < task.yaml | agentq submit -f - -n agents
    """
    if timeout is not None and not wait:
        raise click.UsageError("--timeout goes with --wait")
    if wait and dry_run:
        raise click.UsageError("--dry-run creates nothing to wait for")
    documents = read_documents(files, stdin=lambda: sys.stdin.read())
    bodies = []
    for doc in documents:
        try:
            bodies.append((doc, check_manifest(doc.body, namespace=namespace)))
        except ManifestError as err:
            raise OpsError(f"{doc.source}: {err}", Exit.USAGE) from err
    text = output == "text"
    created: list[Body] = []
    refused: list[Body] = []
    codes = [Exit.OK]
    with connected(kubeconfig, context, namespace) as client:
        for doc, body in bodies:
            meta = body["metadata"]
            shown = meta.get("name") or f"{meta.get('generateName')}*"
            try:
                with translated(client.aio.config.server, client.aio.config.source):
                    task = client.submit(body, dry_run=dry_run)
            except OpsError as err:
                if err.code is Exit.NO_CLUSTER:
                    raise
                codes.append(err.code)
                refused.append({"source": doc.source, "name": shown, "message": str(err)})
                click.echo(f"error: {doc.source}: agenttask/{shown}: {err}", err=True)
                continue
            created.append({"namespace": task.namespace, "name": task.name, "task": task})
            if output == "name":
                click.echo(f"agenttask.{GROUP}/{task.name}")
            elif text:
                click.echo(f"agenttask/{task.name} created" + (" (dry run)" if dry_run else ""))
        outcomes: list[Outcome] = []
        waited = 0.0
        if wait and created:
            # The handles, not their names: the wait starts from each create's answer,
            # so a task finished and deleted at once (ttlSecondsAfterFinished: 0) is
            # still seen ending, not reported missing.
            outcomes, waited = follow(
                client,
                tasks=[c["task"] for c in created],
                timeout=timeout,
                text=text,
            )
            codes.append(outcomes_exit(outcomes))
    if output in ("json", "yaml"):
        report: dict[str, Any] = {
            "dryRun": dry_run,
            "created": [{"namespace": c["namespace"], "name": c["name"]} for c in created],
            "refused": refused,
        }
        if wait:
            report["outcomes"] = [o.to_dict() for o in outcomes]
            report["waitedSeconds"] = round(waited, 1)
        emit(report, output)
    code = worst(codes)
    if code is not Exit.OK:
        sys.exit(int(code))


# --- wait -----------------------------------------------------------------------------------


@click.command("wait", epilog=EXIT_CODES_HELP)
@click.argument("tasks", nargs=-1)
@click.option("-l", "--selector", metavar="SELECTOR", help="label selector, as kubectl")
@click.option("-A", "--all-namespaces", is_flag=True, help="with -l: every namespace")
@click.option(
    "--for",
    "condition",
    type=click.Choice(["finished"]),
    default="finished",
    show_default=True,
    help="finished: Succeeded, Failed, DeadLettered or Cancelled",
)
@_timeout_option(
    "how long (90, 90s, 5m, 1h; 0: look once); then exit 5 listing what is still going "
    "[default: no limit]"
)
@cluster_options
@_output_option(FORMATS)
@handles_errors
def wait_command(
    tasks: tuple[str, ...],
    selector: str | None,
    all_namespaces: bool,
    condition: str,
    timeout: float | None,
    namespace: str | None,
    kubeconfig: str | None,
    context: str | None,
    output: str,
) -> None:
    """Wait until the AgentTasks have finished; exit 0 only if every one Succeeded.

    Like `kubectl wait`, by NAME or by label selector (-l: the tasks matching when the
    wait begins). It prints each task's outcome as it comes (a success's result, a
    failure's error) and exits with the worst: 6 Failed or DeadLettered, 7 Cancelled,
    4 not found or deleted while waited on, 5 timed out. It watches (one WATCH per
    task, or per selector), it does not poll. Held tasks wait for a person: they end
    the wait only by its timeout.

    \b
      agentq wait summarise-42 -n agents --timeout 10m && echo done
      agentq wait -l batch=7 -o json | jq '.tasks[] | select(.outcome != "Succeeded")'
    """
    if bool(tasks) == (selector is not None):
        raise click.UsageError(
            "which tasks? give NAMEs or -l SELECTOR (not both)"
            if tasks
            else "which tasks? give NAMEs or -l SELECTOR"
        )
    if all_namespaces and selector is None:
        raise click.UsageError("-A/--all-namespaces goes with -l")
    names = [task_name(t) for t in tasks]
    text = output == "text"
    with connected(kubeconfig, context, namespace) as client:
        outcomes, waited = follow(
            client,
            tasks=[client.task(n) for n in dict.fromkeys(names)] if names else None,
            selector=selector,
            all_namespaces=all_namespaces,
            timeout=timeout,
            text=text,
        )
        where = "all namespaces" if all_namespaces else f"namespace {client.namespace}"
    if not text:
        emit(
            {
                "tasks": [o.to_dict() for o in outcomes],
                "waitedSeconds": round(waited, 1),
            },
            output,
        )
    if selector is not None and not outcomes:
        raise OpsError(f"no AgentTask matches {selector!r} in {where}", Exit.NOT_FOUND)
    code = outcomes_exit(outcomes)
    if code is not Exit.OK:
        sys.exit(int(code))


# --- cancel ---------------------------------------------------------------------------------


def cancel_verdict(task: Mapping[str, Any]) -> tuple[str, str]:
    """What ``cancel`` does with a task as read (pure): ("send", was), ("already", why),
    or ("finished", why) -- a finished task cannot be cancelled."""
    status = task.get("status") or {}
    phase = str(status.get("phase") or "Pending")
    end = final_end(task)  # a final phase with a requeue not yet honoured: not finished
    if end is End.CANCELLED:
        return "already", "already Cancelled"
    if end is not None:
        return "finished", f"it already finished ({phase})"
    if (task.get("spec") or {}).get("cancel"):
        return "already", f"cancel already requested (it is {phase})"
    return "send", phase


def task_entry(task: Mapping[str, Any], message: str | None = None) -> Body:
    """A task as the JSON report lists it."""
    meta = task.get("metadata") or {}
    entry = {
        "namespace": meta.get("namespace"),
        "name": meta.get("name"),
        "phase": (task.get("status") or {}).get("phase") or "Pending",
    }
    return entry if message is None else {**entry, "message": message}


@dataclass
class Cancels:
    """What ``cancel`` was asked, decided and did (its JSON report)."""

    matched: int = 0
    chosen: list[Body] = field(default_factory=list)  # to send (the tasks as read)
    already: list[Body] = field(default_factory=list)
    finished: list[Body] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    requested: list[Body] = field(default_factory=list)

    def sort(self, tasks: Iterable[Mapping[str, Any]]) -> None:
        """Each task to ``chosen``, ``already`` or ``finished`` (pure)."""
        for task in tasks:
            self.matched += 1
            verdict, why = cancel_verdict(task)
            if verdict == "send":
                self.chosen.append(dict(task))
            else:
                (self.already if verdict == "already" else self.finished).append(
                    task_entry(task, why)
                )

    def to_dict(self) -> Body:
        return {
            "matched": self.matched,
            "selected": [task_entry(t) for t in self.chosen],
            "requested": self.requested,
            "already": self.already,
            "finished": self.finished,
            "missing": self.missing,
        }


def _send_cancels(
    client: Client,
    cancels: Cancels,
    rate: float | None,
    *,
    say: Callable[[str], None],
    refuse: Callable[[str], None],
) -> None:
    """The merge patches, paced; a task that finished meanwhile is left as it is."""
    pacer = Pacer(rate, clock=time.monotonic, sleep=time.sleep)
    for task in cancels.chosen:
        pacer.wait()
        name, namespace = task["metadata"]["name"], task["metadata"]["namespace"]
        try:
            after = client.cancel(name, namespace)
        except TaskNotFound:
            cancels.missing.append(name)
            click.echo(f"error: agenttask/{name} was deleted meanwhile", err=True)
            continue
        verdict, why = cancel_verdict({**after, "spec": {}})
        if verdict == "finished":  # the patch landed, and changes nothing
            cancels.finished.append(task_entry(after, why))
            refuse(f"error: agenttask/{name} not cancelled: {why}")
            continue
        was = task_entry(task)["phase"]
        cancels.requested.append(task_entry(after, f"was {was}"))
        told = ": its agent is told at its next heartbeat" if was in ("Assigned", "Running") else ""
        say(f"agenttask/{name} cancel requested (was {was}{told})")


@click.command(epilog=EXIT_CODES_HELP)
@click.argument("tasks", nargs=-1)
@click.option("-l", "--selector", metavar="SELECTOR", help="label selector, as kubectl")
@click.option("-A", "--all-namespaces", is_flag=True, help="with -l: every namespace")
@click.option(
    "--rate",
    type=RATE,
    default=None,
    metavar="PER_SECOND",
    help="at most this many cancels per second [default: as fast as the API server takes them]",
)
@click.option("--dry-run", is_flag=True, help="say which tasks would be cancelled; change nothing")
@cluster_options
@_output_option(FORMATS)
@handles_errors
def cancel(
    tasks: tuple[str, ...],
    selector: str | None,
    all_namespaces: bool,
    rate: float | None,
    dry_run: bool,
    namespace: str | None,
    kubeconfig: str | None,
    context: str | None,
    output: str,
) -> None:
    """Cancel AgentTasks: set spec.cancel, and the operator ends each in phase Cancelled.

    A Pending or Held task ends at once; a running attempt's agent is told (409
    Cancelled) at its next heartbeat, and the task ends once its agent stops or its
    lease runs out. Idempotent: a task already cancelled, or whose cancel is under way,
    is reported as such. A named task that has already finished is reported and left
    as it is (exit 1); with -l finished tasks are only counted. `agentq requeue` undoes
    a cancel. `agentq wait` then waits for the tasks to end (exit 7: Cancelled).

    \b
      agentq cancel summarise-42 -n agents
      agentq cancel -l batch=7 --rate 20 --dry-run
    """
    if bool(tasks) == (selector is not None):
        raise click.UsageError(
            "which tasks? give NAMEs or -l SELECTOR (not both)"
            if tasks
            else "which tasks? give NAMEs or -l SELECTOR"
        )
    if all_namespaces and selector is None:
        raise click.UsageError("-A/--all-namespaces goes with -l")
    names = list(dict.fromkeys(task_name(t) for t in tasks))
    text = output == "text"

    def say(line: str) -> None:
        if text:
            click.echo(line)

    def refuse(line: str) -> None:  # a named task that had finished: an error; else counted
        if names:
            click.echo(line, err=True)

    cancels = Cancels()
    with connected(kubeconfig, context, namespace) as client:
        where = "all namespaces" if all_namespaces else f"namespace {client.namespace}"
        found = []
        if names:
            for name in names:
                try:
                    found.append(client.get(name))
                except TaskNotFound:
                    cancels.missing.append(name)
                    click.echo(f"error: agenttask {name!r} not found in {where}", err=True)
        else:
            found = [t.body for t in client.tasks(selector, all_namespaces=all_namespaces)]
        cancels.sort(found)
        for entry in cancels.already:
            say(f"agenttask/{entry['name']} {entry['message']}")
        for entry in cancels.finished:
            refuse(f"error: agenttask/{entry['name']} not cancelled: {entry['message']}")
        if selector is not None:
            chosen = ", ".join(t["metadata"]["name"] for t in cancels.chosen)
            say(
                f"{len(cancels.chosen)} task(s) to cancel of {cancels.matched} matched in {where}"
                + (f" ({len(cancels.finished)} already finished)" if cancels.finished else "")
                + (f": {chosen}" if chosen else "")
            )
        if dry_run:
            pace = f" at {rate:g}/s" if rate else ""
            say(f"dry run: would cancel {len(cancels.chosen)} task(s){pace}; nothing changed")
        else:
            _send_cancels(client, cancels, rate, say=say, refuse=refuse)
    if not text:
        emit({"dryRun": dry_run, "rate": rate, **cancels.to_dict()}, output)
    if cancels.missing:
        sys.exit(int(Exit.NOT_FOUND))
    if cancels.finished and names:
        sys.exit(int(Exit.PARTIAL))
