"""Exercise checking: ``check(exercise_id, answer)`` prints ✓ or a hint and never raises on a wrong answer.

Exercises live in :mod:`labkit.exercises` (one module per notebook). A learner's answer that is still
``...`` (Ellipsis) is reported as "not attempted yet", so a student copy of a notebook, with the
solutions stripped, still runs top to bottom.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass, field
from typing import Any, Callable

__all__ = ["NOT_GIVEN", "Exercise", "Verdict", "check", "contains_ellipsis", "evaluate", "results", "reset_results"]


class _NotGiven:
    def __repr__(self) -> str:
        return "NOT_GIVEN"


NOT_GIVEN: Any = _NotGiven()


@dataclass(frozen=True)
class Verdict:
    """The outcome of one check: ``status`` is "correct", "wrong" or "not attempted".

    Introduced in notebook 01.
    """

    status: str
    message: str = ""


@dataclass(frozen=True)
class Exercise:
    """One exercise: an id such as ``"01.fp16-max"``, a one-line prompt, a grader and a hint.

    ``grade(answer)`` returns ``True``/``False`` or a ``(bool, message)`` pair; it may call the
    learner's function on fresh inputs, and returns ``None`` when a learner's function is still a stub
    (it returned ``...`` or ``None``), which reports "not attempted yet". ``hint`` is shown on a wrong
    answer. ``reference`` (a correct answer) and ``wrong`` (a typical mistake) let the tests prove that
    the grader tells them apart.

    Introduced in notebook 01.
    """

    id: str
    prompt: str
    grade: Callable[[Any], Any]
    hint: str
    success: str = ""
    meta: dict = field(default_factory=dict)
    reference: Any = NOT_GIVEN
    wrong: Any = NOT_GIVEN


_RESULTS: dict[str, str] = {}


def contains_ellipsis(answer: Any) -> bool:
    """Say whether ``answer`` still holds the ``...`` placeholder (also inside tuples, lists and dicts).

    Introduced in notebook 01.
    """
    if answer is Ellipsis:
        return True
    if isinstance(answer, (tuple, list, set, frozenset)):
        return any(contains_ellipsis(a) for a in answer)
    if isinstance(answer, dict):
        return any(contains_ellipsis(v) for v in answer.values())
    return False


def evaluate(exercise_id: str, answer: Any) -> Verdict:
    """Grade ``answer`` for ``exercise_id`` and return a :class:`Verdict` without printing.

    Raises ``ValueError`` for an unknown exercise id (a bug in the notebook, not a wrong answer).
    Introduced in notebook 01.
    """
    from labkit.exercises import get_exercise

    ex = get_exercise(exercise_id)
    if contains_ellipsis(answer):
        return Verdict("not attempted", f"{ex.id}: not attempted yet. Replace the `...` and run the cell again.")
    try:
        out = ex.grade(answer)
    except Exception as exc:  # the learner's code may raise anything; report it, never propagate it
        last = traceback.format_exception_only(type(exc), exc)[-1].strip()
        return Verdict("wrong", f"{ex.id}: your answer raised {last}. Hint: {ex.hint}")
    if out is None:
        return Verdict("not attempted", f"{ex.id}: not attempted yet. Your function still returns nothing; "
                                        "fill in its body and run the cell again.")
    ok, detail = (out if isinstance(out, tuple) else (bool(out), ""))
    if ok:
        msg = f"{ex.id}: correct."
        if ex.success or detail:
            msg += " " + (ex.success or detail)
        return Verdict("correct", msg)
    msg = f"{ex.id}: not quite."
    if detail:
        msg += " " + detail
    return Verdict("wrong", msg + f" Hint: {ex.hint}")


def check(exercise_id: str, answer: Any) -> None:
    """Print ✓ and a short confirmation, ✗ and a hint, or "not attempted yet"; never raise on an answer.

    Introduced in notebook 01.
    """
    verdict = evaluate(exercise_id, answer)
    mark = {"correct": "✓", "wrong": "✗", "not attempted": "…"}[verdict.status]
    _RESULTS[exercise_id] = verdict.status
    print(f"{mark} {verdict.message}")


def results() -> dict[str, str]:
    """Return the status of every exercise checked in this kernel, by id (for instructors).

    Introduced in notebook 01.
    """
    return dict(_RESULTS)


def reset_results() -> None:
    """Forget all recorded results. Introduced in notebook 01."""
    _RESULTS.clear()
