"""``agentq cluster``: bring the embedded control plane up, down, or describe it."""

from __future__ import annotations

import json
import shlex
import sys
from dataclasses import asdict
from pathlib import Path

import click

from agentq.controlplane import binaries
from agentq.controlplane.cluster import Cluster, ClusterError, default_state_dir
from agentq.controlplane.versions import ETCD_VERSION, KUBERNETES_VERSION


def _say(line: str) -> None:
    click.echo(line, err=True)


state_dir_option = click.option(
    "--state-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help=f"Where the cluster keeps its state [default: $AGENTQ_STATE_DIR or {default_state_dir()}]",
)


@click.group()
def cluster() -> None:
    """The embedded control plane: local etcd, kube-apiserver, kube-controller-manager."""


@cluster.command()
@state_dir_option
@click.option("--port", type=int, default=None, help="API server port [default: a free one]")
@click.option("--timeout", type=float, default=180.0, show_default=True, help="Seconds to wait.")
@click.option("--no-build", is_flag=True, help="Fail instead of building missing binaries.")
@click.option(
    "--node",
    "with_node",
    is_flag=True,
    help="Also run a local node (containerd, kubelet, kube-scheduler) so pods run; "
    "needs root. See docs/install.md for what it changes on the host.",
)
def up(
    state_dir: Path | None, port: int | None, timeout: float, no_build: bool, with_node: bool
) -> None:
    """Start the control plane (builds the binaries the first time) and wait until ready."""
    try:
        state = Cluster(state_dir).up(
            port=port, build=not no_build, timeout=timeout, with_node=with_node, say=_say
        )
    except (ClusterError, binaries.BinaryError) as err:
        raise click.ClickException(str(err)) from err
    if state.node:
        click.echo(f"# node {state.node['name']} Ready (pods run on it)")
    click.echo(f"# control plane ready at {state.server}; to use it:")
    _print_env(state.kubeconfig, state.bin_dir)


@cluster.command()
@state_dir_option
def down(state_dir: Path | None) -> None:
    """Stop every process the control plane started and remove its state.

    With a local node: also its pods, and every change it made to the host
    (bridge, iptables rules, sysctls, mounts, cgroups, directories), each named.
    """
    try:
        stopped = Cluster(state_dir).down(say=_say)
    except ClusterError as err:
        raise click.ClickException(str(err)) from err
    click.echo("control plane stopped" if stopped else "no control plane was running")


@cluster.command()
@state_dir_option
def env(state_dir: Path | None) -> None:
    """Print shell exports for the running control plane: eval "$(agentq cluster env)"."""
    state = Cluster(state_dir).load()
    if state is None:
        raise click.ClickException(
            "no control plane is running; start one with 'agentq cluster up'"
        )
    _print_env(state.kubeconfig, state.bin_dir)


@cluster.command()
@state_dir_option
@click.option("--json", "as_json", is_flag=True, help="Print the recorded state as JSON.")
def status(state_dir: Path | None, as_json: bool) -> None:
    """Say whether the control plane runs, where, and which of its processes are alive."""
    c = Cluster(state_dir)
    state = c.load()
    if state is None:
        click.echo("not running")
        sys.exit(1)
    alive = c.running(state)
    if as_json:
        click.echo(json.dumps({**asdict(state), "alive": alive}, indent=2))
    else:
        click.echo(f"server:     {state.server}")
        click.echo(f"kubeconfig: {state.kubeconfig}")
        for name, pid in state.pids.items():
            click.echo(f"{name:<24} pid {pid:<8} {'running' if alive[name] else 'DEAD'}")
    if not all(alive.values()):
        sys.exit(1)


@cluster.command()
@click.option("--node", is_flag=True, help="Also the local node's kubelet, scheduler and pause.")
def build(node: bool) -> None:
    """Build (or find) the control-plane binaries and print where they are."""
    click.echo(f"# etcd {ETCD_VERSION}, Kubernetes {KUBERNETES_VERSION}", err=True)
    try:
        paths = binaries.resolve(build=True, say=_say)
        if node:
            paths |= binaries.resolve(build=True, say=_say, binary_set=binaries.NODE)
    except binaries.BinaryError as err:
        raise click.ClickException(str(err)) from err
    for name, path in paths.items():
        click.echo(f"{name}\t{path}")


def _print_env(kubeconfig: str, bin_dir: str) -> None:
    click.echo(f"export KUBECONFIG={shlex.quote(kubeconfig)}")
    click.echo(f'export PATH={shlex.quote(bin_dir)}:"$PATH"')
