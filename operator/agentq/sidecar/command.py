"""``agentq sidecar``: wiring, signals and shutdown of the heartbeat sidecar.

Every flag can also come from the environment (the names are in ``--help``), so
the same image runs as a native sidecar container configured by env vars.

Start-up: make the pod's secret and write it to the token file (``sidecar.auth``),
bind the HTTP API and the metrics/health port (print one JSON line with both
addresses), then keep the worker Lease, watch the worker's task Leases once the
worker Lease is held, renew, and register the AgentWorker if asked.

SIGTERM / SIGINT: stop renewing at once, refuse new agent requests (503),
let writes already in flight finish (bounded), release the worker Lease so the
operator stops dispatching here, close the server and exit: all within
``--shutdown-seconds`` (default 5), well inside a pod's termination grace period.
Nothing is reported on the agent's behalf: its tasks' Leases simply run out.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
from aiohttp import web
from pydantic import ValidationError

from agentq import GROUP, VERSION, jsonlog, protocol
from agentq.agent import DEFAULT_TOKEN_FILE, TOKEN_FILE_ENV
from agentq.clock import Clock, SystemClock
from agentq.models import AgentWorkerSpec
from agentq.sidecar import metrics
from agentq.sidecar.api import AgentApi
from agentq.sidecar.attempts import Attempts
from agentq.sidecar.auth import Guard, is_loopback_listen, new_secret, write_token_file
from agentq.sidecar.changes import Changes
from agentq.sidecar.kubeapi import KubeApi
from agentq.sidecar.operator_claims import DEFAULT_TOKEN_FILE as DEFAULT_OPERATOR_TOKEN_FILE
from agentq.sidecar.operator_claims import OperatorClaims
from agentq.sidecar.registration import register
from agentq.sidecar.renewer import Renewer
from agentq.sidecar.watcher import TaskLeaseWatcher
from agentq.sidecar.worker_lease import WorkerLeaseKeeper

log = logging.getLogger("agentq.sidecar")

DEFAULT_LISTEN = "127.0.0.1:8700"
DEFAULT_METRICS_LISTEN = "127.0.0.1:8701"
_SA_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


@dataclass(frozen=True)
class SidecarConfig:
    worker: str
    namespace: str
    host: str
    port: int
    identity: str
    kubeconfig: str | None = None
    worker_lease_seconds: int = 15
    shutdown_seconds: float = 5.0
    register: dict[str, Any] | None = None  # the AgentWorker spec to create or update
    token_file: str = DEFAULT_TOKEN_FILE  # where the pod's secret is written at start
    metrics_host: str | None = "127.0.0.1"  # None: no metrics/health port
    metrics_port: int = 8701
    # Where cross-namespace claims' tasks are read (None: such claims are not served),
    # and the projected token (audience agentq.dev/operator) that authenticates us there.
    operator_url: str | None = None
    operator_token_file: str = DEFAULT_OPERATOR_TOKEN_FILE
    # With an https:// operator_url: the CA bundle its certificate must chain to, and
    # the name it must carry when not the URL's host.
    operator_ca_file: str | None = None
    operator_server_name: str | None = None
    # The pod (name is identity) that owns the registered AgentWorker: garbage-collected
    # with it. For a pool whose workers are its pods (docs/autoscaling.md).
    owner_pod_uid: str | None = None


class StartError(RuntimeError):
    """The sidecar cannot start (its token file cannot be written)."""


def parse_listen(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise click.BadParameter(f"{value!r} is not HOST:PORT")
    return host.strip("[]") or "127.0.0.1", int(port)


def _operator_url(value: str | None) -> str | None:
    if not value or not value.strip():
        return None
    value = value.strip()
    if not value.startswith(("http://", "https://")):
        raise click.BadParameter(f"{value!r} is not an http(s) URL", param_hint="--operator-url")
    return value


def default_namespace() -> str:
    try:
        return _SA_NAMESPACE.read_text().strip() or "default"
    except OSError:
        return "default"


class Sidecar:
    """The running sidecar: its state, loops and HTTP server."""

    def __init__(self, config: SidecarConfig, *, clock: Clock | None = None) -> None:
        self.config = config
        self.clock = clock or SystemClock()
        self.secret = new_secret()  # this start's: the agent reads it from the token file
        self.api = KubeApi.from_kubeconfig(config.kubeconfig)
        self.attempts = Attempts(namespace=config.namespace, worker=config.worker)
        self.changes = Changes()
        self.claims = (
            OperatorClaims(
                config.operator_url,
                config.operator_token_file,
                ca_file=config.operator_ca_file,
                server_name=config.operator_server_name,
            )
            if config.operator_url
            else None
        )
        if config.operator_url and config.operator_url.startswith("http://"):
            log.warning(
                "--operator-url %s is plain HTTP: cross-namespace tasks' payloads and this "
                "worker's operator token cross the pod network in clear text; serve the "
                "claim port over TLS and give --operator-ca-file (docs/security.md)",
                config.operator_url,
            )
        self.keeper = WorkerLeaseKeeper(
            self.api,
            self.clock,
            namespace=config.namespace,
            worker=config.worker,
            identity=config.identity,
            duration_seconds=config.worker_lease_seconds,
            on_acquired=self._acquired,
            on_lost=self._lost,
            on_confirmed=self.changes.notify,
        )
        self.watcher = TaskLeaseWatcher(
            self.api,
            self.clock,
            self.attempts,
            self.changes,
            namespace=config.namespace,
            worker=config.worker,
            serve_from_rv=lambda: self.keeper.serve_from_rv,
            claims=self.claims,
        )
        self.renewer = Renewer(
            self.api,
            self.clock,
            self.attempts,
            self.changes,
            self.keeper,
            worker=config.worker,
        )
        self.agent_api = AgentApi(
            clock=self.clock,
            attempts=self.attempts,
            changes=self.changes,
            renewer=self.renewer,
            keeper=self.keeper,
            watcher=self.watcher,
            worker=config.worker,
            namespace=config.namespace,
            identity=config.identity,
            loops=self._dead_loops,
            guard=Guard(secret=self.secret, listen_host=config.host, token_file=config.token_file),
        )
        self._loops: dict[str, asyncio.Task[Any]] = {}
        self.address = ""
        self.metrics_address = ""

    def _acquired(self, serve_from_rv: int) -> None:
        self.watcher.resume()
        self.changes.notify()

    def _lost(self, reason: str) -> None:
        self.watcher.pause()
        self.attempts.lose_all(f"this sidecar lost the worker Lease: {reason}")
        self.changes.notify()

    def _dead_loops(self) -> list[str]:
        return [name for name, task in self._loops.items() if task.done()]

    async def run(self, stop: asyncio.Event) -> None:
        metrics.REGISTRY.register(metrics.ApiRequestCollector(lambda: dict(self.api.requests)))
        # The secret is in place before the API answers: an agent that can connect can
        # read it. A restarted sidecar replaces the last one, which stops working.
        try:
            write_token_file(Path(self.config.token_file), self.secret)
        except OSError as err:
            raise StartError(
                f"cannot write the token file {self.config.token_file}: {err} "
                f"(set --token-file / ${TOKEN_FILE_ENV} to a writable place the agent can "
                "read)"
            ) from err
        if not is_loopback_listen(self.config.host):
            log.warning(
                "the agent API listens on %s, beyond this pod's loopback: only the secret in "
                "%s protects it",
                self.config.host,
                self.config.token_file,
            )
        runner = web.AppRunner(self.agent_api.app(), access_log=None, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, self.config.host, self.config.port, reuse_address=True)
        await site.start()
        self.address = _bound(runner, self.config.host, self.config.port)
        runners = [runner]
        if self.config.metrics_host is not None:
            health = web.AppRunner(
                self.agent_api.health_app(), access_log=None, handle_signals=False
            )
            await health.setup()
            await web.TCPSite(
                health, self.config.metrics_host, self.config.metrics_port, reuse_address=True
            ).start()
            self.metrics_address = _bound(
                health, self.config.metrics_host, self.config.metrics_port
            )
            runners.append(health)
        print(
            json.dumps(
                {
                    "event": "serving",
                    "listen": self.address,
                    "url": f"http://{self.address}",
                    "metricsUrl": f"http://{self.metrics_address}"
                    if self.metrics_address
                    else None,
                    "tokenFile": self.config.token_file,
                    "worker": self.config.worker,
                    "namespace": self.config.namespace,
                    "identity": self.config.identity,
                    "operatorUrl": self.config.operator_url,
                }
            ),
            flush=True,
        )
        self._loops = {
            "worker-lease": asyncio.create_task(self.keeper.run(stop)),
            "watch": asyncio.create_task(self.watcher.run(stop)),
            "renewal": asyncio.create_task(self.renewer.run(stop)),
        }
        registration = None
        if self.config.register is not None:
            registration = asyncio.create_task(
                register(
                    self.api,
                    namespace=self.config.namespace,
                    worker=self.config.worker,
                    spec=self.config.register,
                    stop=stop,
                    owner=(
                        {
                            "apiVersion": "v1",
                            "kind": "Pod",
                            "name": self.config.identity,
                            "uid": self.config.owner_pod_uid,
                        }
                        if self.config.owner_pod_uid
                        else None
                    ),
                    on_registered=self._own_worker_lease,
                )
            )
        try:
            await stop.wait()
        finally:
            await self._shutdown(runners, registration)

    def _own_worker_lease(self, agent_worker: dict[str, Any]) -> None:
        """The worker Lease goes with the AgentWorker we registered (its owner)."""
        uid = (agent_worker.get("metadata") or {}).get("uid")
        if uid:
            self.keeper.own_by(
                {
                    "apiVersion": f"{GROUP}/{VERSION}",
                    "kind": "AgentWorker",
                    "name": self.config.worker,
                    "uid": uid,
                }
            )

    async def _shutdown(
        self, runners: list[web.AppRunner], registration: asyncio.Task[Any] | None
    ) -> None:
        budget = self.config.shutdown_seconds
        self.agent_api.stopping = True
        self.changes.notify()  # long-polls end; the renewal loop sees ``stop`` and returns
        for name in ("renewal", "watch"):
            task = self._loops.get(name)
            if task is not None:
                task.cancel()
        if registration is not None:
            registration.cancel()
        # Writes already sent (reports the agent is waiting for) may finish.
        await self.renewer.drain(timeout=budget * 0.4)
        keeper = self._loops.get("worker-lease")
        if keeper is not None:
            keeper.cancel()
        await asyncio.gather(*self._loops.values(), return_exceptions=True)
        try:
            await asyncio.wait_for(self.keeper.release(), timeout=budget * 0.4)
        except Exception as err:  # the API server may be away: the Lease then just expires
            log.warning("could not release the worker Lease: %r", err)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.watcher.close(), timeout=0.5)
        for runner in runners:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(runner.cleanup(), timeout=budget * 0.1)
        if self.claims is not None:
            with contextlib.suppress(Exception):
                await self.claims.close()
        await self.api.close()
        log.info("stopped")


def _bound(runner: web.AppRunner, host: str, port: int) -> str:
    for address in runner.addresses:
        if isinstance(address, tuple) and len(address) >= 2:
            bound_host, bound_port = str(address[0]), int(address[1])
            shown = f"[{bound_host}]" if ":" in bound_host else bound_host
            return f"{shown}:{bound_port}"
    return f"{host}:{port}"


async def serve(config: SidecarConfig) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await Sidecar(config).run(stop)


@click.command()
@click.option(
    "--worker", envvar="AGENTQ_WORKER", required=True, help="AgentWorker name [AGENTQ_WORKER]"
)
@click.option(
    "--namespace",
    envvar=["AGENTQ_NAMESPACE", "POD_NAMESPACE"],
    help="[AGENTQ_NAMESPACE, POD_NAMESPACE; default: the pod's namespace, else 'default']",
)
@click.option(
    "--listen",
    envvar="AGENTQ_SIDECAR_LISTEN",
    default=DEFAULT_LISTEN,
    show_default=True,
    help="HOST:PORT of the agent API (port 0: any free port) [AGENTQ_SIDECAR_LISTEN]",
)
@click.option(
    "--token-file",
    envvar=TOKEN_FILE_ENV,
    default=DEFAULT_TOKEN_FILE,
    show_default=True,
    help="where to write this start's secret (0600), which every agent API call must "
    f"carry as 'Authorization: Bearer <secret>' [{TOKEN_FILE_ENV}]",
)
@click.option(
    "--metrics-listen",
    envvar="AGENTQ_SIDECAR_METRICS_LISTEN",
    default=DEFAULT_METRICS_LISTEN,
    show_default=True,
    help="HOST:PORT of /metrics, /healthz and /readyz (no secret needed; 'off': none) "
    "[AGENTQ_SIDECAR_METRICS_LISTEN]",
)
@click.option(
    "--kubeconfig",
    envvar="AGENTQ_KUBECONFIG",
    help="[AGENTQ_KUBECONFIG; default: in-cluster, else $KUBECONFIG or ~/.kube/config]",
)
@click.option(
    "--identity",
    envvar=["AGENTQ_IDENTITY", "POD_NAME"],
    help="holderIdentity of the worker Lease [AGENTQ_IDENTITY, POD_NAME; default: hostname]",
)
@click.option(
    "--capabilities",
    envvar="AGENTQ_CAPABILITIES",
    help="register/update the AgentWorker with these capabilities (comma list) "
    "[AGENTQ_CAPABILITIES]",
)
@click.option(
    "--weight", envvar="AGENTQ_WEIGHT", type=float, help="with --capabilities [AGENTQ_WEIGHT]"
)
@click.option(
    "--max-in-flight",
    envvar="AGENTQ_MAX_IN_FLIGHT",
    type=int,
    help="with --capabilities [AGENTQ_MAX_IN_FLIGHT]",
)
@click.option(
    "--worker-lease-seconds",
    envvar="AGENTQ_WORKER_LEASE_SECONDS",
    type=click.IntRange(min=2, max=3600),
    default=15,
    show_default=True,
    help="duration of the worker Lease; renewed every third of it [AGENTQ_WORKER_LEASE_SECONDS]",
)
@click.option(
    "--shutdown-seconds",
    envvar="AGENTQ_SHUTDOWN_SECONDS",
    type=click.FloatRange(min=0.5, max=60),
    default=5.0,
    show_default=True,
    help="longest a SIGTERM shutdown takes [AGENTQ_SHUTDOWN_SECONDS]",
)
@click.option(
    "--operator-url",
    envvar="AGENTQ_OPERATOR_URL",
    help="the operator's claim API (e.g. https://agentq-operator-claims.agentq-system.svc:8444, "
    "with --operator-ca-file), "
    "where the tasks of cross-namespace claims are read; unset: such claims are not served "
    "[AGENTQ_OPERATOR_URL]",
)
@click.option(
    "--operator-token-file",
    envvar="AGENTQ_OPERATOR_TOKEN_FILE",
    default=DEFAULT_OPERATOR_TOKEN_FILE,
    show_default=True,
    help="a projected ServiceAccount token of audience agentq.dev/operator, read for every "
    "claim read (it rotates) [AGENTQ_OPERATOR_TOKEN_FILE]",
)
@click.option(
    "--operator-ca-file",
    envvar="AGENTQ_OPERATOR_CA_FILE",
    help="with an https --operator-url: the PEM CA bundle the operator's certificate must "
    "chain to (the only CA trusted; re-read when it changes); required for https "
    "[AGENTQ_OPERATOR_CA_FILE]",
)
@click.option(
    "--operator-server-name",
    envvar="AGENTQ_OPERATOR_SERVER_NAME",
    help="the name the operator's certificate must carry, when not --operator-url's host "
    "[AGENTQ_OPERATOR_SERVER_NAME]",
)
@click.option(
    "--owner-pod-uid",
    envvar="AGENTQ_OWNER_POD_UID",
    help="with --capabilities: the registered AgentWorker is owned by this pod (its "
    "--identity is the pod's name) and deleted with it; for a pool whose workers are "
    "its pods [AGENTQ_OWNER_POD_UID]",
)
@click.option(
    "--log-level",
    envvar="AGENTQ_LOG_LEVEL",
    default="INFO",
    show_default=True,
    type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"]),
)
def sidecar(
    worker: str,
    namespace: str | None,
    listen: str,
    token_file: str,
    metrics_listen: str,
    kubeconfig: str | None,
    identity: str | None,
    capabilities: str | None,
    weight: float | None,
    max_in_flight: int | None,
    worker_lease_seconds: int,
    shutdown_seconds: float,
    operator_url: str | None,
    operator_token_file: str,
    operator_ca_file: str | None,
    operator_server_name: str | None,
    owner_pod_uid: str | None,
    log_level: str,
) -> None:
    """Run the heartbeat sidecar of one agent: worker Lease, task Leases, agent API."""
    jsonlog.setup(log_level)
    try:
        protocol.label_value(worker)
    except protocol.ProtocolError as err:
        raise click.BadParameter(str(err), param_hint="--worker") from None
    host, port = parse_listen(listen)
    metrics_host: str | None = None
    metrics_port = 0
    if metrics_listen.strip().lower() != "off":
        metrics_host, metrics_port = parse_listen(metrics_listen)
    spec: dict[str, Any] | None = None
    if capabilities is not None:
        wanted: dict[str, Any] = {
            "capabilities": [c.strip() for c in capabilities.split(",") if c.strip()]
        }
        if weight is not None:
            wanted["weight"] = weight
        if max_in_flight is not None:
            wanted["maxInFlight"] = max_in_flight
        try:
            AgentWorkerSpec.model_validate(wanted)
        except ValidationError as err:
            raise click.BadParameter(
                f"not a valid AgentWorker spec {wanted}: {err}", param_hint="--capabilities"
            ) from None
        spec = wanted
    elif weight is not None or max_in_flight is not None:
        raise click.UsageError("--weight and --max-in-flight need --capabilities")
    url = _operator_url(operator_url)
    if url is not None and url.startswith("https://") and not operator_ca_file:
        raise click.UsageError(
            f"--operator-url {url} is https: give --operator-ca-file, the CA bundle of the "
            "operator's certificate (the chart's ConfigMap agentq-operator-ca; "
            "docs/security.md), so that the operator is verified"
        )
    config = SidecarConfig(
        worker=worker,
        namespace=namespace or default_namespace(),
        host=host,
        port=port,
        identity=identity or os.environ.get("HOSTNAME") or socket.gethostname(),
        kubeconfig=kubeconfig,
        worker_lease_seconds=worker_lease_seconds,
        shutdown_seconds=shutdown_seconds,
        register=spec,
        token_file=token_file,
        metrics_host=metrics_host,
        metrics_port=metrics_port,
        operator_url=url,
        operator_token_file=operator_token_file,
        operator_ca_file=operator_ca_file or None,
        operator_server_name=operator_server_name or None,
        owner_pod_uid=owner_pod_uid or None,
    )
    try:
        asyncio.run(serve(config))
    except StartError as err:
        raise click.ClickException(str(err)) from None
