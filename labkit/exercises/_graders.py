"""Grader helpers shared by the exercise modules: numbers with named mistakes, and predict/reveal pairs.

Not an exercise module (its name does not start with ``nb``), so the registry does not load it; nothing here is
public (no ``__all__`` entries): these are the exercise modules' own helpers. Introduced in notebook 01.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from labkit.exercises._core import FormatSlip, number_grader
from labkit.i18n import N_

__all__: list[str] = []

Grader = Callable[[Any], tuple[bool, str]]

#: What a predict exercise's grader says when it is handed something else than reveal's (prediction, result).
NOT_A_PAIR = FormatSlip(N_("A predict-then-run exercise is checked in two cells: predict(id, your_prediction) "
                           "records it, then the cell that runs the experiment calls reveal(id, measured)."))


def as_number(answer: Any) -> float | None:
    """``answer`` as a float, or None for a bool, a text (``"30"`` is a slip of form, as everywhere) or anything that
    is not a number."""
    if isinstance(answer, (bool, str, bytes)):
        return None
    try:
        return float(answer)
    except (TypeError, ValueError, OverflowError):
        return None


def same_number(a: float, b: float, rel: float = 1e-9) -> bool:
    """Equal within ``rel``, with NaN equal to NaN and infinities equal only to themselves."""
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    if math.isinf(a) or math.isinf(b):
        return a == b
    return abs(a - b) <= rel * max(abs(a), abs(b)) or a == b


def number(want: float, what: str, mistakes: dict[float, str] | None = None, rel: float = 0.0,
           close: float = 1e-2) -> Grader:
    """:func:`number_grader` that also names the typical mistakes: ``{wrong value: why it is wrong}``."""
    base = number_grader(want, what, rel, close)
    named = dict(mistakes or {})

    def grade(answer: Any) -> tuple[bool, str]:
        ok, msg = base(answer)
        got = as_number(answer)
        if ok or got is None:
            return ok, msg
        for value, why in named.items():
            if same_number(got, value):
                return False, why
        return False, msg
    return grade


def pair(answer: Any) -> tuple[Any, Any] | None:
    """Split reveal's ``(prediction, result)``; None if ``answer`` is not such a pair."""
    if isinstance(answer, tuple) and len(answer) == 2:
        return answer[0], answer[1]
    return None
