"""Exercises of notebook 01 (float bit layouts). Introduced in notebook 01."""

from __future__ import annotations

from labkit import formats as F
from labkit.exercises._core import Exercise, number_grader

__all__ = ["EXERCISES"]




def _fields_of(x: float, fmt: str):
    fl = F.fields(x, fmt)
    want = (fl.sign, fl.exponent, fl.mantissa)

    def grade(answer: object) -> tuple[bool, str]:
        if not isinstance(answer, (tuple, list)) or len(answer) != 3:
            return False, "Give a tuple (sign, exponent field, mantissa field) of ints."
        got = tuple(int(a) for a in answer)
        if got == want:
            return True, ""
        part = [n for n, g, w in zip(("sign", "exponent", "mantissa"), got, want) if g != w]
        return False, f"Check the {', '.join(part)} field{'s' if len(part) > 1 else ''}."
    return grade


EXERCISES = [
    Exercise("01.fp16-max", "The largest finite FP16 value.", number_grader(65504.0, "the value"),
             "Largest exponent field that is not all ones is 11110 (30 - 15 = 15); largest mantissa is "
             "all ones: (2 - 2^-10) × 2^15.",
             reference=65504.0, wrong=65536.0),
    Exercise("01.decode-bf16", "The value of the BF16 pattern 0x4049.", number_grader(F.decode(0x4049, "bf16"), "the value"),
             "0x4049 = 0 10000000 1001001: exponent 128 - 127 = 1, mantissa 1 + 73/128.",
             reference=(1 + 0b1001001 / 128) * 2.0**1, wrong=1 + 0b1001001 / 128),
    Exercise("01.fp16-fields", "The (sign, exponent field, mantissa field) of -2.5 in FP16.", _fields_of(-2.5, "fp16"),
             "-2.5 = -1.25 × 2^1: sign 1, exponent field 1 + 15, mantissa 0.25 × 1024.",
             reference=(1, 16, 256), wrong=(1, 1, 256)),
    Exercise("01.e4m3-max", "The largest finite E4M3FN value (pattern 0 1111 110).", number_grader(448.0, "the value"),
             "E4M3FN has no inf, so exponent 1111 holds normals: 2^(15-7) × (1 + 6/8).",
             reference=448.0, wrong=240.0),
    Exercise("01.bf16-eps", "BF16's machine epsilon: the gap between 1 and the next BF16 value.",
             number_grader(2.0**-7, "the value"), "BF16 keeps 7 mantissa bits: the last one is worth 2^-7 at 1.0.",
             reference=2.0**-7, wrong=2.0**-8),
]
