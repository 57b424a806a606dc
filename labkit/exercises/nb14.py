"""Exercises of notebook 14 (platform and toolchain).

The graders compute their answers with :mod:`labkit.toolchain` and :mod:`labkit.lifecycle`, the same functions the
notebook uses. Introduced in notebook 14.
"""

from __future__ import annotations

import math
from typing import Any

from labkit.exercises._core import Exercise, FormatSlip
from labkit.exercises._graders import NOT_A_PAIR, number, pair
from labkit.i18n import N_
from labkit.i18n import gettext as _
from labkit.lifecycle import young_interval
from labkit.toolchain import amdahl, ib_timeout_seconds

__all__ = ["AMDAHL", "EXERCISES", "FORMATS", "YOUNG", "hilbert_system"]

# ---- 14.solve-precision: predict, then run ----------------------------------------------------------
#: The formats the notebook solves the Hilbert system in.
FORMATS = ("fp64", "fp32", "bf16")
_SOLVE_WHY = N_("The residual of the fp32 solve is tiny, yet its answer is wrong in every digit. An ill-conditioned "
                 "system amplifies rounding errors by its condition number: about 1.5e10 for Hilbert(8). FP32 keeps "
                 "about 7 significant digits, so 7 - 10 < 0 are left; FP64's 16 leave about 6. BF16 (3 digits) has "
                 "no chance.")


def _as_formats(value: Any) -> set[str] | None:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple, set, frozenset)) or not all(isinstance(v, str) for v in value):
        return None
    out = {v.strip().lower() for v in value}
    return out if out <= set(FORMATS) else None


def _grade_solve(answer: object) -> tuple[bool, str]:
    got = pair(answer)
    if got is None:
        return False, NOT_A_PAIR
    pred, result = _as_formats(got[0]), _as_formats(got[1])
    if pred is None:
        return False, FormatSlip(_("Predict a set of format names from {formats}, e.g. {{'fp32', 'bf16'}}.").format(
            formats=list(FORMATS)))
    if result is None:
        raise ValueError(_("the measured result must be a set of names from {formats}, got {value!r}").format(
            formats=FORMATS, value=got[1]))
    if pred == result:
        return True, _("Digits left ≈ digits of the format - log10(condition number): about 16 - 10 = 6 for fp64, "
                       "none for fp32 or bf16. A small residual does not mean a right answer.")
    if "fp32" in pred and "fp32" not in result:
        return False, _(_SOLVE_WHY)
    missed = ", ".join(sorted(result - pred))
    extra = ", ".join(sorted(pred - result))
    if missed and extra:
        return False, _("Measured: {missed} did reach 1e-3; {extra} did not. Compare each format's digits with log10 "
                        "of the condition number.").format(missed=missed, extra=extra)
    if missed:
        return False, _("Measured: {missed} did reach 1e-3. Compare each format's digits with log10 of the condition "
                        "number.").format(missed=missed)
    return False, _("Measured: {extra} did not. Compare each format's digits with log10 of the condition "
                    "number.").format(extra=extra)


# ---- 14.amdahl -----------------------------------------------------------------------------------------
#: The step of the exercise: the matmuls' share of the step time, and how much faster they get.
AMDAHL = {"matmul_share": 0.6, "matmul_speedup": 4.0}
_AMDAHL_WHY = N_("4x is what the matmuls get, not the step: the other 40 % of the step runs exactly as before and now "
                  "dominates, so the whole step gains much less.")

# ---- 14.young ------------------------------------------------------------------------------------------
#: The run of the exercise: seconds one checkpoint write stalls training, and the job's mean time between failures.
YOUNG = {"checkpoint_s": 90.0, "mtbf_s": 12 * 3600.0}
_YOUNG_MIN = young_interval(YOUNG["checkpoint_s"], YOUNG["mtbf_s"]) / 60
_YOUNG_WHY = N_("sqrt(C × MTBF) forgets the 2: the interval balances the writing time against the work lost at a "
                 "failure, which is half an interval on average, and that half puts a 2 under the root.")

# ---- 14.ib-timeout -------------------------------------------------------------------------------------
_IB_WHY = N_("NCCL_IB_TIMEOUT is not in seconds: it is an exponent, from which InfiniBand computes its ACK timeout "
              "(and NCCL retries 7 times by default).")


def hilbert_system(n: int = 8) -> tuple[Any, Any, dict[str, tuple[Any, Any]]]:
    """The system Hilbert(n) x = b whose solution is all ones: ``(H, x_true, solves)``, ``solves`` holding the data
    (matrix, right-hand side) in fp64, in fp32, and rounded to bf16 then held in fp32 (torch has no bf16 solver).

    For the data helpers of notebook 14 (14.solve-precision). Raises ``TypeError``/``ValueError`` for an ``n``
    that is not an int >= 1. Introduced in notebook 14.
    """
    import torch

    if isinstance(n, bool) or not isinstance(n, int):
        raise TypeError(f"n must be an int, got {type(n).__name__}")
    if not 1 <= n <= 64:
        raise ValueError(f"n must be between 1 and 64 (a Hilbert matrix is singular in fp64 beyond ~13), got {n}")
    i = torch.arange(n, dtype=torch.float64)
    h = 1.0 / (i[:, None] + i[None, :] + 1)
    x_true = torch.ones(n, dtype=torch.float64)
    b = h @ x_true
    solves = {"fp64": (h, b), "fp32": (h.float(), b.float()), "bf16": (h.bfloat16().float(), b.bfloat16().float())}
    return h, x_true, solves


def _measure_solve_precision() -> set[str]:
    """The formats whose solve of Hilbert(8) x = b comes within 1e-3 relative error (the experiment of
    14.solve-precision)."""
    import torch

    _, x_true, solves = hilbert_system(8)
    err = {name: ((torch.linalg.solve(a, rhs).double() - x_true).norm() / x_true.norm()).item()
           for name, (a, rhs) in solves.items()}
    return {k for k, v in err.items() if v < 1e-3}


EXERCISES = [
    Exercise("14.solve-precision",
             "Predict, then run: which of fp64, fp32 and bf16 solve the 8x8 Hilbert system to a relative error "
             "below 1e-3?",
             _grade_solve,
             "Look up how ill-conditioned a Hilbert matrix is, and how many digits each format keeps.",
             method="Rounding errors in a solve are amplified by about the condition number: the digits left are "
                    "roughly the format's significant digits (fp64 ~16, fp32 ~7, bf16 ~3) minus log10(cond).",
             solution="prediction = {'fp64'}: cond(Hilbert(8)) ≈ 1.5e10, so fp64 keeps ~6 digits, fp32 and bf16 "
                      "none (their residuals can still look small).",
             kind="predict", wrong_why=_SOLVE_WHY,
             reference=({"fp64"}, {"fp64"}), wrong=({"fp64", "fp32"}, {"fp64"}),
             measure=_measure_solve_precision),
    Exercise("14.amdahl",
             "The whole step's speed-up when the matmuls (60 % of the step) get 4 times faster.",
             number(amdahl(AMDAHL["matmul_share"], AMDAHL["matmul_speedup"]), N_("the speed-up"),
                    {4.0: _AMDAHL_WHY, 0.6 * 4.0: _AMDAHL_WHY}, rel=1e-3),
             "Split the step into the part that gets faster and the part that does not.",
             method="New step time = (1 - share) + share / speedup, in units of the old step; the speed-up is its "
                    "inverse (Amdahl's law).",
             solution="answer = 1 / (0.4 + 0.6 / 4) = 1 / 0.55 ≈ 1.82: the untouched 40 % now takes most of the "
                      "step.",
             kind="compute", wrong_why=_AMDAHL_WHY,
             reference=1 / 0.55, wrong=4.0),
    Exercise("14.young",
             "Young's checkpoint interval, in minutes, for a 90 s checkpoint write and a 12-hour MTBF.",
             number(_YOUNG_MIN, N_("the interval in minutes"), {math.sqrt(90 * 43200) / 60: _YOUNG_WHY}, rel=1e-2),
             "Writing too often wastes time writing; too rarely wastes the work lost at a failure. Balance the two.",
             method="Young's rule: interval = sqrt(2 × write time × MTBF), everything in seconds; divide by 60.",
             solution="answer = (2 * 90 * 43200) ** 0.5 / 60 ≈ 46.5 minutes.",
             kind="compute", wrong_why=_YOUNG_WHY,
             reference=_YOUNG_MIN, wrong=math.sqrt(90 * 43200) / 60),
    Exercise("14.ib-timeout",
             "The seconds one InfiniBand retry waits with the article's NCCL_IB_TIMEOUT=22.",
             number(ib_timeout_seconds(22), N_("the timeout in seconds"), {22.0: _IB_WHY}, rel=1e-3),
             "The value is not a number of seconds.",
             method="It is an exponent: the InfiniBand local ACK timeout is 4.096 µs × 2^value.",
             solution="answer = 4.096e-6 * 2**22 ≈ 17.2 s per attempt (NCCL's default, 20, gives ~4.3 s).",
             kind="compute", wrong_why=_IB_WHY,
             reference=ib_timeout_seconds(22), wrong=22.0),
]
