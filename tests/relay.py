"""The leader-takeover scenes of the integration tests test_operator_leader_stall.py and
test_leader_epoch_fence.py: a TCP ``Relay`` that holds a replica's requests on the wire,
a kubeconfig that sends a replica through it, and the steps both tests share (a standby
``B`` and an older task ``old``; ``B`` taking over and granting ``old`` to ``w``; ``w``
holding ``old`` alone for a while).
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
import urllib.parse
from pathlib import Path
from typing import Any

import yaml

from agentq import GROUP, VERSION
from builders import task
from fleet import Fleet, Process


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


def standby_and_an_older_task(fleet: Fleet, *flags: str) -> Process:
    """Start the standby ``B`` (with ``flags``), then an older task ``old`` no worker
    can take yet (it needs ``llm`` and ``x``), and wait until it says Unschedulable."""
    b = fleet.operator(*flags)
    fleet.add_task(task("old").requires("llm", "x").lease(120))
    fleet.wait_condition("old", "Unschedulable")
    time.sleep(1.0)  # A idle
    return b


def takeover_grants_old_to_w(fleet: Fleet, b: Process) -> None:
    """``w`` gets the capability the older task waits for; ``B`` takes over and grants
    the older task to ``w``, which is then full."""
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


def only_old_on_w(fleet: Fleet, seconds: float, failure: str) -> None:
    """For ``seconds``, ``w`` holds ``old`` and nothing else (read back every 0.2 s);
    ``failure`` says what it would mean if not."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        on_w = active_on(fleet, "w")
        assert on_w == ["old"], f"{failure}: {on_w}"
        time.sleep(0.2)
