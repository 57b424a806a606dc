"""Exercises of notebook 02 (underflow, overflow, rounding). Introduced in notebook 02."""

from __future__ import annotations

import math
from typing import Any

import torch

from labkit import formats as F
from labkit.exercises._core import Exercise, FormatSlip
from labkit.exercises._graders import NOT_A_PAIR, as_number, number, pair
from labkit.i18n import N_
from labkit.i18n import gettext as _

__all__ = ["EXERCISES", "UNDERFLOW_VALUES"]

#: The values of exercise 02.underflows: which of them become 0 when cast to FP16?
UNDERFLOW_VALUES: tuple[float, ...] = (1e-8, 3e-8, 1e-7, 6e-5, 1e-30)

_UNDERFLOW_WHY = ("3e-8 is below FP16's smallest subnormal, 2^-24 ≈ 5.96e-8, but it does not become 0: it lies "
                  "above half of it, 2^-25 ≈ 2.98e-8, so rounding to nearest takes it up to 2^-24. Only values "
                  "below 2^-25 (and the tie itself, which goes to the even neighbour 0) flush to zero.")


def _grade_underflows(answer: object) -> tuple[bool, str]:
    want = [bool(v) for v in (torch.tensor(UNDERFLOW_VALUES, dtype=torch.float32).to(torch.float16) == 0)]
    if not isinstance(answer, (list, tuple)) or len(answer) != len(UNDERFLOW_VALUES):
        return False, FormatSlip(_("Give a list of {count} booleans, one per value, True = becomes 0.").format(
            count=len(UNDERFLOW_VALUES)))
    got = [bool(a) for a in answer]
    wrong = [v for v, g, w in zip(UNDERFLOW_VALUES, got, want) if g != w]
    if not wrong:
        return True, ""
    if got == [v < 2.0**-24 for v in UNDERFLOW_VALUES]:
        return False, _UNDERFLOW_WHY
    return False, _("Look again at {values}.").format(values=", ".join(f"{v:g}" for v in wrong))


def _first_unrepresentable_int(fmt: str) -> int:
    n = 1
    while F.round_to(n, fmt) == n:
        n += 1
    return n


def _smallest_surviving_power(fmt: str) -> float:
    k = 0
    while F.round_to(1.0 + 2.0 ** (k - 1), fmt) != 1.0:
        k -= 1
    return 2.0**k


# The typical mistakes' explanations name the mistake, not the answer (the worked solution, the last help, does).
_ULP_WHY = ("2^-10 is the gap at 1.0 (FP16's eps). The spacing is relative: it doubles with every binade, and 1000 "
            "lies many binades above 1.0.")
_INT_WHY = ("2048 = 2^11 is exact (1.0 × 2^11), like every power of two in FP16's range. Look at the spacing of "
            "FP16 values above 2^11 instead: which integers can it still hit?")
_LOST_WHY = ("1.0 + 2^-11 is exactly halfway between 1.0 and the next FP16 value: a tie, and ties go to the even "
             "neighbour, 1.0 itself. That update is lost: the smallest power of two that survives is larger.")

# ---- 02.fp16-weight: predict, then run --------------------------------------------------------------
_WEIGHT_WHY = ("1.0 + 1000 × 1e-5 = 1.01 is what exact arithmetic gives. In FP16 every single + 1e-5 is rounded "
               "right away, and 1e-5 is far below half an ulp of 1.0 (2^-11 ≈ 4.9e-4): each sum rounds back to "
               "1.0, a thousand times. Hence FP32 master weights.")


def _grade_weight(answer: object) -> tuple[bool, str]:
    got = pair(answer)
    if got is None:
        return False, FormatSlip(_(NOT_A_PAIR))
    pred, result = (as_number(v) for v in got)
    if pred is None:
        return False, FormatSlip(_("Predict the weight as a number."))
    if result is None:
        raise ValueError(_("the measured weight must be a number, got {value!r}").format(value=got[1]))
    if math.isclose(pred, result, rel_tol=0, abs_tol=1e-6):
        return True, _("Every update was swamped: 1e-5 is less than half of ulp(1.0) = 2^-10 in FP16, so each sum "
                       "rounds back to 1.0, however many updates there are.")
    if math.isclose(pred, 1.01, rel_tol=1e-3):
        return False, _WEIGHT_WHY
    if pred > result:
        return False, _("It stayed at {result!r}: each update is rounded away on its own; the thousand never add "
                        "up, because FP16 never holds more than the rounded running sum.").format(result=result)
    return False, _("The weight was {result!r} afterwards: an update that is swamped leaves the weight "
                    "unchanged.").format(result=result)


# ---- 02.rms-overflow: debug -------------------------------------------------------------------------
_RMS_WHY = ("x.pow(2) is computed in FP16 and overflows for every |x| above 255.9 (256² = 65536 > 65504): one inf "
            "makes the mean inf, whatever the later steps do.")


def _reference_rms(x: torch.Tensor) -> torch.Tensor:
    return x.float().pow(2).mean().sqrt().to(x.dtype)


def _broken_rms(x: torch.Tensor) -> torch.Tensor:
    """The snippet of the exercise: squares in the input's dtype."""
    return x.pow(2).mean().sqrt()


def _grade_rms(fn: Any) -> tuple[bool, str] | None:
    if not callable(fn):
        return False, FormatSlip(_("Define a function rms(x) and pass the function itself."))
    g = torch.Generator().manual_seed(2)
    cases = [("activations of size ~300", torch.randn(4096, generator=g) * 300, torch.float16),
             ("small activations (~1e-4)", torch.randn(1000, generator=g) * 1e-4, torch.float16),
             ("ordinary values", torch.randn(333, generator=g), torch.float16),
             ("a bf16 tensor", torch.randn(500, generator=g) * 1e4, torch.bfloat16)]
    for what, x32, dtype in cases:
        x = x32.to(dtype)
        got = fn(x.clone())
        if got is None or got is Ellipsis:
            return None  # still a stub: "not attempted yet"
        if not isinstance(got, torch.Tensor) or got.numel() != 1:
            return False, FormatSlip(_("Return a one-element tensor (the root mean square of the whole tensor)."))
        want = x.double().pow(2).mean().sqrt().item()
        if not torch.isfinite(got).all():
            return False, _RMS_WHY
        if got.dtype != dtype:
            return False, _("For {what} you return {got}: cast the result back to the input's dtype ({dtype}).").format(
                what=what, got=got.dtype, dtype=dtype)
        if not math.isclose(got.item(), want, rel_tol=2 ** -(7 if dtype == torch.bfloat16 else 10)):
            msg = _("For {what} you return {got:.6g}; the root mean square is {want:.6g}.").format(
                what=what, got=got.item(), want=want)
            if "small" in what:
                msg += " " + _("The squares of small values flush to zero in FP16 too: upcast *before* squaring.")
            return False, msg
    return True, _("Squared and averaged in fp32, returned in the input's dtype: finite for any FP16 input.")


def _measure_fp16_weight() -> float:
    """An fp16 weight of 1.0 after 1000 updates of 1e-5 (the experiment of 02.fp16-weight)."""
    w16 = torch.tensor(1.0, dtype=torch.float16)
    for _unused in range(1000):
        w16 = w16 + 1e-5
    return w16.item()

EXERCISES = [
    Exercise("02.underflows",
             "For each value in UNDERFLOW_VALUES, say whether it becomes exactly 0 when cast to FP16 (True/False).",
             _grade_underflows,
             "Compare each value with FP16's smallest subnormal, and remember that casting rounds to the nearest.",
             method="The smallest subnormal is 2^-24 ≈ 5.96e-8. A value rounds to 0 only if 0 is nearer than "
                    "2^-24, i.e. below the midpoint 2^-25 ≈ 2.98e-8 (the tie itself goes to the even neighbour, 0).",
             solution="[v < 2.0**-25 for v in UNDERFLOW_VALUES] = [True, False, False, False, True]: 1e-8 and 1e-30 "
                      "vanish; 3e-8 rounds up to 2^-24; 1e-7 survives as 2 × 2^-24; 6e-5 is a subnormal (below 2^-14 ≈ 6.1e-5) but far from 0.",
             kind="compute", wrong_why=_UNDERFLOW_WHY,
             reference=[v < 2.0**-25 for v in UNDERFLOW_VALUES], wrong=[v < 2.0**-24 for v in UNDERFLOW_VALUES]),
    Exercise("02.ulp-1000", "The ulp of 1000 in FP16: the gap between 1000 and the next FP16 value.",
             number(F.ulp(1000.0, "fp16"), N_("the gap"), {2.0**-10: _ULP_WHY}),
             "The gap between neighbours depends on which power of two the number lies under.",
             method="Find k with 2^k <= 1000 < 2^(k+1). In that binade FP16 spaces its values 2^(k - 10) apart "
                    "(10 stored mantissa bits).",
             solution="1000 lies in [2^9, 2^10): ulp = 2**(9 - 10) = 0.5",
             kind="compute", wrong_why=_ULP_WHY, reference=0.5, wrong=2.0**-10),
    Exercise("02.first-int", "The smallest positive integer that FP16 cannot represent exactly.",
             number(float(_first_unrepresentable_int("fp16")), N_("the integer"), {2048.0: _INT_WHY}),
             "Integers are exact as long as the gap between neighbouring FP16 values is at most 1.",
             method="FP16 has 10 stored mantissa bits, 11 with the hidden bit. Work out the gap between "
                    "neighbouring values binade by binade: where does it first grow past 1, and which integer is "
                    "then the first that no FP16 value hits?",
             solution="Every integer up to 2^11 = 2048 is exact; above it the spacing is 2, so 2049 is the first "
                      "that is not (it rounds to 2048).",
             kind="compute", wrong_why=_INT_WHY, reference=2049, wrong=2048),
    Exercise("02.lost-update",
             "The smallest power of two dw such that 1.0 + dw, rounded to FP16, is not 1.0.",
             number(_smallest_surviving_power("fp16"), "dw", {2.0**-11: _LOST_WHY}),
             "What is the gap after 1.0 in FP16, and what happens exactly halfway?",
             method="Work out ulp(1.0) in FP16 from its 10 stored mantissa bits. Anything below half an ulp rounds "
                    "back to 1.0; exactly half an ulp is a tie, and ties round to the neighbour whose last mantissa "
                    "bit is 0.",
             solution="1.0 + 2^-11 is a tie that rounds to even, i.e. to 1.0; so dw = 2**-10, a whole ulp.",
             kind="compute", wrong_why=_LOST_WHY, reference=2.0**-10, wrong=2.0**-11),
    Exercise("02.fp16-weight",
             "Predict, then run: an FP16 weight of 1.0 receives 1000 updates of +1e-5, each added in FP16. "
             "What is the weight afterwards?",
             _grade_weight,
             "Each update is added and rounded on its own; compare one update with the spacing of FP16 at 1.0.",
             method="ulp(1.0) in FP16 is 2^-10 ≈ 0.00098. A sum that lands less than half an ulp away from 1.0 "
                    "rounds back to 1.0. Does 1.0 + 1e-5 get past the midpoint?",
             solution="prediction = 1.0: 1e-5 < 2^-11, so every one of the 1000 sums rounds back to 1.0 (FP32 keeps "
                      "them: 1.0100136).",
             kind="predict", wrong_why=_WEIGHT_WHY, reference=(1.0, 1.0), wrong=(1.01, 1.0),
             measure=_measure_fp16_weight),
    Exercise("02.rms-overflow",
             "Debug: rms(x) returns inf for FP16 activations of size ~300. Write a fixed rms(x) that is finite for "
             "any FP16 (or BF16) tensor and returns the input's dtype.",
             _grade_rms,
             "Find the first intermediate value that cannot be represented in FP16.",
             method="x.pow(2) runs in the input's dtype: 300² = 90000 is beyond FP16's 65504. Do the fragile part "
                    "(square, mean, sqrt) in a wider dtype, then return to the input's dtype.",
             solution="def rms(x):\n    return x.float().pow(2).mean().sqrt().to(x.dtype)",
             kind="debug", wrong_why=_RMS_WHY, reference=_reference_rms, wrong=_broken_rms),
]
