"""The operator's store never lets a late watch event roll back a newer write."""

from __future__ import annotations

from agentq.operator.store import Kind


def body(name: str, rv: str, phase: str) -> dict:
    return {
        "metadata": {"namespace": "ns", "name": name, "resourceVersion": rv},
        "status": {"phase": phase},
    }


def test_an_older_version_does_not_replace_a_newer_one() -> None:
    kind = Kind()
    assert kind.put(body("t", "10", "Assigned"))  # our write's response
    assert not kind.put(body("t", "9", "Pending"))  # the watch catching up
    assert kind.get(("ns", "t"))["status"]["phase"] == "Assigned"
    assert kind.put(body("t", "11", "Running"))
    assert kind.get(("ns", "t"))["status"]["phase"] == "Running"


def test_a_deleted_object_is_not_resurrected_by_a_late_event() -> None:
    kind = Kind()
    kind.put(body("t", "5", "Pending"))
    kind.delete(body("t", "7", "Pending"))
    assert not kind.put(body("t", "6", "Assigned"))
    assert kind.get(("ns", "t")) is None
    assert kind.put(body("t", "8", "Pending"))  # re-created under the same name


def test_non_numeric_versions_are_taken_as_newer() -> None:
    kind = Kind()
    kind.put(body("t", "10", "Pending"))
    assert kind.put(body("t", "opaque", "Assigned"))
