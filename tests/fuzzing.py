"""Hypothesis strategies for AgentTask / AgentWorker specs, shaped by the CRDs.

Shared by the fuzz tests of the models (tests/unit/fuzz) and of the models against
the real API server (tests/integration/test_bad_input_fuzz_models.py): values are
mostly plausible for each field's declared type (and its near misses: ``"1.5"`` for
a number, ``30.0`` for an integer, ``"true"`` for a boolean), sometimes any JSON.
``type_errors`` is the API server's first check: the JSON type of every field.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from hypothesis import strategies as st

CRDS = Path(__file__).resolve().parents[1] / "crds"


def spec_schema(plural: str) -> dict[str, Any]:
    crd = yaml.safe_load((CRDS / f"{plural}.agentq.dev.yaml").read_text())
    (version,) = crd["spec"]["versions"]
    schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    return schema


TASK_SPEC = spec_schema("agenttasks")
WORKER_SPEC = spec_schema("agentworkers")

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**40), max_value=2**40)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12)
    | st.sampled_from(["1", "1.5", "true", "false", "gpu", "Hold", "GracePeriod", "30s"])
)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=12,
)


def valid_values(schema: dict[str, Any]) -> st.SearchStrategy[Any]:
    """Values the field's own schema accepts (CEL rules across fields aside)."""
    kind = schema.get("type")
    low, high = schema.get("minimum"), schema.get("maximum")
    if kind == "integer":
        return st.integers(
            int(low) if low is not None else -100, int(high) if high is not None else 10**6
        )
    if kind == "number":
        return st.floats(
            float(low) if low is not None else -1e6,
            float(high) if high is not None else 1e6,
            exclude_min=bool(schema.get("exclusiveMinimum")),
            allow_nan=False,
        )
    if kind == "boolean":
        return st.booleans()
    if kind == "string":
        if schema.get("enum"):
            return st.sampled_from(schema["enum"])
        if schema.get("pattern"):
            return st.from_regex(schema["pattern"], fullmatch=True).filter(
                lambda v: len(v) <= schema.get("maxLength", 63)
            )
        return st.text(max_size=schema.get("maxLength", 20))
    if kind == "array":
        items = valid_values(schema.get("items") or {})
        unique = schema.get("x-kubernetes-list-type") == "set"
        return st.lists(items, max_size=min(schema.get("maxItems", 5), 5), unique=unique)
    if kind == "object" and "properties" in schema:
        props = schema["properties"]
        return st.fixed_dictionaries({}, optional={n: valid_values(f) for n, f in props.items()})
    return st.dictionaries(st.text(max_size=6), json_values, max_size=5)


def near_misses(schema: dict[str, Any]) -> st.SearchStrategy[Any]:
    """Values a careless client sends: the right idea in the wrong type, or just out of range."""
    kind = schema.get("type")
    if kind == "integer":
        return st.integers(-2, 2000) | st.sampled_from([30.0, 2.5, True, "3", 10**30])
    if kind == "number":
        return st.floats(-1, 2e6) | st.sampled_from(["1.5", True, 0, -0.0, 1e308])
    if kind == "boolean":
        return st.sampled_from(["true", 1, 0, "yes"])
    if kind == "string":
        return st.sampled_from(["", "x" * 300, "GracePeriod ", "hold", "GPU"]) | st.text(
            max_size=10
        )
    if kind == "array":
        item = st.sampled_from(["gpu", "llm", "GPU", "", "a" * 64, "g-"]) | json_values
        return st.lists(item, max_size=20) | st.just("gpu")
    return json_values


def field_values(schema: dict[str, Any]) -> st.SearchStrategy[Any]:
    """Values for one field: mostly valid for it, often a near miss, sometimes anything."""
    valid, near = valid_values(schema), near_misses(schema)
    return st.one_of(valid, valid, valid, valid, valid, near, near, json_values)


def specs(schema: dict[str, Any]) -> st.SearchStrategy[dict[str, Any]]:
    """Half the time every field is valid on its own (so cross-field rules get exercised),
    half the time any field may be a near miss or junk."""
    fields = schema["properties"]
    required = set(schema.get("required") or ())

    def build(values: Any) -> st.SearchStrategy[dict[str, Any]]:
        return st.fixed_dictionaries(
            {n: values(f) for n, f in fields.items() if n in required},
            optional={n: values(f) for n, f in fields.items() if n not in required},
        )

    return (
        build(valid_values)
        | build(field_values)
        | st.fixed_dictionaries({}, optional={n: field_values(f) for n, f in fields.items()})
    )


def type_errors(schema: dict[str, Any], value: Any, path: str = "spec") -> list[str]:
    """Where ``value`` does not have the JSON type ``schema`` declares (the API server's
    first check); nested objects checked field by field, opaque ones not at all."""
    kind = schema.get("type")
    if value is None:
        return []  # the API server drops nulls of fields that have defaults
    ok = {
        "integer": (isinstance(value, int) and not isinstance(value, bool))
        or (isinstance(value, float) and value.is_integer()),
        "number": isinstance(value, int | float) and not isinstance(value, bool),
        "boolean": isinstance(value, bool),
        "string": isinstance(value, str),
        "array": isinstance(value, list),
        "object": isinstance(value, dict),
    }.get(kind, True)
    if not ok:
        return [f"{path}: {value!r} is not of type {kind}"]
    out = []
    if kind == "object" and isinstance(value, dict):
        for name, sub in (schema.get("properties") or {}).items():
            if name in value:
                out += type_errors(sub, value[name], f"{path}.{name}")
    if kind == "array" and isinstance(value, list):
        for i, item in enumerate(value):
            out += type_errors(schema.get("items") or {}, item, f"{path}[{i}]")
    return out


def unknown_fields(schema: dict[str, Any], value: Any, path: str = "spec") -> list[str]:
    """Fields of ``value`` that ``schema`` does not declare, in the objects that declare
    their properties: the API server refuses them (strict field validation) and the models
    ignore them by design (agentq.models: an older operator must read a newer CRD's
    objects)."""
    out: list[str] = []
    props = schema.get("properties")
    if schema.get("type") == "object" and props is not None and isinstance(value, dict):
        for name, sub in value.items():
            if name not in props:
                out.append(f"{path}.{name}")
            else:
                out += unknown_fields(props[name], sub, f"{path}.{name}")
    return out
