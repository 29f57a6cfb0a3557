"""A leader stopped (SIGSTOP) with decisions queued must not send them after a standby
took over: the split brain the chaos run found (a worker over maxInFlight).

Replica A talks to the API server through a relay the test controls, with one write
slot (WRITE_CONCURRENCY=1): while the relay holds A's requests, A grants a decoy
task (its request stays on the wire) and decides a grant of ``new`` to worker ``w``
(queued behind it). A is then stopped; the standby B takes over, and since ``w`` was
given the capability an older task ``old`` waited for, B grants ``old`` to ``w``
(maxInFlight 1), so ``new`` waits. When A resumes, the grant it decided before the
stop must not go out.
"""

from __future__ import annotations

import contextlib
import signal
import socket
import threading
import time
import urllib.parse
from pathlib import Path
from typing import Any

import pytest
import yaml

from agentq import GROUP, VERSION
from builders import task, worker
from fleet import Fleet, Process

pytestmark = pytest.mark.integration

FLAGS = ("--leader-election", "--leader-lease-seconds", "4")


class Relay:
    """A TCP relay to the API server. ``hold()`` keeps what the client sends from
    reaching the server (its requests stay on the wire) until ``flow()``; what the
    server sends back always flows. TLS passes through untouched."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.flowing = threading.Event()
        self.flowing.set()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.sockets: list[socket.socket] = []
        self.threads: list[threading.Thread] = []
        self.closed = False
        # close() and _accept() race: a connection accepted while close() runs must be
        # closed too, or its socket is collected later, in another test, with a
        # ResourceWarning (which this suite treats as an error).
        self.lock = threading.Lock()
        self._start(self._accept)

    def _start(self, target: Any, *args: Any) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        self.threads.append(thread)
        thread.start()

    def hold(self) -> None:
        self.flowing.clear()

    def flow(self) -> None:
        self.flowing.set()

    def _accept(self) -> None:
        while not self.closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            with self.lock:
                if self.closed:
                    client.close()
                    upstream.close()
                    return
                self.sockets += [client, upstream]
                self._start(self._pump, client, upstream, True)
                self._start(self._pump, upstream, client, False)

    def _pump(self, src: socket.socket, dst: socket.socket, gated: bool) -> None:
        with contextlib.suppress(OSError):
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if gated:
                    self.flowing.wait()
                dst.sendall(data)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        with self.lock:
            self.closed = True
            self.flowing.set()
            # shutdown() wakes a thread blocked in accept()/recv(); close() alone does not.
            for s in [self.listener, *self.sockets]:
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()
            threads = list(self.threads)
        for thread in threads:
            thread.join(timeout=5)


def relayed_kubeconfig(kubeconfig: str, tmp_path: Path) -> tuple[Relay, str]:
    config: dict[str, Any] = yaml.safe_load(Path(kubeconfig).read_text())
    context = next(c for c in config["contexts"] if c["name"] == config["current-context"])
    cluster = next(c for c in config["clusters"] if c["name"] == context["context"]["cluster"])
    server = urllib.parse.urlsplit(cluster["cluster"]["server"])
    relay = Relay(server.hostname or "127.0.0.1", server.port or 443)
    cluster["cluster"]["server"] = f"https://{server.hostname}:{relay.port}"
    base = Path(kubeconfig).parent
    for section, keys in (
        ("clusters", ("certificate-authority",)),
        ("users", ("client-certificate", "client-key")),
    ):
        for entry in config[section]:
            body = entry["cluster" if section == "clusters" else "user"]
            for key in keys:
                if key in body and not Path(body[key]).is_absolute():
                    body[key] = str(base / body[key])
    path = tmp_path / "relayed.kubeconfig"
    path.write_text(yaml.safe_dump(config))
    return relay, str(path)


def wait_for(what: str, predicate: Any, fleet: Fleet, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"not reached in {timeout}s: {what}\n{fleet.logs()}"
        time.sleep(0.1)


def active_on(fleet: Fleet, name: str) -> list[str]:
    return sorted(
        t["metadata"]["name"]
        for t in fleet.tasks()
        if (t.get("status") or {}).get("worker") == name
        and (t.get("status") or {}).get("phase") in ("Assigned", "Running")
    )


@pytest.mark.timeout(240)
def test_a_stopped_leader_does_not_send_decisions_queued_before_a_standby_took_over(
    fleet: Fleet, tmp_path: Path
) -> None:
    fleet.add_worker(worker("w").capabilities("llm").max_in_flight(1))
    fleet.add_worker(worker("dw").capabilities("decoy").max_in_flight(5))
    for name in ("w", "dw"):
        fleet.agent(name, "hold").wait_serving()
    relay, kubeconfig = relayed_kubeconfig(fleet.kubeconfig, tmp_path)
    a: Process | None = None
    try:
        a = fleet.operator(*FLAGS, env={"KUBECONFIG": kubeconfig, "AGENTQ_WRITE_CONCURRENCY": "1"})
        replica_a = a
        wait_for("A leads", lambda: str(replica_a.pid) in fleet.leader(), fleet)
        b = fleet.operator(*FLAGS)
        # An older task no worker can take yet.
        fleet.add_task(task("old").requires("llm", "x").lease(120))
        fleet.wait_task(
            "old",
            lambda t: any(
                c["type"] == "Unschedulable" and c["status"] == "True"
                for c in (t.get("status") or {}).get("conditions") or []
            ),
            what="Unschedulable",
        )
        time.sleep(1.0)  # A idle

        relay.hold()
        fleet.add_task(task("decoy").requires("decoy").lease(120))
        fleet.add_task(task("new").requires("llm").lease(120))
        time.sleep(1.5)  # A decides both: the decoy's grant on the wire, new's queued
        a.signal(signal.SIGSTOP)
        assert (fleet.task("new").get("status") or {}).get("phase") in (None, "Pending")
        relay.flow()
        # While A is stopped, w gets the capability the older task waits for; B takes
        # over and grants the older task to w, which is then full.
        fleet.custom.patch_namespaced_custom_object(
            GROUP,
            VERSION,
            fleet.namespace,
            "agentworkers",
            "w",
            {"spec": {"capabilities": ["llm", "x"]}},
        )
        wait_for("B takes over", lambda: str(b.pid) in fleet.leader(), fleet)
        fleet.wait_task(
            "old",
            lambda t: (t.get("status") or {}).get("worker") == "w",
            what="granted to w by B",
        )
        assert active_on(fleet, "w") == ["old"]

        a.signal(signal.SIGCONT)
        deadline = time.monotonic() + 8  # A resumes: whatever it would send, it sends now
        while time.monotonic() < deadline:
            on_w = active_on(fleet, "w")
            assert on_w == ["old"], f"two deciders put w over maxInFlight 1: {on_w}"
            time.sleep(0.2)
        assert str(b.pid) in fleet.leader()
        assert (fleet.task("new").get("status") or {}).get("phase") == "Pending"
    finally:
        if a is not None:
            a.signal(signal.SIGCONT)
        relay.close()
