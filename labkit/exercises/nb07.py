"""Exercises of notebook 07 (profiling, fusion, roofline). Introduced in notebook 07."""

from __future__ import annotations

import math
import random

from labkit import roofline as R
from labkit.exercises._core import Exercise

__all__ = ["EXERCISES", "H100_BANDWIDTH", "H100_BF16_FLOPS", "PROFILE_TABLE"]

#: A profile of a transformer training step as key_averages reports it: (op, self ms, total ms, calls).
#: Total time includes the ops an op calls; self time does not.
PROFILE_TABLE: tuple[tuple[str, float, float, int], ...] = (
    ("aten::linear", 0.6, 41.8, 48),
    ("aten::addmm", 27.4, 28.1, 36),
    ("aten::_softmax", 12.9, 12.9, 8),
    ("Optimizer.step#AdamW.step", 1.1, 24.0, 1),
    ("aten::_foreach_mul_", 9.8, 9.8, 4),
    ("aten::native_layer_norm", 7.6, 7.6, 16),
    ("aten::mm", 6.9, 6.9, 12),
    ("aten::copy_", 4.2, 4.2, 60),
    ("aten::mul", 2.3, 2.3, 40),
    ("aten::add", 1.8, 1.8, 40),
    ("aten::gelu", 1.6, 1.6, 8),
    ("aten::view", 0.4, 0.4, 120),
)

#: Datasheet figures of an H100 SXM (dense bf16 tensor-core FLOP/s and HBM3 bandwidth), for exercise 07.bound.
H100_BF16_FLOPS = 989e12
H100_BANDWIDTH = 3.35e12


def _number(want: float, what: str, rel: float = 1e-6):
    def grade(answer: object) -> tuple[bool, str]:
        if isinstance(answer, bool):
            return False, f"Give {what} as a number, not a bool."
        try:
            got = float(answer)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            return False, f"Give {what} as a number."
        if math.isfinite(got) and abs(got - want) <= rel * abs(want):
            return True, ""
        if math.isfinite(got) and want and abs(got - 1 / want) <= rel / abs(want):
            return False, "That is the inverse: intensity is FLOPs divided by bytes."
        return False, ""
    return grade


def _grade_matmul_intensity(fn: object) -> tuple[bool, str] | None:
    if not callable(fn):
        return False, "Give a function intensity(m, n, k, bytes_per_element) -> FLOP per byte."
    rng = random.Random(7)
    cases = [(1024, 1024, 1024, 4), (4096, 1, 4096, 2), (1, 1, 1, 8)]
    cases += [(rng.randint(1, 3000), rng.randint(1, 3000), rng.randint(1, 3000), rng.choice((1, 2, 4)))
              for _ in range(20)]
    for m, n, k, b in cases:
        want = R.matmul_cost(m, n, k, b).intensity
        got = fn(m, n, k, b)
        if got is None or got is Ellipsis:
            return None  # still a stub: "not attempted yet"
        if not (isinstance(got, (int, float)) and math.isclose(float(got), want, rel_tol=1e-9)):
            return False, f"for m={m}, n={n}, k={k}, {b} bytes/element, expected {want:.6g}, got {got!r}."
    return True, ""


def _reference_intensity(m: int, n: int, k: int, bytes_per_element: int) -> float:
    return 2 * m * n * k / ((m * k + k * n + m * n) * bytes_per_element)


def _forgot_output_intensity(m: int, n: int, k: int, bytes_per_element: int) -> float:
    return 2 * m * n * k / ((m * k + k * n) * bytes_per_element)


def _top_self_op() -> str:
    return max(PROFILE_TABLE, key=lambda r: r[1])[0]


def _grade_first(answer: object) -> tuple[bool, str]:
    if not isinstance(answer, str):
        return False, "Give the op's name as a string, e.g. 'aten::gelu'."
    if answer == _top_self_op():
        return True, "It has the largest self time, about a third of the step."
    if answer in ("aten::linear", "Optimizer.step#AdamW.step"):
        return False, "That op has a large total time, but almost all of it is spent in ops it calls."
    return False, ""


def _ops_for_80() -> int:
    total = sum(r[1] for r in PROFILE_TABLE)
    acc, n = 0.0, 0
    for _, self_ms, _, _ in sorted(PROFILE_TABLE, key=lambda r: -r[1]):
        acc += self_ms
        n += 1
        if acc >= 0.8 * total:
            return n
    return n


def _grade_bound(answer: object) -> tuple[bool, str]:
    if not (isinstance(answer, (tuple, list)) and len(answer) == 3 and all(isinstance(a, str) for a in answer)):
        return False, "Give three strings, each 'memory' or 'compute'."
    ops = (R.matmul_cost(8192, 8192, 8192, "bf16"), R.softmax_cost(8192, 8192, "bf16"),
           R.matmul_cost(8, 8192, 8192, "bf16"))
    want = tuple(R.bound(c.intensity, H100_BF16_FLOPS, H100_BANDWIDTH) for c in ops)
    got = tuple(a.strip().lower() for a in answer)
    if got == want:
        return True, f"The ridge point is {R.ridge_point(H100_BF16_FLOPS, H100_BANDWIDTH):.0f} FLOP/byte."
    wrong = [i for i, (g, w) in enumerate(zip(got, want)) if g != w]
    return False, f"Look again at item(s) {', '.join(str(i + 1) for i in wrong)}."


EXERCISES = [
    Exercise("07.axpy-intensity",
             "The arithmetic intensity (FLOP/byte) of y = a * x + y on fp32 vectors (a is a scalar).",
             _number(2 / 12, "the intensity"),
             "Per element: one multiply and one add (2 FLOPs); read x and y, write y (3 x 4 bytes).",
             reference=2 / 12, wrong=2 / 8),
    Exercise("07.matmul-intensity",
             "Write intensity(m, n, k, bytes_per_element) for (m, k) @ (k, n), reading A and B and writing C once.",
             _grade_matmul_intensity,
             "FLOPs: 2*m*n*k (a multiply and an add per term). Bytes: (m*k + k*n + m*n) * bytes_per_element.",
             reference=_reference_intensity, wrong=_forgot_output_intensity),
    Exercise("07.optimise-first",
             "From PROFILE_TABLE, the name of the op to optimise first.",
             _grade_first,
             "Sort by *self* time: total time counts the children again (aten::linear calls aten::addmm).",
             reference=_top_self_op(), wrong="aten::linear"),
    Exercise("07.ops-for-80",
             "From PROFILE_TABLE, how many ops (largest self time first) it takes to cover 80 % of the total self time.",
             _number(float(_ops_for_80()), "the count"),
             "Add up all the self times, sort them largest first, and count until the running sum reaches 80 %.",
             reference=_ops_for_80(), wrong=len(PROFILE_TABLE)),
    Exercise("07.bound",
             "On an H100 (H100_BF16_FLOPS, H100_BANDWIDTH), say 'memory' or 'compute' for: a bf16 8192^3 matmul, "
             "a bf16 softmax over 8192 x 8192, and a bf16 (8, 8192) @ (8192, 8192) matmul.",
             _grade_bound,
             "Compute each op's intensity and compare it with the ridge point H100_BF16_FLOPS / H100_BANDWIDTH.",
             reference=("compute", "memory", "memory"), wrong=("compute", "memory", "compute")),
]
