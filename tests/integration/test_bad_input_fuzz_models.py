"""The spec models against the real API server, by hypothesis: the server is the oracle.

Each generated spec is sent to the API server as a server-side dry run (strict
field validation: nothing is stored) and parsed by ``agentq.models``:

- what the models accept, the API server accepts (``agentq`` never builds, or lets
  a user submit through it, a manifest the CRD refuses);
- what the API server stores, the models parse (the operator can read every object
  the API server lets in; the response of the dry run is the object as stored,
  with its defaults).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, event, example, given, settings

from agentq import GROUP, VERSION
from agentq.models import ModelError, parse_task, parse_task_spec, parse_worker, parse_worker_spec
from corpus import TASKS, WORKERS, RawApi
from fleet import ControlPlane
from fuzzing import TASK_SPEC, WORKER_SPEC, specs, unknown_fields

# The corpus is slow (make test, not make test-fast).
pytestmark = [pytest.mark.integration, pytest.mark.slow]

FUZZ = settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@pytest.fixture(scope="module")
def server(control_plane: ControlPlane, agentq_crds: None) -> Iterator[tuple[RawApi, str]]:
    namespace = f"fuzz-{uuid.uuid4().hex[:6]}"
    control_plane.kubectl("create", "namespace", namespace)
    yield RawApi(control_plane.kubeconfig), namespace
    control_plane.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


def dry_run(server: tuple[RawApi, str], kind: str, spec: dict[str, Any]) -> dict[str, Any] | None:
    """The object as the API server would store it, or None if it refuses it."""
    raw, namespace = server
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": kind,
        "metadata": {"name": "fuzzed"},
        "spec": spec,
    }
    path = (TASKS if kind == "AgentTask" else WORKERS).format(ns=namespace)
    status, answer = raw.request(
        "POST", path + "?dryRun=All&fieldValidation=Strict", json.dumps(body).encode()
    )
    assert status in (201, 400, 422), (status, answer)
    return answer if status == 201 else None


def is_json(value: Any) -> bool:
    """Whether ``value`` can be written as JSON: Infinity and NaN cannot, so no Kubernetes
    object carries them and the models never see one from the API server (json.dumps
    would send the non-JSON token ``Infinity``, refused as unparseable, not as invalid)."""
    try:
        json.dumps(value, allow_nan=False)
    except ValueError:
        return False
    return True


def accepts(parse: Callable[[Any], Any], value: Any) -> bool:
    try:
        parse(value)
    except ModelError:
        return False
    except TypeError:
        return False  # a bug of its own, found by tests/unit/fuzz
    return True


@FUZZ
@given(spec=specs(TASK_SPEC))
@example(spec={"cost": "1.5"})
@example(spec={"payload": {"": float("inf")}})
def test_task_specs_the_models_accept_the_api_server_accepts(
    server: tuple[RawApi, str], spec: dict[str, Any]
) -> None:
    # An unknown nested field (retryBackoff: {"": null}) is ignored by the models by design
    # and refused by the API server: not a disagreement about what the fields mean.
    assume(not unknown_fields(TASK_SPEC, spec) and is_json(spec))
    if accepts(parse_task_spec, spec):
        assert dry_run(server, "AgentTask", spec) is not None, spec


@FUZZ
@given(spec=specs(WORKER_SPEC))
@example(spec={"capabilities": ["gpu"], "paused": "true"})
def test_worker_specs_the_models_accept_the_api_server_accepts(
    server: tuple[RawApi, str], spec: dict[str, Any]
) -> None:
    assume(not unknown_fields(WORKER_SPEC, spec) and is_json(spec))
    if accepts(parse_worker_spec, spec):
        assert dry_run(server, "AgentWorker", spec) is not None, spec


@settings(FUZZ, max_examples=200)
@given(spec=specs(TASK_SPEC))
def test_every_task_the_api_server_stores_the_models_parse(
    server: tuple[RawApi, str], spec: dict[str, Any]
) -> None:
    stored = dry_run(server, "AgentTask", spec)
    event("stored" if stored is not None else "refused")
    if stored is not None:
        parse_task(stored)


@settings(FUZZ, max_examples=200)
@given(spec=specs(WORKER_SPEC))
def test_every_worker_the_api_server_stores_the_models_parse(
    server: tuple[RawApi, str], spec: dict[str, Any]
) -> None:
    stored = dry_run(server, "AgentWorker", spec)
    event("stored" if stored is not None else "refused")
    if stored is not None:
        parse_worker(stored)
