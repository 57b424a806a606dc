"""Exercises of notebook 01 (float bit layouts). Introduced in notebook 01."""

from __future__ import annotations

import math

from labkit import formats as F
from labkit.exercises._core import Exercise, FormatSlip
from labkit.exercises._graders import NOT_A_PAIR, as_number, number, pair
from labkit.i18n import N_
from labkit.i18n import gettext as _

__all__ = ["EXERCISES"]

# The typical mistakes' explanations name the mistake, never the answer: they are shown from the first wrong try
# on, and the number itself waits for the last level of help, the worked solution.
_MAX_WHY = ("65536 = 2^16 is one binade too far: FP16 reaches 2^16 only with the all-ones exponent, which is "
            "reserved for inf and NaN. The largest finite value lies one binade lower, with the largest exponent "
            "field that is not reserved and an all-ones mantissa (a significand a little below 2).")
_DECODE_WHY = ("You decoded the mantissa (1 + 73/128) but left out the exponent: the value is the mantissa times "
               "2^(exponent field - bias), and BF16's bias is 127.")
_FIELDS_WHY = ("(1, 1, 256) gives the exponent itself. The exponent *field* stores the exponent plus FP16's bias, "
               "so that negative exponents need no sign of their own.")
_E4M3_WHY = ("240 is the IEEE-style answer: it reserves exponent 1111 for inf/NaN, as E5M2 does, and stops at "
             "2^7 × 1.875. E4M3FN has no inf: exponent 1111 holds normal numbers and only the mantissa 111 is NaN, "
             "so the pattern 0 1111 110 of the prompt is a normal number: decode it with the bias 7.")
_EPS_WHY = ("2^-8 is half of eps: the unit roundoff, the largest relative error of rounding to nearest. eps is the "
            "gap itself, the weight of the last stored mantissa bit at 1.0.")


#: The names of the three fields, in order, as a wrong answer's feedback names them.
_FIELD_NAMES = (N_("sign"), N_("exponent"), N_("mantissa"))


def _fields_of(x: float, fmt: str):
    fl = F.fields(x, fmt)
    want = (fl.sign, fl.exponent, fl.mantissa)
    exp = int(math.floor(math.log2(abs(x))))

    def grade(answer: object) -> tuple[bool, str]:
        if not isinstance(answer, (tuple, list)) or len(answer) != 3:
            return False, FormatSlip(_("Give a tuple (sign, exponent field, mantissa field) of ints."))
        if any(as_number(a) is None for a in answer):
            return False, FormatSlip(_("The three fields are whole numbers (ints)."))
        if not all(float(a).is_integer() for a in answer):  # e.g. the fraction 0.25 itself: a mistake, not a slip
            return False, _("Each field is a whole number: the bits read as an unsigned integer. A fraction "
                            "belongs to the value, not to a field.")
        got = tuple(int(a) for a in answer)
        if got == want:
            return True, ""
        if got == (want[0], exp, want[2]):
            return False, _FIELDS_WHY
        part = [_(n) for n, g, w in zip(_FIELD_NAMES, got, want) if g != w]
        if len(part) == 1:
            return False, _("Check the {field} field.").format(field=part[0])
        return False, _("Check the {fields} fields.").format(fields=", ".join(part))
    return grade


# ---- 01.e4m3-overflow: predict, then run ----------------------------------------------------------------
_SAT_INF_WHY = ("E4M3FN has no bit pattern for infinity at all ('FN': finite, NaN only), so an overflow cannot "
                "become inf. torch saturates it to the largest finite value, 448; ml_dtypes gives NaN.")


def _grade_e4m3_overflow(answer: object) -> tuple[bool, str]:
    got = pair(answer)
    if got is None:
        return False, FormatSlip(_(NOT_A_PAIR))
    pred, result = (as_number(v) for v in got)
    if pred is None:
        return False, FormatSlip(_("Predict a number: a float such as 300.0, or math.inf, or math.nan."))
    if result is None:
        raise ValueError(_("the measured value must be a number, got {value!r}").format(value=got[1]))
    if pred == result or (math.isnan(pred) and math.isnan(result)):
        return True, _("torch's cast saturates: 500 is beyond E4M3FN's largest finite value, and the format has no "
                       "inf, so it becomes 448. A silent 448 hides an overflow; that is why FP8 scales its tensors.")
    if math.isinf(pred):
        return False, _SAT_INF_WHY
    if math.isnan(pred):
        return False, _("NaN is what ml_dtypes (and the OCP spec's non-saturating mode) give, not torch: torch's "
                        "cast saturates an E4M3FN overflow to ±448, even for inf.")
    if pred == 500.0:
        return False, _("500 has no E4M3FN pattern: the largest finite value is 448 (0 1111 110), and 500 lies "
                        "beyond it, so the cast has to do something else than round to a neighbour.")
    return False, _("torch gave {result:g}. Values above 448 plus half an ulp cannot round to a neighbour; torch "
                    "saturates them to the largest finite E4M3FN value.").format(result=result)


def _measure_e4m3_overflow() -> float:
    """What torch's cast gives for 500.0 through float8_e4m3fn and back (the experiment of 01.e4m3-overflow)."""
    import torch

    return torch.tensor(500.0).to(torch.float8_e4m3fn).float().item()

EXERCISES = [
    Exercise("01.fp16-max", "The largest finite FP16 value.",
             number(65504.0, N_("the value"), {65536.0: _MAX_WHY}),
             "Use the largest exponent that is not reserved, and the largest mantissa.",
             method="The exponent field 11111 holds inf/NaN, so the largest usable field is 11110 = 30, minus the "
                    "bias 15. An all-ones mantissa means 1.1111111111 in binary, just below 2.",
             solution="(2 - 2**-10) * 2**15 = 65504.0",
             kind="compute", wrong_why=_MAX_WHY,
             reference=65504.0, wrong=65536.0),
    Exercise("01.decode-bf16", "The value of the BF16 pattern 0x4049.",
             number(F.decode(0x4049, "bf16"), N_("the value"), {1 + 0b1001001 / 128: _DECODE_WHY}),
             "Write the 16 bits out in binary and split them 1 + 8 + 7.",
             method="0x4049 = 0 10000000 1001001. Value = (-1)^sign × 2^(exponent field − 127) × (1 + mantissa/128).",
             solution="sign 0, exponent 128 − 127 = 1, mantissa 1 + 73/128 = 1.5703125: 2 × 1.5703125 = 3.140625",
             kind="compute", wrong_why=_DECODE_WHY,
             reference=(1 + 0b1001001 / 128) * 2.0**1, wrong=1 + 0b1001001 / 128),
    Exercise("01.fp16-fields", "The (sign, exponent field, mantissa field) of -2.5 in FP16.", _fields_of(-2.5, "fp16"),
             "First write 2.5 as 1.something × 2^e.",
             method="-2.5 = -1.25 × 2^1. The exponent field stores e + bias (bias 15); the mantissa field stores the "
                    "fraction after the leading 1, as an integer out of 2^10.",
             solution="(1, 1 + 15, 0.25 * 1024) = (1, 16, 256)",
             kind="compute", wrong_why=_FIELDS_WHY,
             reference=(1, 16, 256), wrong=(1, 1, 256)),
    Exercise("01.e4m3-max", "The largest finite E4M3FN value (pattern 0 1111 110).",
             number(448.0, N_("the value"), {240.0: _E4M3_WHY}),
             "Decode the pattern 0 1111 110 with E4M3's bias; ask what the all-ones exponent means in this format.",
             method="E4M3's bias is 7. In E4M3FN the all-ones exponent still holds normal numbers; only "
                    "S.1111.111 is NaN. Value = 2^(field − 7) × (1 + mantissa/8).",
             solution="2**(15 - 7) * (1 + 6/8) = 256 × 1.75 = 448.0",
             kind="compute", wrong_why=_E4M3_WHY,
             reference=448.0, wrong=240.0),
    Exercise("01.bf16-eps", "BF16's machine epsilon: the gap between 1 and the next BF16 value.",
             number(2.0**-7, N_("the value"), {2.0**-8: _EPS_WHY}),
             "How many mantissa bits does BF16 store, and what is the last one worth at 1.0?",
             method="At 1.0 the exponent is 0, so the last stored mantissa bit is worth 2^-(number of stored bits).",
             solution="BF16 stores 7 mantissa bits: eps = 2**-7 = 0.0078125",
             kind="compute", wrong_why=_EPS_WHY,
             reference=2.0**-7, wrong=2.0**-8),
    Exercise("01.e4m3-overflow",
             "Predict, then run: what does torch give for 500.0 cast to torch.float8_e4m3fn (and back to float)?",
             _grade_e4m3_overflow,
             "Look at which special values E4M3FN has patterns for, and which it does not.",
             method="E4M3FN's largest finite value is 448 and it has no inf. A value more than half an ulp beyond "
                    "it (past 464) cannot round to a neighbour: the library must choose saturation or NaN. Which one does torch "
                    "choose (section 6 of this notebook tells after the measurement)?",
             solution="prediction = 448.0: torch saturates E4M3FN overflows (even inf) to ±448; ml_dtypes gives NaN.",
             kind="predict", wrong_why=_SAT_INF_WHY,
             reference=(448.0, 448.0), wrong=(math.inf, 448.0),
             measure=_measure_e4m3_overflow),
]
