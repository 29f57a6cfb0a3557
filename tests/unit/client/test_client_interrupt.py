"""Ctrl-C during a blocking wait: the KeyboardInterrupt itself reaches the caller (not a
RuntimeError about an async generator still running), once the wait's coroutine on the
client's loop has really ended; ``agentq wait`` then exits 130 with one line, no
traceback. Against the scripted API server of test_client_watch.py, in a thread of its
own: the interrupt must land in the main thread, where the blocking call waits."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_client_watch import HANG, FakeApi, listing, serve, task

from agentq import kube
from agentq.client import Client

pytestmark = pytest.mark.unit

WAIT = 20.0  # seconds for anything that should take well under one


@contextlib.contextmanager
def served(api: FakeApi) -> Iterator[str]:
    """The fake API server's URL, served by a loop in a thread of its own."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    server = asyncio.run_coroutine_threadsafe(serve(api), loop).result(WAIT)
    try:
        yield str(server.make_url("")).rstrip("/")
    finally:
        asyncio.run_coroutine_threadsafe(server.close(), loop).result(WAIT)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(WAIT)
        loop.close()


def watching(api: FakeApi) -> Callable[[], bool]:
    return lambda: any(verb == "WATCH" for verb, _ in api.requests)


@contextlib.contextmanager
def ctrl_c_when(ready: Callable[[], bool]) -> Iterator[None]:
    """SIGINT to this (the main) thread once ``ready()``, as a terminal's Ctrl-C would."""
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signals go to the main thread")
    main = threading.get_ident()
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)

    def interrupt() -> None:
        deadline = time.monotonic() + WAIT
        while not ready() and time.monotonic() < deadline:
            time.sleep(0.02)
        signal.pthread_kill(main, signal.SIGINT)

    timer = threading.Thread(target=interrupt, daemon=True)
    timer.start()
    try:
        yield
    finally:
        timer.join(WAIT)
        signal.signal(signal.SIGINT, previous)


def still_running(client: Client) -> list[asyncio.Task[Any]]:
    """The tasks on the client's loop besides the one asking."""

    async def others() -> list[asyncio.Task[Any]]:
        return [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]

    return client._run(others())


def hanging() -> FakeApi:
    """A task that never finishes: a LIST saying Running, then a WATCH that says nothing."""
    return FakeApi(lists=[listing(10, task("a", "Running", 9))], watches=[[HANG]])


def test_ctrl_c_in_as_completed_raises_keyboard_interrupt_and_leaves_nothing_running() -> None:
    api = hanging()
    with served(api) as url:
        config = kube.KubeConfig(server=url, credentials=kube.Credentials())
        with Client(config, namespace="ns") as client:
            with ctrl_c_when(watching(api)), pytest.raises(KeyboardInterrupt) as raised:
                for _ in client.as_completed(["a"]):
                    pass
            assert raised.value.__context__ is None, "nothing raised over it"
            assert still_running(client) == []


def test_ctrl_c_in_a_blocking_wait_ends_its_coroutine_before_it_is_raised() -> None:
    api = hanging()
    with served(api) as url:
        config = kube.KubeConfig(server=url, credentials=kube.Credentials())
        with Client(config, namespace="ns") as client:
            with ctrl_c_when(watching(api)), pytest.raises(KeyboardInterrupt):
                client.task("a").wait()
            assert still_running(client) == [], "the watches were cancelled, and ended"


def test_agentq_wait_interrupted_exits_130_without_a_traceback(tmp_path: Path) -> None:
    api = hanging()
    with served(api) as url:
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "c", "cluster": {"server": url}}],
                    "users": [{"name": "u", "user": {}}],
                    "contexts": [
                        {"name": "x", "context": {"cluster": "c", "user": "u", "namespace": "ns"}}
                    ],
                    "current-context": "x",
                }
            )
        )
        env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
        with subprocess.Popen(
            [sys.executable, "-m", "agentq.cli", "wait", "a"],
            env=env,
            # As a terminal's shell starts it: Ctrl-C not ignored. A test runner's worker
            # may ignore SIGINT, and a child inherits that (Python then keeps it ignored).
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        ) as agentq:
            try:
                deadline = time.monotonic() + WAIT
                while not watching(api)() and time.monotonic() < deadline:
                    assert agentq.poll() is None, agentq.communicate()
                    time.sleep(0.02)
                agentq.send_signal(signal.SIGINT)
                out, err = agentq.communicate(timeout=WAIT)
            finally:
                if agentq.poll() is None:
                    agentq.kill()
    assert "Traceback" not in err, err
    assert err.strip().splitlines() == ["interrupted"], err
    assert agentq.returncode == 130, (out, err)
