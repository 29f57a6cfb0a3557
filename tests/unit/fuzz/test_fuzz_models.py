"""Fuzzing the spec models (``agentq.models``): what users write into manifests.

Properties:

- ``parse_task`` / ``parse_worker`` and the part parsers raise nothing but
  ``ModelError``, whatever the input (a manifest from a file, a kopf body);
- what the models accept, the CRD accepts too: every field the models accept has
  the JSON type the CRD's openAPIV3Schema declares for it (the API server does not
  coerce ``"1.5"`` into a number, ``"true"`` into a boolean or ``false`` into 0);
  bounds, enums and CEL rules are compared field by field in
  tests/unit/test_crd_models.py, and against the real API server in
  tests/integration/test_bad_input_fuzz_models.py;
- deep input costs bounded work: a payload nested 3,000 levels (which the API server
  accepts) is refused or accepted quickly, never with a RecursionError.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from agentq.models import (
    ModelError,
    parse_task,
    parse_task_spec,
    parse_task_status,
    parse_worker,
    parse_worker_spec,
    parse_worker_status,
)
from fuzzing import TASK_SPEC, WORKER_SPEC, json_values, specs, type_errors

pytestmark = pytest.mark.unit


def accepted(parse: Any, value: Any) -> bool:
    try:
        parse(value)
    except ModelError:
        return False
    return True


@settings(max_examples=500, suppress_health_check=[HealthCheck.too_slow])
@given(specs(TASK_SPEC))
@example({"cost": "1.5"})
@example({"maxReclaims": False})
@example({"requiredCapabilities": [["gpu"]]})
def test_task_specs_accepted_are_typed_as_the_crd_says(spec: dict[str, Any]) -> None:
    if accepted(parse_task_spec, spec):
        assert type_errors(TASK_SPEC, spec) == []


@settings(max_examples=500, suppress_health_check=[HealthCheck.too_slow])
@given(specs(WORKER_SPEC))
@example({"capabilities": ["gpu"], "paused": "true"})
@example({"capabilities": ["gpu"], "weight": "2"})
@example({"capabilities": [{"a": 1}]})
def test_worker_specs_accepted_are_typed_as_the_crd_says(spec: dict[str, Any]) -> None:
    if accepted(parse_worker_spec, spec):
        assert type_errors(WORKER_SPEC, spec) == []


objects = st.fixed_dictionaries(
    {},
    optional={
        "apiVersion": st.just("agentq.dev/v1alpha1") | json_values,
        "kind": st.sampled_from(["AgentTask", "AgentWorker"]) | json_values,
        "metadata": st.fixed_dictionaries(
            {}, optional={"name": st.text(max_size=70) | json_values, "labels": json_values}
        )
        | json_values,
        "spec": specs(TASK_SPEC) | specs(WORKER_SPEC) | json_values,
        "status": json_values,
    },
)


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(objects | json_values)
@example({"metadata": {"name": "w"}, "spec": {"capabilities": [{"a": 1}]}})
def test_parsers_raise_model_error_and_nothing_else(body: Any) -> None:
    for parse in (
        parse_task,
        parse_worker,
        parse_task_spec,
        parse_worker_spec,
        parse_task_status,
        parse_worker_status,
    ):
        with contextlib.suppress(ModelError):
            parse(body if isinstance(body, dict) else {"spec": body})


def deep(levels: int) -> dict[str, Any]:
    root: dict[str, Any] = {}
    node = root
    for _ in range(levels):
        node["a"] = {}
        node = node["a"]
    return root


@pytest.mark.parametrize("levels", [500, 3000, 50_000])
def test_a_deep_payload_costs_bounded_work(levels: int) -> None:
    started = time.monotonic()
    try:
        parse_task_spec({"payload": deep(levels)})
        parse_task({"metadata": {"name": "t"}, "spec": {"payload": deep(levels)}})
    except ModelError:
        pass
    assert time.monotonic() - started < 2.0


@given(specs(TASK_SPEC))
@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
def test_an_accepted_spec_survives_its_own_round_trip(spec: dict[str, Any]) -> None:
    try:
        model = parse_task_spec(spec)
    except Exception:
        return  # what may be raised is the business of the tests above
    assert parse_task_spec(model.to_dict()) == model
