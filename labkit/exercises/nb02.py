"""Exercises of notebook 02 (underflow, overflow, rounding). Introduced in notebook 02."""

from __future__ import annotations

import torch

from labkit import formats as F
from labkit.exercises._core import Exercise, number_grader

__all__ = ["EXERCISES", "UNDERFLOW_VALUES"]

#: The values of exercise 02.underflows: which of them become 0 when cast to FP16?
UNDERFLOW_VALUES: tuple[float, ...] = (1e-8, 3e-8, 1e-7, 6e-5, 1e-30)


def _grade_underflows(answer: object) -> tuple[bool, str]:
    want = [bool(v) for v in (torch.tensor(UNDERFLOW_VALUES, dtype=torch.float32).to(torch.float16) == 0)]
    if not isinstance(answer, (list, tuple)) or len(answer) != len(UNDERFLOW_VALUES):
        return False, f"Give a list of {len(UNDERFLOW_VALUES)} booleans, one per value, True = becomes 0."
    got = [bool(a) for a in answer]
    wrong = [v for v, g, w in zip(UNDERFLOW_VALUES, got, want) if g != w]
    if not wrong:
        return True, ""
    return False, f"Look again at {', '.join(f'{v:g}' for v in wrong)}."




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


EXERCISES = [
    Exercise("02.underflows",
             "For each value in UNDERFLOW_VALUES, say whether it becomes exactly 0 when cast to FP16 (True/False).",
             _grade_underflows,
             "FP16's smallest subnormal is 2^-24 ≈ 5.96e-8. Values below half of it (2^-25 ≈ 2.98e-8) round to "
             "0; values between the subnormals and 2^-14 survive, with fewer bits.",
             reference=[v < 2.0**-25 for v in UNDERFLOW_VALUES], wrong=[v < 2.0**-24 for v in UNDERFLOW_VALUES]),
    Exercise("02.ulp-1000", "The ulp of 1000 in FP16: the gap between 1000 and the next FP16 value.",
             number_grader(F.ulp(1000.0, "fp16"), "the gap"),
             "1000 lies in [512, 1024) = [2^9, 2^10). FP16 has 10 mantissa bits, so the gap there is 2^(9-10).",
             reference=0.5, wrong=2.0**-10),
    Exercise("02.first-int", "The smallest positive integer that FP16 cannot represent exactly.",
             number_grader(float(_first_unrepresentable_int("fp16")), "the integer"),
             "With 10 stored mantissa bits (11 with the hidden bit), every integer up to 2^11 is exact. "
             "Above 2^11 the gap between neighbours is 2.", reference=2049, wrong=2048),
    Exercise("02.lost-update",
             "The smallest power of two dw such that 1.0 + dw, rounded to FP16, is not 1.0.",
             number_grader(_smallest_surviving_power("fp16"), "dw"),
             "ulp(1.0) in FP16 is 2^-10. An update of exactly half an ulp is a tie, and ties go to the even "
             "neighbour, which is 1.0 itself.", reference=2.0**-10, wrong=2.0**-11),
]
