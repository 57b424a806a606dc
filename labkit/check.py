"""Exercise checking: ``check(exercise_id, answer)`` prints ✓ or a hint and never raises on a wrong answer.

Exercises live in :mod:`labkit.exercises` (one module per notebook). A learner's answer that is still
``...`` (Ellipsis) is reported as "not attempted yet", so a student copy of a notebook, with the
solutions stripped, still runs top to bottom. :class:`~labkit.exercises.Exercise`, ``NOT_GIVEN`` and
:func:`~labkit.exercises.number_grader` are defined in :mod:`labkit.exercises` and re-exported here.

**Hints escalate.** In one kernel, the first wrong answer to an exercise gets its ``hint`` (a nudge), the
second its ``method``, the third its worked ``solution`` (a missing one is skipped; where there is no
solution, the hint points at the reference notebook). :func:`solution` shows the worked solution at once. An
answer that is the exercise's typical mistake (``Exercise.wrong``) is answered with ``wrong_why``, which names
the mistake. The count starts at zero in every kernel: what a kernel prints never depends on earlier runs. An
answer in the wrong form (the grader says so with a :class:`~labkit.exercises._core.FormatSlip`: "Give the value
as a number") or one that raised is answered, but it is no wrong try: the hints stay where they are and the
progress record is not touched.

**labkit's own answers do not count.** :func:`check` (and :func:`predict`) refuses an answer that is the exercise's
``reference`` object itself, or a function, class or kernel defined in labkit (also wrapped: a
``functools.partial``, a bound method, a ``@triton.jit`` kernel): it says so in one line and notes in the progress
record that the solution was seen. :func:`evaluate` grades whatever it is given (the tests and instructors use it
on the reference answers). A prediction recorded after :func:`reveal` has shown the result is compared but not
counted: the first verdict stays.

**Progress.** Every graded answer is also written to a local record (JSON, on this machine only, never a
network): in the learner's workspace (``work/.labkit-progress.json``, see :mod:`labkit.workspace`) when the
notebook runs there, else in a per-user file (``$XDG_STATE_HOME/labkit/progress.json``, by default
``~/.local/state/labkit/progress.json``); ``LABKIT_PROGRESS`` names another file (``off``: no record). The
reference notebooks (a checkout's ``notebooks/``, which hold the solutions) record nothing. :func:`progress`
and ``python -m labkit progress`` show the record; :func:`export_results` still collects results for a class.
"""

from __future__ import annotations

import contextlib
import enum
import json
import math
import numbers
import os
import re
import stat
import time
import traceback
import types
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import accumulate
from pathlib import Path
from typing import Any

from labkit._validate import safe_repr
from labkit.exercises import NOT_GIVEN, Exercise, all_exercises, get_exercise, number_grader
from labkit.exercises._core import NOT_MEASURED, FormatSlip
from labkit.i18n import N_, tidy
from labkit.i18n import gettext as _

__all__ = [
    "NOT_GIVEN",
    "PROGRESS_ENV",
    "Exercise",
    "Verdict",
    "check",
    "contains_ellipsis",
    "evaluate",
    "export_results",
    "format_progress",
    "load_progress",
    "load_results",
    "number_grader",
    "predict",
    "progress",
    "progress_path",
    "reset_results",
    "results",
    "reveal",
    "solution",
]

#: The environment variable that names the progress record's file (``off``: record nothing).
PROGRESS_ENV = "LABKIT_PROGRESS"


@dataclass(frozen=True)
class Verdict:
    """The outcome of one check: ``status`` is "correct", "wrong" or "not attempted".

    Introduced in notebook 01.
    """

    status: str
    message: str = ""


_RESULTS: dict[str, str] = {}
_PREDICTIONS: dict[str, Any] = {}
#: Wrong answers per exercise in this kernel: how far the hints have escalated.
_WRONG: dict[str, int] = {}
#: Predict exercises whose result reveal() has shown in this kernel, with the verdict that stands.
_REVEALED: dict[str, str] = {}
#: Predict exercises whose recorded prediction came after the result was shown (compared, never counted).
_LATE: set[str] = set()


# What contains_ellipsis looks into, and how deep; deeper levels count as filled in.
_CONTAINERS = (tuple, list, set, frozenset, dict)
_SCAN_DEPTH = 64


def contains_ellipsis(answer: Any) -> bool:
    """Say whether ``answer`` still holds the ``...`` placeholder (also inside tuples, lists, sets and dicts).

    The scan is iterative: a container that holds itself is visited once, and nothing more than 64 levels
    deep is looked at, so no answer can exhaust the recursion limit. An exception raised by the answer's
    own ``__iter__``/``values`` propagates (:func:`evaluate` reports it as the answer's error).
    Introduced in notebook 01.
    """
    if not isinstance(answer, _CONTAINERS):
        return answer is Ellipsis
    seen: set[int] = set()
    stack: list[tuple[Any, int]] = [(answer, 0)]
    while stack:
        item, depth = stack.pop()
        if id(item) in seen:
            continue
        seen.add(id(item))
        for child in item.values() if isinstance(item, dict) else item:
            if child is Ellipsis:
                return True
            if depth + 1 < _SCAN_DEPTH and isinstance(child, _CONTAINERS):
                stack.append((child, depth + 1))
    return False


def _outcome(out: Any) -> tuple[bool, str]:
    """Read a grader's result, ``ok`` or ``(ok, detail)``, as ``(bool, str)``."""
    if isinstance(out, tuple):
        if len(out) != 2:
            raise ValueError(f"a grader returns ok or (ok, message), got a tuple of {len(out)}")
        ok, detail = out
        # a FormatSlip stays one (str() of a str subclass would make it a plain str)
        return bool(ok), "" if detail is None else detail if isinstance(detail, str) else str(detail)
    return bool(out), ""


# How deep and how wide _same_answer compares an answer with the typical mistake; beyond, no match.
_SAME_DEPTH = 16
_SAME_WIDTH = 1000


def _text_form(x: Any) -> str:
    return str(x).strip().casefold().removeprefix("torch.")


def _same_answer(answer: Any, wrong: Any, depth: int = 0) -> bool:
    """Whether ``answer`` is the typical mistake ``wrong``: numbers within 1e-9, text ignoring case and spaces,
    tensors and arrays equal, containers element by element. Never raises; functions never match (their
    grader calls them and names the mistake itself)."""
    if wrong is NOT_GIVEN or depth > _SAME_DEPTH or callable(wrong) and not isinstance(wrong, type):
        return False
    try:
        if isinstance(answer, bool) or isinstance(wrong, bool):
            return isinstance(answer, bool) and isinstance(wrong, bool) and answer is wrong
        if isinstance(answer, numbers.Real) and isinstance(wrong, numbers.Real):
            a, b = float(answer), float(wrong)
            return (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=1e-9, abs_tol=0.0)
        if isinstance(answer, str) or isinstance(wrong, str):
            other = wrong if isinstance(answer, str) else answer
            if isinstance(other, (numbers.Number, list, tuple, dict, set, frozenset)):
                return False
            return _text_form(answer) == _text_form(wrong)  # also a dtype, or a value computed when graded
        if isinstance(wrong, dict):
            if not isinstance(answer, dict) or len(answer) != len(wrong) or len(wrong) > _SAME_WIDTH:
                return False
            return all(k in answer and _same_answer(answer[k], v, depth + 1) for k, v in wrong.items())
        if isinstance(wrong, (list, tuple)):
            if not isinstance(answer, (list, tuple)) or len(answer) != len(wrong) or len(wrong) > _SAME_WIDTH:
                return False
            return all(_same_answer(a, b, depth + 1) for a, b in zip(answer, wrong))
        if isinstance(wrong, (set, frozenset)):
            if not isinstance(answer, (set, frozenset, list, tuple)) or len(wrong) > _SAME_WIDTH:
                return False
            items = list(answer)
            return len(set(map(_text_form, items))) == len(wrong) and all(
                any(_same_answer(a, b, depth + 1) for a in items) for b in wrong)
        if type(wrong).__module__.startswith(("torch", "numpy")):
            import numpy as np

            if type(answer).__module__.startswith("torch") and hasattr(answer, "shape"):
                import torch

                return (isinstance(wrong, torch.Tensor) and answer.shape == wrong.shape
                        and answer.dtype == wrong.dtype and bool(torch.equal(answer, wrong)))
            if isinstance(wrong, np.ndarray) or isinstance(answer, np.ndarray):
                return (isinstance(answer, np.ndarray) and isinstance(wrong, np.ndarray)
                        and answer.shape == wrong.shape and bool(np.array_equal(answer, wrong)))
        same = answer == wrong
        return same if isinstance(same, bool) else False
    except (Exception, RecursionError):  # an answer's own __eq__/__iter__ may raise anything
        return False


def _typical(ex: Exercise, answer: Any) -> bool:
    """Whether ``answer`` is ``ex``'s typical mistake (for a predict exercise: the prediction part)."""
    wrong = ex.wrong
    if ex.kind == "predict":
        if not (isinstance(answer, tuple) and isinstance(wrong, tuple) and len(answer) == len(wrong) == 2):
            return False
        answer, wrong = answer[0], wrong[0]
    return _same_answer(answer, wrong)


# _judge's details that are not a grader's message: a stub function, an answer that raised
_STUB, _RAISED = "\x00stub", "\x00raised:"


def _no_try(detail: str) -> bool:
    """Whether a wrong answer's ``detail`` says it is no wrong try: it raised, or the grader saw a slip of form."""
    return isinstance(detail, FormatSlip) or detail.startswith(_RAISED)


# ------------------------------------------------------------------------------ labkit's own answers, not the learner's
#: How deep _labkit_own looks into wrappers (a partial of a bound method...) and into a tuple or list of answers.
_OWN_DEPTH = 3
#: The attributes through which an object wraps a function: a Triton kernel (fn), functools.partial (func), a
#: bound method (__func__), a functools.wraps decorator (__wrapped__).
_WRAPPED = ("fn", "func", "__func__", "__wrapped__")


def _in_labkit(module: Any) -> bool:
    return isinstance(module, str) and (module == "labkit" or module.startswith("labkit."))


def _labkit_own(obj: Any, depth: int = 0) -> bool:
    """Whether ``obj`` is a function, class or kernel defined in labkit, or wraps one, or is a tuple or list of
    answers that holds one (``04.resume-scaler`` takes two functions). Never raises."""
    if depth > _OWN_DEPTH:
        return False
    try:
        if type(obj) in (tuple, list):  # exactly these: a subclass's own __iter__ is not run
            return len(obj) <= 8 and any(_labkit_own(o, depth + 1) for o in obj)
        if not callable(obj):
            return False
        if _in_labkit(getattr(obj, "__module__", None)):
            return True
        inner = (getattr(obj, name, None) for name in _WRAPPED)
        return any(i is not None and i is not obj and _labkit_own(i, depth + 1) for i in inner)
    except (Exception, RecursionError):  # a hostile object's __getattr__: not labkit's
        return False


def _shared(value: Any) -> bool:
    """Whether Python hands the same object to anyone who writes this value (a small int, interned text, None,
    the empty tuple, a dtype, a class): being the reference object then says nothing about where it came from."""
    if value is None or value is Ellipsis or isinstance(value, (int, str, bytes, type, types.ModuleType, enum.Enum)):
        return True
    if type(value) in (tuple, frozenset) and not value:
        return True
    kind = type(value)
    return kind.__module__ == "torch" and kind.__name__ in ("dtype", "layout", "memory_format", "device")


def _is_reference(ex: Exercise, answer: Any) -> bool:
    """Whether ``answer`` is ``ex.reference`` itself (for a predict exercise: also its prediction part, alone or in
    a pair), not an equal value the learner wrote."""
    ref = ex.reference
    if ref is NOT_GIVEN:
        return False
    same = [ref]
    if ex.kind == "predict" and type(ref) is tuple and len(ref) == 2:
        same.append(ref[0])
        if type(answer) is tuple and len(answer) == 2 and answer[0] is ref[0] and not _shared(ref[0]):
            return True
    return any(answer is r and not _shared(r) for r in same)


def _borrowed(ex: Exercise, answer: Any) -> bool:
    """Whether ``answer`` is labkit's own answer, not the learner's: the reference object, or labkit's code."""
    return _is_reference(ex, answer) or _labkit_own(answer)


def _borrowed_message(ex: Exercise) -> str:
    return _("{id}: that is labkit's own answer, not yours: write yours and check it again. (Your progress "
             "notes that you have seen this exercise's solution.)").format(id=ex.id)


def _judge(ex: Exercise, answer: Any) -> tuple[str, str, bool]:
    """Grade: ``(status, detail, typical)``; ``detail`` is the grader's message (or what the answer raised)."""
    try:
        if contains_ellipsis(answer):
            return "not attempted", "", False
        out = ex.grade(answer)
        if out is None:
            return "not attempted", _STUB, False
        ok, detail = _outcome(out)
    except (Exception, SystemExit) as exc:  # whatever the answer does, the cell goes on (Ctrl-C still stops it)
        last = traceback.format_exception_only(type(exc), exc)[-1].strip()
        return "wrong", _RAISED + last, False
    if ok:
        return "correct", detail, False
    return "wrong", detail, _typical(ex, answer)


def _reference_notebook(ex: Exercise) -> str:
    """The reference notebook of an exercise, for a message: ``notebooks/03_loss_scaling.ipynb``."""
    from labkit.catalog import NOTEBOOKS

    number = ex.id.split(".")[0]
    stem = next((n.stem for n in NOTEBOOKS if n.number == number), None)
    return f"notebooks/{stem}.ipynb" if stem else f"notebook {number}"


def _indent(text: str) -> str:
    return "\n".join("    " + line if line.strip() else "" for line in text.strip("\n").splitlines())


_SOLUTION_LABEL = N_("The worked solution")
#: The verdicts, as a message names them (translated where shown).
_VERDICT_WORDS = (N_("correct"), N_("wrong"), N_("not attempted"))


def _ladder(ex: Exercise) -> list[tuple[str, str]]:
    """The help a wrong answer climbs, with its labels: the hint, the method, the worked solution (the empty
    ones left out)."""
    return [(label, text.strip()) for label, text in ((N_("Hint"), ex.hint), (N_("Hint 2, the method"), ex.method),
                                                      (_SOLUTION_LABEL, ex.solution)) if text.strip()]


def _shows_solution(ex: Exercise, level: int) -> bool:
    ladder = _ladder(ex)
    return bool(ladder) and ladder[min(level, len(ladder)) - 1][0] == _SOLUTION_LABEL


def _hint(ex: Exercise, level: int) -> str:
    """The help for the ``level``-th wrong answer (1, 2, 3...): the hint, the method, the worked solution.

    A field left empty is skipped; after the last one, the last one again.
    """
    ladder = _ladder(ex)
    if not ladder:
        return " " + _("See the reference notebook, {notebook}.").format(notebook=_reference_notebook(ex))
    label, text = ladder[min(level, len(ladder)) - 1]
    if label == _SOLUTION_LABEL:
        return f" {_(label)}:\n{_indent(_(text))}"
    more = ""
    if level > 1 and label == ladder[-1][0] and not ex.solution.strip():
        more = " " + _("(The reference notebook, {notebook}, shows the answer.)").format(
            notebook=_reference_notebook(ex))
    return f" {_(label)}: {_(text)}{more}"


def _message(ex: Exercise, status: str, detail: str, typical: bool, level: int) -> str:
    if status == "not attempted":
        if detail == _STUB:
            return _("{id}: not attempted yet. Your function still returns nothing; "
                     "fill in its body and run the cell again.").format(id=ex.id)
        return _("{id}: not attempted yet. Replace the `...` and run the cell again.").format(id=ex.id)
    if status == "correct":
        msg = _("{id}: correct.").format(id=ex.id)
        if ex.success or detail:
            msg += " " + (_(ex.success) if ex.success else _(detail))
        return msg
    if detail.startswith(_RAISED):
        return _("{id}: your answer raised {error}.").format(id=ex.id, error=detail.removeprefix(_RAISED)) + _hint(
            ex, level)
    if isinstance(detail, FormatSlip):
        return _("{id}: {message} (Not counted as a wrong answer.)").format(id=ex.id, message=_(detail))
    msg = _("{id}: not quite.").format(id=ex.id)
    why = _(ex.wrong_why.strip()) if typical else ""  # the grader's message may be the same text, translated
    detail = _(detail)
    if why:
        msg += " " + why
    if detail and not (why and (detail in why or why in detail)):
        msg += " " + detail
    return msg + _hint(ex, level)


def evaluate(exercise_id: str, answer: Any) -> Verdict:
    """Grade ``answer`` for ``exercise_id`` and return a :class:`Verdict` without printing.

    A wrong answer's message carries the first hint (``check`` escalates; this function keeps no state). Unlike
    :func:`check`, it grades whatever it is given, labkit's own reference answers included (the tests and an
    instructor's scripts grade those). Raises ``ValueError`` for an unknown exercise id (a bug in the notebook, not
    a wrong answer). Introduced in notebook 01.
    """
    ex = get_exercise(exercise_id)
    status, detail, typical = _judge(ex, answer)
    return Verdict(status, tidy(_message(ex, status, detail, typical, 1)))


def _escalated(ex: Exercise, answer: Any) -> tuple[Verdict, bool, bool]:
    """Grade like :func:`evaluate`, counting this kernel's wrong answers: the hints escalate.

    An answer that raised, or one in the wrong form (a :class:`FormatSlip`), is no wrong try: it gets its message
    with the help of the level reached so far, and the next wrong answer gets the help it would have got.
    Returns the verdict, whether its message showed the worked solution, and whether it counts as a try.
    """
    status, detail, typical = _judge(ex, answer)
    counts = not (status == "wrong" and _no_try(detail))
    level = max(_WRONG.get(ex.id, 0), 1)
    if status == "wrong" and counts:
        level = _WRONG[ex.id] = _WRONG.get(ex.id, 0) + 1
    shown = status == "wrong" and counts and _shows_solution(ex, level)
    return Verdict(status, tidy(_message(ex, status, detail, typical, level))), shown, counts


def _say(text: str) -> None:
    # lone surrogates (from an answer's text) cannot be encoded for printing: show them escaped
    print(tidy(text).encode("utf-8", "backslashreplace").decode("utf-8"))


def check(exercise_id: str, answer: Any) -> None:
    """Print ✓ and a short confirmation, ✗ and a hint, or "not attempted yet"; never raise on an answer.

    Hints escalate in this kernel: the first wrong answer gets the hint, the next the method, the next the
    worked solution; the exercise's typical mistake is named as such. An answer in the wrong form, or one that
    raised, is answered but is no wrong try (the hints do not climb, nothing is recorded). A graded answer is
    added to the progress record (see :func:`progress`). labkit's own answer (the exercise's reference object, or
    a function, class or kernel defined in labkit) is not graded: a "…" line says so, and the record notes the
    solution as seen. Whatever ``answer`` is (a container that holds itself, a list nested thousands deep, an
    object whose methods raise), the outcome is printed, not raised; only an unknown ``exercise_id`` (a bug in
    the notebook, not in the answer) raises ``ValueError``/``TypeError``. Introduced in notebook 01.
    """
    ex = get_exercise(exercise_id)
    if _borrowed(ex, answer):
        _RESULTS.setdefault(ex.id, "not attempted")
        _say(f"… {_borrowed_message(ex)}")
        _record(ex.id, None, solution_seen=True)
        return
    verdict, shown, counts = _escalated(ex, answer)
    mark = {"correct": "✓", "wrong": "✗", "not attempted": "…"}[verdict.status]
    if counts:
        _RESULTS[exercise_id] = verdict.status
    else:  # a slip of form, or an answer that raised: no verdict on the learner's answer yet
        _RESULTS.setdefault(exercise_id, "not attempted")
    _say(f"{mark} {verdict.message}")
    if verdict.status != "not attempted" and counts:
        _record(ex.id, verdict.status, solution_seen=shown)


def solution(exercise_id: str) -> None:
    """Print the worked solution of an exercise (and note in the progress record that it was shown).

    Where the exercise has no worked solution written out, print its hints and the reference notebook that
    holds the answer. Raises ``ValueError`` for an unknown id. Introduced in notebook 00.
    """
    ex = get_exercise(exercise_id)
    if ex.solution.strip():
        _say(_("{id} ({prompt}) The worked solution:").format(id=ex.id, prompt=_(ex.prompt))
             + f"\n{_indent(_(ex.solution))}")
    else:
        parts = [_("Hint: {hint}").format(hint=_(ex.hint.strip()))] + (
            [_("The method: {method}").format(method=_(ex.method.strip()))] if ex.method.strip() else [])
        _say(_("{id} ({prompt}) No worked solution is written out for this exercise. {hints} The reference notebook, "
               "{notebook}, shows the answer.").format(id=ex.id, prompt=_(ex.prompt), hints=" ".join(parts),
                                                       notebook=_reference_notebook(ex)))
    _record(ex.id, None, solution_seen=True)


def _predict_exercise(exercise_id: str) -> Exercise:
    ex = get_exercise(exercise_id)
    if ex.kind != "predict":
        raise ValueError(_("{id} is not a predict-then-run exercise (kind {kind}); use check()").format(
            id=exercise_id, kind=repr(ex.kind)))
    return ex


def predict(exercise_id: str, prediction: Any) -> None:
    """Record the learner's prediction for a *predict, then run* exercise, before the cell that shows the result.

    A prediction that is still ``...`` is reported as "not attempted yet"; labkit's own (the exercise's reference
    prediction itself) is refused, as :func:`check` refuses it. One in the wrong form (text where a number is
    asked, say) is answered here, before any result is shown, and not recorded. :func:`reveal`, called by the next cell with the
    measured result, compares the two. A prediction recorded after :func:`reveal` has shown the result (in this
    kernel) is compared but not counted: the line says so. Raises ``ValueError`` for an id that is not a predict
    exercise. Introduced in notebook 01.
    """
    ex = _predict_exercise(exercise_id)
    _PREDICTIONS.pop(ex.id, None)
    _LATE.discard(ex.id)
    if contains_ellipsis(prediction):
        _RESULTS.setdefault(ex.id, "not attempted")
        _say("… " + _("{id}: not attempted yet. Replace the `...` with your prediction and run the cell again.").format(
            id=ex.id))
        return
    if _borrowed(ex, prediction):
        _RESULTS.setdefault(ex.id, "not attempted")
        _say(f"… {_borrowed_message(ex)}")
        _record(ex.id, None, solution_seen=True)
        return
    slip = _prediction_slip(ex, prediction)
    if slip is not None:  # said now, before any result is shown; a corrected prediction is then still on time
        _RESULTS.setdefault(ex.id, "not attempted")
        _say("… " + _("{id}: {message} Nothing recorded: correct your prediction and run this cell again.").format(
            id=ex.id, message=slip))
        return
    _PREDICTIONS[ex.id] = prediction
    shown = repr(prediction)
    shown = shown if len(shown) <= 80 else shown[:77] + "..."
    if ex.id in _REVEALED:
        _LATE.add(ex.id)
        _say("✎ " + _("{id}: prediction recorded ({shown}), after the result was shown: it will not be counted.").format(
            id=ex.id, shown=shown))
        return
    _say("✎ " + _("{id}: prediction recorded ({shown}). Now run the next cell.").format(id=ex.id, shown=shown))


def _prediction_slip(ex: Exercise, prediction: Any) -> str | None:
    """What is wrong with the *form* of a prediction (text where a number is asked, a key missing), or None.

    The grader judges the prediction against the exercise's reference result as a stand-in for the measurement:
    only its :class:`FormatSlip`, or the type of what it raised, is kept, so nothing of the result is told."""
    ref = ex.reference
    if not (isinstance(ref, tuple) and len(ref) == 2):
        return None
    status, detail, _typical = _judge(ex, (prediction, ref[1]))
    if status != "wrong":
        return None
    if isinstance(detail, FormatSlip):
        return _(str(detail))
    if detail.startswith(_RAISED):
        kind = detail[len(_RAISED):].split(":", 1)[0].strip()
        return _("this prediction cannot be compared with a measurement (the comparison raised {error}).").format(
            error=kind)
    return None


def reveal(exercise_id: str, result: Any) -> Verdict:
    """Compare the prediction recorded by :func:`predict` with the measured ``result``; print and return the verdict.

    The exercise's grader receives the pair ``(prediction, result)`` and explains the difference. Where the exercise
    measures the result itself (``Exercise.measure``), that measurement is graded, not the value handed in: a value
    that differs from it is named in one line; where the measurement cannot be made (its launch has not run in this
    kernel, or it failed) nothing is graded and the prediction is kept. With no
    prediction recorded the verdict is "not attempted". Once a verdict has shown the result, a prediction recorded
    after it is not counted: one line says so, and the first verdict stays in :func:`results` and the progress
    record (and is returned). Introduced in notebook 01.
    """
    ex = _predict_exercise(exercise_id)
    if ex.id in _PREDICTIONS and ex.id in _LATE:
        first = _REVEALED[ex.id]
        _say("… " + _("{id}: recorded after the result was shown: not counted. The verdict on your first prediction "
                      "stands: {verdict}.").format(id=ex.id, verdict=_(first)))
        return Verdict(first, _("{id}: recorded after the result was shown: not counted.").format(id=ex.id))
    if ex.measure is not None and ex.id in _PREDICTIONS:  # nothing to grade without a prediction: no experiment
        try:
            measured = ex.measure()
        except Exception as exc:  # the experiment failed: grade nothing rather than the value handed in
            measured = exc
        if measured is NOT_MEASURED or isinstance(measured, Exception):
            why = (_("the experiment it grades has not run in this kernel yet: run the cell above that makes it "
                     "(the launch), then this one again") if measured is NOT_MEASURED else
                   _("labkit could not repeat the experiment ({error})").format(error=safe_repr(measured)))
            _RESULTS.setdefault(ex.id, "not attempted")
            _say("… " + _("{id}: {why}. Nothing graded; your prediction is kept.").format(id=ex.id, why=why))
            return Verdict("not attempted", f"{ex.id}: {why}.")
        if not _same_measurement(result, measured):
            _say("⚠ " + _("{id}: the cell handed reveal() {given}, but the experiment gives {measured}; the verdict "
                          "uses the measurement.").format(id=ex.id, given=_short(result), measured=_short(measured)))
        result = measured
    shown, counts = False, False
    if ex.id not in _PREDICTIONS:
        verdict = Verdict("not attempted", _("{id}: not attempted yet. Record a prediction in the cell above "
                                             "(replace its `...`), run it, then run this cell again.").format(id=ex.id))
    else:
        verdict, shown, counts = _escalated(ex, (_PREDICTIONS[ex.id], result))
    mark = {"correct": "✓", "wrong": "✗", "not attempted": "…"}[verdict.status]
    if (counts and verdict.status != "not attempted") or ex.id not in _RESULTS:
        _RESULTS[ex.id] = verdict.status if counts else "not attempted"
    _say(f"{mark} {verdict.message}")
    if verdict.status != "not attempted" and counts:
        _REVEALED.setdefault(ex.id, verdict.status)
        _record(ex.id, verdict.status, solution_seen=shown)
    return verdict


def _short(value: Any) -> str:
    shown = safe_repr(value)
    return shown if len(shown) <= 80 else shown[:77] + "..."


def _same_measurement(given: Any, measured: Any) -> bool:
    """Whether the value a cell handed :func:`reveal` is the one the exercise's own measurement gives (numbers to
    1e-9 relative, NaN equal to NaN; anything else by ``==``)."""
    if isinstance(given, bool) or isinstance(measured, bool):
        return given is measured
    if isinstance(given, numbers.Real) and isinstance(measured, numbers.Real):
        a, b = float(given), float(measured)
        return (math.isnan(a) and math.isnan(b)) or a == b or math.isclose(a, b, rel_tol=1e-9)
    try:
        return bool(given == measured)
    except Exception:  # an object whose == raises or is ambiguous (an array)
        return False


def results() -> dict[str, str]:
    """Return the status of every exercise checked in this kernel, by id (for instructors).

    Introduced in notebook 01.
    """
    return dict(_RESULTS)


def reset_results() -> None:
    """Forget this kernel's results, predictions, revealed results and hint levels (the progress record keeps its
    entries). Introduced in notebook 01.
    """
    _RESULTS.clear()
    _PREDICTIONS.clear()
    _WRONG.clear()
    _REVEALED.clear()
    _LATE.clear()


_RANK = {"not attempted": 0, "wrong": 1, "correct": 2}
_NAME_OK = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def export_results(path: str | Path = ".", name: str | None = None) -> Path:
    """Save this kernel's check results to ``<path>/<name>.json`` (or to ``path`` if it ends in .json).

    ``name`` defaults to the login name. An existing file is merged, keeping each exercise's best
    status (correct > wrong > not attempted), so a student can export after every notebook into the
    same file, e.g. a class folder the instructor reads with :func:`load_results`. The file is written
    atomically with mode 0644 (results are not secret; the folder's permissions decide who may write).
    Returns the file's path. Raises ``ValueError`` for a name that is not a plain file name.
    Introduced in notebook 00.
    """
    import getpass
    import time

    who = name if name is not None else getpass.getuser()
    if not isinstance(who, str) or not _NAME_OK.match(who):
        raise ValueError(f"name must be a plain file name (letters, digits, . _ -), got {safe_repr(who)}")
    target = Path(path).expanduser()
    if target.suffix != ".json":
        target.mkdir(parents=True, exist_ok=True)
        target = target / f"{who}.json"
    merged: dict[str, str] = {}
    if target.exists():
        try:
            old = _parse_json(_read_small_file(target))
        except (OSError, ValueError) as e:
            raise ValueError(f"{target} is not a labkit results file ({e}); not overwriting it") from None
        if not isinstance(old, dict) or not isinstance(old.get("results"), dict):
            raise ValueError(f"{target} is not a labkit results file; not overwriting it")
        merged = {k: v for k, v in old["results"].items() if isinstance(v, str) and v in _RANK}
    for ex_id, status in _RESULTS.items():
        if _RANK[status] >= _RANK.get(merged.get(ex_id, "not attempted"), 0):
            merged[ex_id] = status
    doc = {"name": who, "updated": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "results": dict(sorted(merged.items()))}
    return _write_public_json(target, doc)


def _write_public_json(target: Path, doc: object) -> Path:
    """Write ``doc`` as JSON to ``target`` whole or not at all (a temporary file beside it, then a rename), readable
    by the class (0644): an interrupted write never leaves half a file where the instructor's report reads it."""
    import tempfile

    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(doc, fh, indent=1)
            fh.write("\n")
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def load_results(folder: str | Path) -> dict[str, dict[str, str]]:
    """Read every results file that :func:`export_results` wrote into ``folder``: {student: {exercise id: status}}.

    Each student is listed under the file's own name (``alice.json``: ``alice``), never under the name the file
    claims inside: a file whose ``"name"`` differs is listed under its file name, with one printed line saying
    so. One student's file cannot break the others: only regular files are read (a FIFO, a device or a folder
    named ``*.json`` is skipped; a symbolic link is followed only to a regular file inside ``folder``), each of
    at most 1 MiB and nested at most 32 deep; a file that is not a labkit results file is skipped. Each skipped
    file is said in one printed line. Statuses other than "correct", "wrong" and "not attempted" are left out.
    Nothing in ``folder`` is written. Raises ``ValueError`` if ``folder`` is not a folder. Introduced in notebook 00.
    """
    if not isinstance(folder, (str, os.PathLike)):
        raise TypeError(f"folder must be a folder's path (str or Path), got {type(folder).__name__}")
    out: dict[str, dict[str, str]] = {}
    d = Path(folder).expanduser()
    if not d.is_dir():
        raise ValueError(f"{d} is not a folder")
    inside = d.resolve()
    for f in sorted(d.glob("*.json")):
        try:
            claimed, out[f.stem] = _student_results(f, inside)
        except (OSError, ValueError) as e:
            _say(_one_line(f"(load_results: skipped {f.name}: {e})"))
            continue
        if claimed != f.stem:
            _say(_one_line(f"(load_results: {f.name} gives the name {claimed!r:.70}; listed as {f.stem})"))
    return out


def _student_results(path: Path, inside: Path) -> tuple[Any, dict[str, str]]:
    """Read one student's results file: ``(the name it claims, {exercise id: status})``.

    ``inside`` is the class folder, resolved: a symbolic link must lead to a regular file in it. Raises
    ``ValueError`` (or ``OSError``) for a file that cannot be read safely or is not a labkit results file.
    """
    target = path
    if path.is_symlink():
        target = path.resolve()
        if inside not in target.parents:
            raise ValueError(f"a symbolic link to {target}, outside the folder")
    doc = _parse_json(_read_small_file(target))
    if not isinstance(doc, dict) or not isinstance(doc.get("results"), dict):
        raise ValueError("not a labkit results file")
    results = {k: v for k, v in doc["results"].items() if isinstance(v, str) and v in _RANK}
    return doc.get("name", path.stem), results


def _one_line(text: str) -> str:
    """``text`` with every run of white space (newlines in a file's name included) made one space."""
    return " ".join(text.split())


# ------------------------------------------------------------------------------------ reading small JSON files
#: The most bytes read from a progress record or a results file (a real one holds a few kilobytes).
_JSON_MAX_BYTES = 1 << 20
#: The deepest nesting of [] and {} accepted in those files (a real one nests 3 deep).
_JSON_MAX_DEPTH = 32
# one JSON string (its closing quote optional, so that no match ever backtracks); what is not a bracket
_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"?', re.S)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_BRACKET_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}


def _read_small_file(path: Path, limit: int = _JSON_MAX_BYTES) -> bytes:
    """Return the bytes of the regular file ``path`` (a link is followed), of at most ``limit`` bytes.

    ``FileNotFoundError`` if there is none; ``ValueError`` for a FIFO, device, socket or folder (never opened
    in a way that blocks) or a larger file; another ``OSError`` if it cannot be read.
    """
    if not stat.S_ISREG(os.stat(path).st_mode):
        raise ValueError(f"{path} is not a regular file")
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
    with os.fdopen(fd, "rb") as fh:
        info = os.fstat(fh.fileno())
        if not stat.S_ISREG(info.st_mode):  # replaced between the two looks
            raise ValueError(f"{path} is not a regular file")
        data = fh.read(limit + 1) if info.st_size <= limit else b""
    if info.st_size > limit or len(data) > limit:
        raise ValueError(f"{path} is larger than {limit / 2**20:g} MiB")
    return data


def _too_deep(text: str, max_depth: int) -> bool:
    """Whether ``[]`` and ``{}`` nest deeper than ``max_depth`` in JSON ``text`` (brackets inside strings not
    counted); linear time, in C loops (about 0.1 s for 1 MiB of brackets)."""
    brackets = _NOT_BRACKET.sub("", _JSON_STRING.sub("", text))
    return max(accumulate(map(_BRACKET_STEP.__getitem__, brackets)), default=0) > max_depth


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON allows")


def _parse_json(data: bytes, max_depth: int = _JSON_MAX_DEPTH) -> Any:
    """Parse UTF-8 JSON ``data``; ``ValueError`` if it is not JSON, holds NaN/Infinity, or nests deeper than
    ``max_depth`` (checked before parsing, so no file can exhaust the recursion limit)."""
    text = data.decode("utf-8")  # UnicodeDecodeError is a ValueError
    if _too_deep(text, max_depth):
        raise ValueError(f"it nests deeper than {max_depth} levels")
    try:
        return json.loads(text, parse_constant=_no_constant)
    except RecursionError:  # pragma: no cover - the depth check above comes first
        raise ValueError("it nests too deep") from None


# ------------------------------------------------------------------------------------------- progress record
_PROGRESS_KIND = "labkit-progress"
_PROGRESS_FORMAT = 1
_PROGRESS_ABOUT = ("The exercises you have checked, written by labkit.check on this machine (never sent anywhere). "
                   "`python -m labkit progress` shows it.")
#: Why the progress record could not be written in this kernel (said once), or "" while it works.
_PROGRESS_FAILED: list[str] = []
_LOCK_TIMEOUT_S = 5.0


def _reference_folder(folder: Path) -> bool:
    """Whether ``folder`` is a checkout's ``notebooks/`` or a language folder in it (a translated edition, such as
    ``notebooks/zh``): the reference notebooks, which hold the solutions."""
    if folder.parent.name == "notebooks":
        folder = folder.parent
    root = folder.parent
    return folder.name == "notebooks" and (root / "labkit" / "exercises").is_dir() and (root / "tools" / "nbsrc").is_dir()


def _user_record() -> Path:
    state = os.environ.get("XDG_STATE_HOME", "").strip()
    base = Path(state) if state and Path(state).is_absolute() else Path.home() / ".local" / "state"
    return base / "labkit" / "progress.json"


def progress_path(start: str | Path | None = None) -> Path | None:
    """Return the progress record's file for notebooks running in folder ``start`` (default: the current folder).

    In this order: None in the reference notebooks (a checkout's ``notebooks/``: they hold the solutions, so
    running them is no progress); the file ``$LABKIT_PROGRESS`` names (``off``: None, no record); the
    workspace's ``.labkit-progress.json`` when ``start`` lies in a workspace (:mod:`labkit.workspace`); else the
    per-user file ``$XDG_STATE_HOME/labkit/progress.json`` (``~/.local/state/labkit/progress.json``).
    Introduced in notebook 00.
    """
    from labkit.workspace import PROGRESS_FILE, find_workspace

    if start is not None and not isinstance(start, (str, os.PathLike)):
        raise TypeError(f"start must be a folder's path (str or Path) or None, got {type(start).__name__}")
    try:
        folder = Path.cwd() if start is None else Path(start).expanduser().resolve()
    except OSError:
        folder = None
    if folder is not None and _reference_folder(folder):
        return None
    named = os.environ.get(PROGRESS_ENV, "").strip()
    if named:
        return None if named.lower() == "off" else Path(named).expanduser().absolute()
    ws = find_workspace(folder) if folder is not None else None
    if ws is not None:
        return ws / PROGRESS_FILE
    try:
        return _user_record()
    except RuntimeError:  # no home folder to be found: nowhere to record
        return None


def _read_record(path: Path) -> dict[str, dict[str, Any]]:
    """The ``exercises`` of a progress record ({} if there is no file); ValueError if it is not one.

    Not one: not a regular file (a FIFO is never opened), larger than 1 MiB, not JSON, nested deeper than 32,
    or not a labkit progress record whose entries have the types :func:`_record` writes. The file is only read.
    """
    try:
        doc = _parse_json(_read_small_file(path))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        raise ValueError(f"{path} cannot be read as a labkit progress record ({e}); it was left as it is") from None
    ex = doc.get("exercises") if isinstance(doc, dict) and doc.get("kind") == _PROGRESS_KIND else None
    if not isinstance(ex, dict) or not all(isinstance(k, str) and _entry_ok(v) for k, v in ex.items()):
        raise ValueError(f"{path} is not a labkit progress record; not touching it")
    return ex


#: The type of each field :func:`_record` writes in an exercise's entry (other fields are kept as they are).
_ENTRY_FIELDS: dict[str, type] = {
    "status": str, "attempts": int, "last": str, "solved": str, "solution_seen": bool,
    "solved_after_solution": bool}


def _entry_ok(entry: Any) -> bool:
    """Whether ``entry`` is an exercise's entry as :func:`_record` writes it: a dict whose known fields have
    their types, a known status, and a count of attempts that is an int >= 0 (not a bool, not a float)."""
    if not isinstance(entry, dict):
        return False
    for key, kind in _ENTRY_FIELDS.items():
        value = entry.get(key)
        if value is not None and (not isinstance(value, kind) or (kind is int and isinstance(value, bool))):
            return False
    attempts = entry.get("attempts")
    return entry.get("status", "not attempted") in _RANK and (attempts is None or attempts >= 0)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Hold ``<record>.lock`` (kernels of several notebooks may write at once); give up after a few seconds."""
    try:
        import fcntl
    except ImportError:  # no POSIX locks (Windows): last writer wins, the file is still never half written
        yield
        return
    fd = os.open(path.with_name(path.name + ".lock"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        deadline = time.monotonic() + _LOCK_TIMEOUT_S
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise OSError(f"{path}.lock stayed locked for {_LOCK_TIMEOUT_S:g} s") from None
                time.sleep(0.02)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def _record(exercise_id: str, status: str | None, solution_seen: bool = False) -> None:
    """Add one event to the progress record: a graded answer (``status``) or a solution shown. Never raises:
    a record that cannot be written, or one that is damaged (left as it is, never overwritten), is said once per
    kernel, and the check goes on."""
    try:
        path = progress_path()
        if path is None:
            return
        private = path.name == "progress.json" and path.parent.name == "labkit"  # the per-user folder: 0700
        path.parent.mkdir(mode=0o700 if private else 0o777, parents=True, exist_ok=True)
        with _locked(path):
            record = _read_record(path)
            now = time.strftime("%Y-%m-%dT%H:%M:%S%z")
            entry = dict(record.get(exercise_id, {}))
            old = entry.get("status") if entry.get("status") in _RANK else "not attempted"
            if status is not None:
                entry["attempts"] = (entry.get("attempts") or 0) + 1
                entry["last"] = now
                if status == "correct" and not entry.get("solved"):
                    entry["solved"] = now
                    if entry.get("solution_seen"):
                        entry["solved_after_solution"] = True
                if _RANK[status] >= _RANK[old]:
                    old = status
            entry["status"] = old
            if solution_seen:
                entry["solution_seen"] = True
            record[exercise_id] = entry
            doc = {"about": _PROGRESS_ABOUT, "format": _PROGRESS_FORMAT, "kind": _PROGRESS_KIND,
                   "updated": now, "exercises": dict(sorted(record.items()))}
            tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
            try:
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                with os.fdopen(fd, "w", encoding="utf-8") as fh:
                    json.dump(doc, fh, indent=1)
                    fh.write("\n")
                os.replace(tmp, path)
            finally:
                tmp.unlink(missing_ok=True)
    except Exception as e:  # whatever the record holds or the disk does, check() goes on (said once)
        if not _PROGRESS_FAILED:
            _PROGRESS_FAILED.append(str(e))
            fix = "Move that file aside to start a new record, or set" if isinstance(e, ValueError) else "Set"
            _say(f"(labkit: your progress was not saved: {_one_line(str(e))}. {fix} {PROGRESS_ENV} to a "
                 "file you can write, or to off.)")


def _record_arg(path: str | Path | None) -> Path | None:
    if path is None:
        return progress_path()
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a progress record's file (str or Path) or None, got {type(path).__name__}")
    return Path(path).expanduser()


def load_progress(path: str | Path | None = None) -> dict[str, dict[str, Any]]:
    """Return the progress record, ``{exercise id: {"status", "attempts", "solved", "last", ...}}``.

    ``path`` defaults to :func:`progress_path`; a missing file (or no record here) gives ``{}``. Raises
    ``ValueError`` for a file that is not a labkit progress record (not a regular file, over 1 MiB, not JSON,
    nested too deep, or with entries of the wrong types); the file is only read. Introduced in notebook 00.
    """
    file = _record_arg(path)
    if file is None:
        return {}
    return _read_record(file)


def format_progress(record: dict[str, dict[str, Any]]) -> str:
    """Return the progress view: per notebook, how many exercises are solved, and the exercises tried.

    ``record`` is what :func:`load_progress` returns. ✓ solved, ✗ tried but not solved yet; "(after the
    solution)" marks an exercise solved after its worked solution was shown. Introduced in notebook 00.
    """
    if not isinstance(record, dict) or not all(isinstance(k, str) and isinstance(v, dict) for k, v in record.items()):
        raise TypeError("record must be the dict that load_progress() returns: {exercise id: {...}}")
    from labkit.catalog import NOTEBOOKS

    titles = {n.number: _(n.title) for n in NOTEBOOKS}
    known = all_exercises()
    by_nb: dict[str, list[str]] = {}
    for ex_id in known:
        by_nb.setdefault(ex_id.split(".")[0], []).append(ex_id)
    lines, solved_all = [], 0
    width = max(len(f"{nb} {titles.get(nb, '')}".strip()) for nb in by_nb) if by_nb else 0
    for nb in sorted(by_nb):
        ids = by_nb[nb]
        marks = []
        for ex_id in ids:
            entry = record.get(ex_id, {})
            status = entry.get("status") if isinstance(entry.get("status"), str) else None
            if status == "correct":
                marks.append(f"✓ {ex_id}" + (" " + _("(after the solution)")
                                             if entry.get("solved_after_solution") is True else ""))
            elif status == "wrong":
                marks.append(f"✗ {ex_id}")
        solved = sum(1 for m in marks if m.startswith("✓"))
        solved_all += solved
        head = f"{nb} {titles.get(nb, '')}".strip()
        lines.append(f"{head:<{width}}  " + _("{solved} of {total} solved").format(solved=solved, total=len(ids))
                     + (f"   {'  '.join(marks)}" if marks else ""))
    other = sorted(k for k, v in record.items() if k not in known and isinstance(v.get("status"), str)
                   and v["status"] in ("correct", "wrong"))
    if other:
        lines.append(_("no longer in the workbook: {ids}").format(ids=", ".join(other)))
    total = sum(len(v) for v in by_nb.values())
    lines.append(_("Solved {solved} of {total} exercises.").format(solved=solved_all, total=total))
    return "\n".join(lines)


def progress(path: str | Path | None = None) -> None:
    """Print which exercises you have solved, per notebook, from the progress record (see :func:`progress_path`).

    In the reference notebooks, which record nothing, it says where your record is kept instead.
    Introduced in notebook 00.
    """
    file = _record_arg(path)
    if file is None and _here_is_reference():
        _say(_("The reference notebooks (notebooks/, with the solutions) record no progress. Work in your workspace, "
               "work/ (make lab opens it): your checks are recorded there, and this cell, run there, lists them "
               "(so does `python -m labkit progress`)."))
        return
    if file is None:
        _say(_("No progress is recorded here: {env}=off.").format(env=PROGRESS_ENV))
        return
    try:
        record = load_progress(file)
    except ValueError as e:
        _say(_("Your progress record cannot be shown: {error}").format(error=e))
        return
    _say(_("Your progress (recorded in {file}):").format(file=file) if record else
         _("No exercise checked yet (your progress will be recorded in {file}).").format(file=file))
    _say(format_progress(record))


def _here_is_reference() -> bool:
    try:
        return _reference_folder(Path.cwd())
    except OSError:
        return False
