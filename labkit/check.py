"""Exercise checking: ``check(exercise_id, answer)`` prints ✓ or a hint and never raises on a wrong answer.

Exercises live in :mod:`labkit.exercises` (one module per notebook). A learner's answer that is still
``...`` (Ellipsis) is reported as "not attempted yet", so a student copy of a notebook, with the
solutions stripped, still runs top to bottom. :class:`~labkit.exercises.Exercise`, ``NOT_GIVEN`` and
:func:`~labkit.exercises.number_grader` are defined in :mod:`labkit.exercises` and re-exported here.
"""

from __future__ import annotations

import re
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from labkit.exercises import NOT_GIVEN, Exercise, get_exercise, number_grader

__all__ = [
    "NOT_GIVEN",
    "Exercise",
    "Verdict",
    "check",
    "contains_ellipsis",
    "evaluate",
    "export_results",
    "load_results",
    "number_grader",
    "predict",
    "reset_results",
    "results",
    "reveal",
]


@dataclass(frozen=True)
class Verdict:
    """The outcome of one check: ``status`` is "correct", "wrong" or "not attempted".

    Introduced in notebook 01.
    """

    status: str
    message: str = ""


_RESULTS: dict[str, str] = {}
_PREDICTIONS: dict[str, Any] = {}


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
        return bool(ok), "" if detail is None else str(detail)
    return bool(out), ""


def evaluate(exercise_id: str, answer: Any) -> Verdict:
    """Grade ``answer`` for ``exercise_id`` and return a :class:`Verdict` without printing.

    Raises ``ValueError`` for an unknown exercise id (a bug in the notebook, not a wrong answer).
    Introduced in notebook 01.
    """
    ex = get_exercise(exercise_id)
    try:
        if contains_ellipsis(answer):
            return Verdict("not attempted", f"{ex.id}: not attempted yet. Replace the `...` and run the cell again.")
        out = ex.grade(answer)
        if out is None:
            return Verdict("not attempted", f"{ex.id}: not attempted yet. Your function still returns nothing; "
                                            "fill in its body and run the cell again.")
        ok, detail = _outcome(out)
    except (Exception, SystemExit) as exc:  # whatever the answer does, the cell goes on (Ctrl-C still stops it)
        last = traceback.format_exception_only(type(exc), exc)[-1].strip()
        return Verdict("wrong", f"{ex.id}: your answer raised {last}. Hint: {ex.hint}")
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

    Whatever ``answer`` is (a container that holds itself, a list nested thousands deep, an object whose
    methods raise), the outcome is printed, not raised; only an unknown ``exercise_id`` (a bug in the
    notebook, not in the answer) raises ``ValueError``/``TypeError``.
    Introduced in notebook 01.
    """
    verdict = evaluate(exercise_id, answer)
    mark = {"correct": "✓", "wrong": "✗", "not attempted": "…"}[verdict.status]
    _RESULTS[exercise_id] = verdict.status
    # lone surrogates (from an answer's text) cannot be encoded for printing: show them escaped
    print(f"{mark} {verdict.message}".encode("utf-8", "backslashreplace").decode("utf-8"))


def _predict_exercise(exercise_id: str) -> Exercise:
    ex = get_exercise(exercise_id)
    if ex.kind != "predict":
        raise ValueError(f"{exercise_id} is not a predict-then-run exercise (kind {ex.kind!r}); use check()")
    return ex


def predict(exercise_id: str, prediction: Any) -> None:
    """Record the learner's prediction for a *predict, then run* exercise, before the cell that shows the result.

    A prediction that is still ``...`` is reported as "not attempted yet". :func:`reveal`, called by the next
    cell with the measured result, compares the two. Raises ``ValueError`` for an id that is not a predict
    exercise. Introduced in notebook 01.
    """
    ex = _predict_exercise(exercise_id)
    _PREDICTIONS.pop(ex.id, None)
    if contains_ellipsis(prediction):
        _RESULTS.setdefault(ex.id, "not attempted")
        print(f"… {ex.id}: not attempted yet. Replace the `...` with your prediction and run the cell again.")
        return
    _PREDICTIONS[ex.id] = prediction
    shown = repr(prediction)
    shown = shown if len(shown) <= 80 else shown[:77] + "..."
    print(f"✎ {ex.id}: prediction recorded ({shown}). Now run the next cell.".encode("utf-8", "backslashreplace")
          .decode("utf-8"))


def reveal(exercise_id: str, result: Any) -> Verdict:
    """Compare the prediction recorded by :func:`predict` with the measured ``result``; print and return the verdict.

    The exercise's grader receives the pair ``(prediction, result)`` and explains the difference. With no
    prediction recorded the verdict is "not attempted". Introduced in notebook 01.
    """
    ex = _predict_exercise(exercise_id)
    if ex.id not in _PREDICTIONS:
        verdict = Verdict("not attempted", f"{ex.id}: not attempted yet. Record a prediction in the cell above "
                                           "(replace its `...`), run it, then run this cell again.")
    else:
        verdict = evaluate(ex.id, (_PREDICTIONS[ex.id], result))
    mark = {"correct": "✓", "wrong": "✗", "not attempted": "…"}[verdict.status]
    if verdict.status != "not attempted" or ex.id not in _RESULTS:
        _RESULTS[ex.id] = verdict.status
    print(f"{mark} {verdict.message}".encode("utf-8", "backslashreplace").decode("utf-8"))
    return verdict


def results() -> dict[str, str]:
    """Return the status of every exercise checked in this kernel, by id (for instructors).

    Introduced in notebook 01.
    """
    return dict(_RESULTS)


def reset_results() -> None:
    """Forget all recorded results and predictions. Introduced in notebook 01."""
    _RESULTS.clear()
    _PREDICTIONS.clear()


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
    import json
    import os
    import tempfile
    import time

    who = name if name is not None else getpass.getuser()
    if not isinstance(who, str) or not _NAME_OK.match(who):
        raise ValueError(f"name must be a plain file name (letters, digits, . _ -), got {who!r}")
    target = Path(path).expanduser()
    if target.suffix != ".json":
        target.mkdir(parents=True, exist_ok=True)
        target = target / f"{who}.json"
    merged: dict[str, str] = {}
    if target.exists():
        old = json.loads(target.read_text())
        if not isinstance(old, dict) or not isinstance(old.get("results"), dict):
            raise ValueError(f"{target} is not a labkit results file; not overwriting it")
        merged = {k: v for k, v in old["results"].items() if v in _RANK}
    for ex_id, status in _RESULTS.items():
        if _RANK[status] >= _RANK.get(merged.get(ex_id, "not attempted"), 0):
            merged[ex_id] = status
    doc = {"name": who, "updated": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "results": dict(sorted(merged.items()))}
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(doc, fh, indent=1)
            fh.write("\n")
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def load_results(folder: str | Path) -> dict[str, dict[str, str]]:
    """Read every results file that :func:`export_results` wrote into ``folder``: {name: {exercise id: status}}.

    Files that are not labkit results files are skipped. Introduced in notebook 00.
    """
    import json

    out: dict[str, dict[str, str]] = {}
    d = Path(folder).expanduser()
    if not d.is_dir():
        raise ValueError(f"{d} is not a folder")
    for f in sorted(d.glob("*.json")):
        try:
            doc = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(doc, dict) and isinstance(doc.get("results"), dict):
            out[str(doc.get("name", f.stem))] = {k: v for k, v in doc["results"].items() if v in _RANK}
    return out
