"""Command-line value types shared by the operator's flags and the ops verbs."""

from __future__ import annotations

import math
from typing import Any

import click

__all__ = ["FiniteFloatRange"]


class FiniteFloatRange(click.FloatRange):
    """A float in range, and a number: ``inf`` and ``nan`` pass a range's checks, and
    would then stand for a timer that never fires or an interval no sleep takes."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return number
