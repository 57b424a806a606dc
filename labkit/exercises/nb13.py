"""Exercises of notebook 13 (the troubleshooting clinic), generated from the clinic's one table.

Every case of :data:`labkit.clinic.CASES` gives two exercises: ``13.<case>-cause`` (the letter of the right cause
among ``clinic.causes(case)``) and ``13.<case>-fix`` (a one-setting fix, graded by running the case with it and
asking the case's detector whether the symptom is gone). ``13.lr-predict`` is a predict-then-run exercise on the
learning-rate case. Introduced in notebook 13.
"""

from __future__ import annotations

from typing import Any

from labkit.clinic import CASES, CaseRun, grade_cause, grade_fix
from labkit.clinic.table import LR_RATIO_LIMIT, Case, lr_ratio
from labkit.exercises._core import Exercise, FormatSlip
from labkit.i18n import gettext as _

__all__ = ["EXERCISES", "LR_OUTCOMES", "lr_outcome"]

#: The answers of ``13.lr-predict``: where the 2-rank curve ends, against the 1-GPU curve, after as many examples.
LR_OUTCOMES = ("higher", "the same", "lower")


def lr_outcome(run: CaseRun) -> str:
    """Say where a run of the "lr" case ended against the 1-GPU run: one of :data:`LR_OUTCOMES`.

    "the same" means within a factor of ``LR_RATIO_LIMIT`` (1.3) either way. Introduced in notebook 13.
    """
    if not isinstance(run, CaseRun):
        raise TypeError(f"run must be a CaseRun of the 'lr' case (clinic.run_case('lr')), got {type(run).__name__}")
    if run.key != "lr" or run.result is None:
        raise ValueError("run must be a finished run of the 'lr' case")
    ratio = lr_ratio(run)
    return "higher" if ratio > LR_RATIO_LIMIT else "lower" if ratio < 1 / LR_RATIO_LIMIT else "the same"


def _grade_lr_predict(pair: Any) -> tuple[bool, str]:
    if not (isinstance(pair, tuple) and len(pair) == 2):
        return False, FormatSlip(_("Give your prediction as one of 'higher', 'the same', 'lower'."))
    prediction, result = pair
    guess = prediction.strip().lower() if isinstance(prediction, str) else prediction
    if guess not in LR_OUTCOMES:
        return False, FormatSlip(_("Predict one of {outcomes}, got {prediction!r}.").format(
            outcomes=", ".join(repr(o) for o in LR_OUTCOMES), prediction=prediction))
    if result not in LR_OUTCOMES:
        return False, FormatSlip(_("The measured result should be one of {outcomes}, got {result!r}.").format(
            outcomes=LR_OUTCOMES, result=result))
    why = _("Both runs see 960 examples, but the 2-rank run takes 15 steps of global batch 64 where the 1-GPU run "
            "took 30 of 32. Averaging over more examples does not make a step longer: with the same learning rate "
            "it moves the weights about half as far.")
    if guess == result:
        return True, _("You predicted {guess!r} and it came out {result!r}. {why}").format(
            guess=guess, result=result, why=why)
    return False, _("You predicted {guess!r}; it came out {result!r}. {why}").format(
        guess=guess, result=result, why=why)


def _cause_exercise(case: Case) -> Exercise:
    right, trap = case.causes[case.answer], case.causes[case.trap]
    trap_letter = "abcdefgh"[case.trap]
    return Exercise(
        f"13.{case.key}-cause",
        f"Case {case.number} ({case.title}): the letter of the cause among clinic.causes({case.key!r}).",
        lambda answer, key=case.key: grade_cause(key, answer),
        case.cause_hint,
        reference=case.letter, wrong=trap_letter,
        method=case.cause_method,
        solution=f"({case.letter}) {right.text} {right.why}",
        kind="debug",
        wrong_why=f"({trap_letter}) {trap.text} No: {trap.why}",
    )


def _fix_exercise(case: Case) -> Exercise:
    return Exercise(
        f"13.{case.key}-fix",
        f"Case {case.number} ({case.title}): a dict of one setting of the script's CONFIG that removes the symptom "
        f"when clinic.run_case({case.key!r}, fix=...) runs it.",
        lambda fix, key=case.key: grade_fix(key, fix),
        case.fix_hint,
        reference=dict(case.fix), wrong=dict(case.wrong_fix),
        method=case.fix_method,
        solution=f"fix = {case.fix!r}. {case.fix_why}",
        kind="debug",
        wrong_why=case.wrong_fix_why,
    )


def _measure_lr_outcome() -> str:
    """Where the "lr" case's run ends against the 1-GPU run (the experiment of 13.lr-predict; the clinic remembers
    the run the notebook made, so this runs nothing twice)."""
    from labkit.clinic import run_case

    return lr_outcome(run_case("lr"))


EXERCISES = [ex for case in CASES.values() for ex in (_cause_exercise(case), _fix_exercise(case))] + [
    Exercise(
        "13.lr-predict",
        "Case 11, before running it: after the same 960 examples, does the 2-rank run (global batch 64, the 1-GPU "
        "learning rate) end with a loss 'higher', 'the same' or 'lower' than the 1-GPU run?",
        _grade_lr_predict,
        "Count the optimizer steps each run takes for 960 examples, and how far each step goes.",
        reference=("higher", "higher"), wrong=("the same", "higher"),
        method="A step's gradient is an average, so its size does not grow with the batch; the step is lr x "
               "gradient. Half as many steps of the same size cover half the distance.",
        solution="'higher': 15 steps of the same size instead of 30. The linear scaling rule (lr x 2) closes the gap.",
        kind="predict",
        wrong_why="'the same' would need each step of the 2-rank run to go twice as far; averaging over 64 examples "
                  "makes the gradient less noisy, not larger.",
        measure=_measure_lr_outcome,
    ),
]
