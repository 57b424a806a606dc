"""What every exercise module builds on: the :class:`Exercise` record and the shared grader factories.

It lives in the exercises package, not in :mod:`labkit.check`, so that the imports go one way only:
``labkit.check`` imports ``labkit.exercises``, and nothing in ``labkit.exercises`` imports ``labkit.check``.
Not an exercise module (its name does not start with ``nb``), so the registry does not load it.

Introduced in notebook 01.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from labkit.i18n import N_
from labkit.i18n import gettext as _

__all__ = ["NOT_GIVEN", "Exercise", "number_grader"]


class _NotGiven:
    def __repr__(self) -> str:
        return "NOT_GIVEN"


#: The default of :attr:`Exercise.reference` and :attr:`Exercise.wrong`: no answer given.
NOT_GIVEN: Any = _NotGiven()


#: What an exercise's ``measure`` returns when the experiment has not run in this kernel yet (a launch it reads):
#: :func:`labkit.check.reveal` then grades the value the cell hands it.
NOT_MEASURED: Any = type("NotMeasured", (), {"__repr__": lambda self: "NOT_MEASURED"})()


class FormatSlip(str):
    """A grader's message for an answer in the wrong form (text where a number is asked, a value where a function
    is asked, a prediction handed to ``check``): ``return False, FormatSlip("Give the value as a number.")``.

    It is a ``str``, so it reads like any message; :func:`labkit.check.check` prints it but does not count the
    answer as a wrong try: the hints do not climb and the progress record is not touched. Use it only for the form
    of an answer, never for a mistake in its substance. Not in ``__all__``: the exercise modules' own helper.
    Introduced in notebook 01.
    """

    __slots__ = ()


@dataclass(frozen=True)
class Exercise:
    """One exercise: an id such as ``"01.fp16-max"``, a one-line prompt, a grader and a hint.

    ``grade(answer)`` returns ``True``/``False`` or a ``(bool, message)`` pair; it may call the
    learner's function on fresh inputs, and returns ``None`` when a learner's function is still a stub
    (it returned ``...`` or ``None``), which reports "not attempted yet". ``hint`` is shown on a wrong
    answer. ``reference`` (a correct answer) and ``wrong`` (a typical mistake) let the tests prove that
    the grader tells them apart. Hints escalate: ``hint`` (a nudge), ``method``, then ``solution``;
    ``wrong_why`` answers the typical mistake by name. ``kind`` classifies the exercise.

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
    #: The second hint (after ``hint``, the nudge): how to get there, without the answer.
    method: str = ""
    #: The worked solution: the third hint, and what ``labkit.check.solution(id)`` shows.
    solution: str = ""
    #: What the learner does: "compute", "implement", "design", "recall", "predict" or "debug".
    kind: str = ""
    #: Feedback for the typical mistake ``wrong``: names the mistake and says why it is wrong.
    wrong_why: str = ""
    #: For a predict exercise: labkit's own measurement of the result (no arguments), which
    #: :func:`labkit.check.reveal` grades against instead of trusting the value the cell hands it.
    measure: Callable[[], Any] | None = None


def whole(name: str, value: Any, low: int) -> int:
    """Return ``value`` if it is an int ``>= low`` (not a bool); raise TypeError/ValueError naming ``name``.

    For the exercises' data helpers (sizes and seeds). Not in ``__all__``: the exercise modules' own helper.
    Introduced in notebook 03.
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < low:
        raise ValueError(f"{name} must be >= {low}, got {value}")
    return value


def number_grader(want: float, what: str = N_("the value"), rel: float = 0.0,
                  close: float = 1e-2) -> Callable[[Any], tuple[bool, str]]:
    """Return a grader for a numeric answer: equal to ``want`` within ``rel`` (0 means exactly).

    A bool, a text or a non-number gets a "give a number" :class:`FormatSlip` (not a wrong try); an answer within
    ``close`` (relative) but not within ``rel`` is told it is close. Introduced in notebook 01.
    """
    def grade(answer: Any) -> tuple[bool, str]:
        shown = _(what)  # a label marked with N_() where the exercise defines it
        if isinstance(answer, bool):
            return False, FormatSlip(_("Give {what} as a number, not a bool.").format(what=shown))
        if isinstance(answer, (str, bytes)):
            return False, FormatSlip(_("Give {what} as a number, not text (no quotes).").format(what=shown))
        try:
            got = float(answer)
        except (TypeError, ValueError, OverflowError):
            return False, FormatSlip(_("Give {what} as a number.").format(what=shown))
        if got == want or (math.isfinite(got) and abs(got - want) <= rel * abs(want)):
            return True, ""
        if math.isfinite(got) and want and abs(got - want) <= close * abs(want):
            return False, (_("{got!r} is close, but the exact value is wanted.") if rel == 0 else
                           _("{got!r} is close, but not close enough.")).format(got=got)
        return False, ""

    return grade


class Described(Mapping[str, str]):
    """A read-only table ``{key: description}`` whose descriptions read in the notebook's language.

    The keys are what a learner types and a grader compares: they stay as they are. Each description is an
    English message (marked with ``N_``), looked up with gettext whenever it is read (``table[key]``, ``.items()``,
    ``.values()``, ``dict(table)``), so a notebook's ``for k, text in TABLE.items(): print(...)`` prints it in the
    edition's language. The exercise modules' own helper (not in ``__all__``). Introduced in notebook 05.
    """

    __slots__ = ("_texts",)

    def __init__(self, texts: Mapping[str, str]) -> None:
        self._texts = dict(texts)

    def __getitem__(self, key: str) -> str:
        return _(self._texts[key])

    def __iter__(self) -> Iterator[str]:
        return iter(self._texts)

    def __len__(self) -> int:
        return len(self._texts)

    def __repr__(self) -> str:
        return repr(dict(self.items()))
