"""The benchmark script keeps working (a tiny run; the real one is ``make bench``)."""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

SCRIPT = Path(__file__).resolve().parents[3] / "bench" / "scheduler_bench.py"


def test_a_small_benchmark_runs_checks_equality_and_writes_the_table(tmp_path: Path) -> None:
    bench = runpy.run_path(str(SCRIPT), run_name="scheduler_bench")
    output = tmp_path / "benchmarks.md"
    argv = ["--sizes", "50,200", "--sets", "4", "--steps", "300", "--repeats", "1"]
    assert bench["main"]([*argv, "--output", str(output)]) == 0
    text = output.read_text()
    assert "| 200 | 4 |" in text
    assert "bench/scheduler_bench.py --sizes 50,200" in text
