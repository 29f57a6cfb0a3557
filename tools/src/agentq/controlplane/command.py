"""``agentq cluster``: bring the embedded control plane up, down, or describe it."""

from __future__ import annotations

import json
import shlex
import sys
import time
from dataclasses import asdict
from pathlib import Path

import click

from agentq.controlplane import binaries, host, node
from agentq.controlplane.cluster import Cluster, ClusterError, default_state_dir
from agentq.controlplane.versions import (
    ETCD_VERSION,
    HELM_VERSION,
    KEDA_VERSION,
    KUBERNETES_VERSION,
)


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
@click.option(
    "--helm",
    "helm_only",
    is_flag=True,
    help=f"Only helm ({HELM_VERSION}, for charts/agentq), not the control plane.",
)
@click.option(
    "--keda",
    "keda_only",
    is_flag=True,
    help=f"Only KEDA ({KEDA_VERSION}: operator, metrics adapter, CRDs), not the control plane.",
)
def build(node: bool, helm_only: bool, keda_only: bool) -> None:
    """Build (or find) the control-plane binaries and print where they are."""
    try:
        if keda_only:
            paths = binaries.resolve(build=True, say=_say, binary_set=binaries.KEDA)
        elif helm_only:
            paths = binaries.resolve(build=True, say=_say, binary_set=binaries.HELM)
        else:
            click.echo(f"# etcd {ETCD_VERSION}, Kubernetes {KUBERNETES_VERSION}", err=True)
            paths = binaries.resolve(build=True, say=_say)
        if node:
            paths |= binaries.resolve(build=True, say=_say, binary_set=binaries.NODE)
    except binaries.BinaryError as err:
        raise click.ClickException(str(err)) from err
    for name, path in paths.items():
        click.echo(f"{name}\t{path}")


@cluster.command()
@click.option("--tag", default="agentq:dev", show_default=True, help="Image name and tag.")
@click.option(
    "--context",
    type=click.Path(file_okay=False, exists=True, path_type=Path),
    default=None,
    help="Directory with the Dockerfile [default: this checkout].",
)
@click.option("--no-load", is_flag=True, help="Do not import it into the running local node.")
@state_dir_option
def image(tag: str, context: Path | None, no_load: bool, state_dir: Path | None) -> None:
    """Build the agentq image with a private dockerd (no registry needed), save it to a
    tarball, and import it into the local node if one runs (needs root)."""
    from agentq.controlplane import imagebuild

    try:
        archive = imagebuild.build(context or binaries.source_dir().parents[1], tag=tag, say=_say)
    except (imagebuild.ImageError, host.HostError) as err:
        raise click.ClickException(str(err)) from err
    click.echo(str(archive))
    if not no_load and Cluster(state_dir).load() is not None:
        _load(archive, state_dir)


@cluster.command()
@click.argument("archive", type=click.Path(dir_okay=False, exists=True, path_type=Path))
@state_dir_option
def load(archive: Path, state_dir: Path | None) -> None:
    """Import an image archive (docker save) into the local node's containerd."""
    _load(archive, state_dir)


def _load(archive: Path, state_dir: Path | None) -> None:
    state = Cluster(state_dir).load()
    if state is None or not state.node or "containerd_socket" not in state.node:
        raise click.ClickException(
            "no local node is running; start one with 'agentq cluster up --node'"
        )
    local = node.LocalNode(Path(state.state_dir))
    node_state = node.NodeState(**state.node)
    started = time.monotonic()
    try:
        local.import_image(node_state, archive)
    except (node.NodeError, host.HostError) as err:
        raise click.ClickException(str(err)) from err
    _say(f"imported {archive} into the node's containerd in {time.monotonic() - started:.0f} s")


def _print_env(kubeconfig: str, bin_dir: str) -> None:
    click.echo(f"export KUBECONFIG={shlex.quote(kubeconfig)}")
    click.echo(f'export PATH={shlex.quote(bin_dir)}:"$PATH"')
