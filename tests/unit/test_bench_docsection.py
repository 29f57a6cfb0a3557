"""Benchmarks share docs/benchmarks.md: each rewrites its own section and nothing else."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from docsection import HEADER, write_section

A = ("<!-- BEGIN a -->", "<!-- END a -->")
B = ("<!-- BEGIN b -->", "<!-- END b -->")


def section(markers: tuple[str, str], body: str) -> str:
    return f"{markers[0]}\n{body}\n{markers[1]}\n"


def test_each_benchmark_rewrites_only_its_own_section(tmp_path: Path) -> None:
    docs = tmp_path / "benchmarks.md"
    write_section(docs, *A, section(A, "a one"))
    write_section(docs, *B, section(B, "b one"))
    write_section(docs, *A, section(A, "a two\nmore"))
    text = docs.read_text()
    assert text.startswith(HEADER)
    assert "a one" not in text and "a two\nmore" in text and "b one" in text
    assert text.index("a two") < text.index("b one")  # rewritten in place
    assert text.count(A[0]) == text.count(A[1]) == text.count(B[0]) == 1
    write_section(docs, *B, section(B, "b two"))
    assert docs.read_text() == text.replace("b one", "b two")
