"""A parallel run (pytest-xdist, ``-n N --dist loadscope``): one control plane for every
worker, and work handed out in groups that keep a module's fixtures whole.

The shared control plane: the controller process starts it when the first worker's
collection holds an integration test (a ``make test-fast`` run starts none) and writes
where it is to a JSON file whose path each worker gets in ``workerinput``; it is tied to
the controller and stopped by pid at the end. Tests isolate by namespace, and the
operators they start watch only their own, so the workers share it safely; tests that
restart or stop an API server use one of their own (``own_cluster``, marked ``slow``).
Cluster-wide set-up that a worker's session fixture does (the CRDs, ``agentq_installed``)
runs once for all workers: ``once`` serializes it with a file lock next to that file.

The groups: each worker writes the group of each test it collected (``group_of``: its
``xdist_group`` mark, else its module when it uses a module-scoped fixture, else the test
alone) next to that file, and the controller's scheduler hands out one group at a time,
in collection order (tests/conftest.py puts the slow ones first). xdist's own
``--dist loadgroup`` would do this through the node id, which pytest 9.2 no longer lets
a plugin rewrite (xdist 3.8.0 sets ``item._nodeid``, now unused): every test of a
group then ran wherever, a module fixture was made once per worker, and three short
chaos runs ran at once.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from xdist.scheduler import LoadScopeScheduling

from agentq.controlplane import Cluster
from fleet import ControlPlane

WORKERINPUT_KEY = "agentq_shared_plane"


def needs_plane(nodeid: str) -> bool:
    return nodeid.startswith("tests/integration/")


def _module_scoped(item: pytest.Item) -> bool:
    """Does the test use a fixture made once per module (or class, or package)?"""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return False
    return any(
        defs[-1].scope in ("module", "class", "package")
        for defs in info.name2fixturedefs.values()
        if defs
    )


def group_of(item: pytest.Item) -> str:
    mark = item.get_closest_marker("xdist_group")
    if mark is not None:
        return f"group:{mark.args[0]}"
    if _module_scoped(item):
        return f"module:{item.nodeid.split('::')[0]}"
    return item.nodeid


def _shared_file(config: pytest.Config) -> Path | None:
    path = getattr(config, "workerinput", {}).get(WORKERINPUT_KEY)
    return Path(path) if path is not None else None


def record_groups(config: pytest.Config, items: list[pytest.Item]) -> None:
    """In a worker: write each collected test's group for the controller's scheduler."""
    shared = _shared_file(config)
    if shared is None:
        return
    table = {item.nodeid: group_of(item) for item in items}
    path = shared.with_name(f"groups-{config.workerinput['workerid']}.json")  # type: ignore[attr-defined]
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps(table))
    os.replace(partial, path)


class GroupScheduling(LoadScopeScheduling):
    """xdist's scope scheduling with the groups the workers recorded as scopes."""

    def __init__(self, config: pytest.Config, log: Any, tables: Path) -> None:
        super().__init__(config, log)
        self._tables = tables
        self._groups: dict[str, str] | None = None

    def _split_scope(self, nodeid: str) -> str:
        if self._groups is None:
            # Read when the first scope is asked for: every worker has collected by then.
            found = sorted(self._tables.glob("groups-*.json"))
            self._groups = json.loads(found[0].read_text()) if found else {}
        return self._groups.get(nodeid, nodeid)


class Controller:
    """The xdist controller's plugin (registered by tests/conftest.py)."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="agentq-parallel-"))
        self.file = self.dir / "plane.json"
        self.cluster: Cluster | None = None

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node: Any) -> None:
        node.workerinput[WORKERINPUT_KEY] = str(self.file)

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_make_scheduler(
        self, config: pytest.Config, log: Any
    ) -> GroupScheduling | None:
        if config.getvalue("dist") not in ("loadscope", "loadgroup"):
            return None  # another way asked for (load, each, ...): xdist's own
        return GroupScheduling(config, log, self.dir)

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node: Any, ids: list[str]) -> None:
        # Tests are scheduled only once every worker has collected: the plane is up
        # before any test runs.
        if self.cluster is None and any(needs_plane(i) for i in ids):
            self.start()

    def start(self) -> None:
        self.cluster = Cluster(self.dir / "controlplane")
        state = self.cluster.up(build=True, tie_to_parent=True)
        plane = ControlPlane(
            kubeconfig=state.kubeconfig,
            bin_dir=state.bin_dir,
            server=state.server,
            kubectl_path=state.binaries["kubectl"],
        )
        self.file.write_text(json.dumps(plane.__dict__ | {"cluster": None}))

    def pytest_unconfigure(self) -> None:
        if self.cluster is not None:
            self.cluster.down()
        shutil.rmtree(self.dir, ignore_errors=True)


def shared_plane(config: pytest.Config) -> ControlPlane | None:
    """The shared plane, in an xdist worker of a run that started one; else None."""
    path = _shared_file(config)
    if path is None:
        return None
    if not path.exists():
        raise AssertionError(f"the controller started no shared control plane ({path} missing)")
    return ControlPlane(**json.loads(path.read_text()))


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def once(config: pytest.Config, name: str, setup: Callable[[], None]) -> None:
    """``setup()`` once per control plane: once per run on the shared plane (the first
    worker to ask does it, the others wait for it), else every time it is asked."""
    path = _shared_file(config)
    if path is None:
        setup()
        return
    done = path.with_name(f"{name}.done")
    with _locked(path.with_name(f"{name}.lock")):
        if not done.exists():
            setup()
            done.touch()
