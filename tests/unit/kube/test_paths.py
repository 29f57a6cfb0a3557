"""A REST path's name and namespace are each one segment, whatever they hold."""

from __future__ import annotations

import pytest

from agentq.kube.client import object_path

pytestmark = pytest.mark.unit


def test_a_slash_in_a_name_or_namespace_stays_inside_its_segment() -> None:
    assert object_path("agentq.dev", "v1alpha1", "a/b", "agenttasks", "c/d") == (
        "/apis/agentq.dev/v1alpha1/namespaces/a%2Fb/agenttasks/c%2Fd"
    )


@pytest.mark.parametrize("name", [".", ".."])
def test_a_dot_segment_is_refused(name: str) -> None:
    with pytest.raises(ValueError, match="not a Kubernetes name"):
        object_path("agentq.dev", "v1alpha1", name, "agenttasks")
    with pytest.raises(ValueError, match="not a Kubernetes name"):
        object_path("agentq.dev", "v1alpha1", "ns", "agenttasks", name)
