"""Exercises of notebook 07 (profiling, fusion, roofline). Introduced in notebook 07."""

from __future__ import annotations

import math
import random

from labkit import roofline as R
from labkit.exercises._core import Exercise, FormatSlip
from labkit.exercises._graders import NOT_A_PAIR, pair
from labkit.i18n import N_
from labkit.i18n import gettext as _

__all__ = ["DGX_A100", "EXERCISES", "H100_BANDWIDTH", "H100_BF16_FLOPS", "PROFILE_TABLE"]

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


def _number(want: float, what: str, rel: float = 1e-6, mistakes: dict[float, str] | None = None):
    def grade(answer: object) -> tuple[bool, str]:
        if isinstance(answer, bool):
            return False, FormatSlip(_("Give {what} as a number, not a bool.").format(what=_(what)))
        try:
            got = float(answer)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            return False, FormatSlip(_("Give {what} as a number.").format(what=_(what)))
        if math.isfinite(got) and abs(got - want) <= rel * abs(want):
            return True, ""
        for value, why in (mistakes or {}).items():
            if math.isclose(got, value, rel_tol=1e-9):
                return False, _(why)
        if math.isfinite(got) and want and abs(got - 1 / want) <= rel / abs(want):
            return False, _("That is the inverse: intensity is FLOPs divided by bytes.")
        return False, ""
    return grade


# The typical mistakes' explanations name the mistake, not the answer (the worked solution, the last help, does).
_AXPY_WHY = N_("2/8 counts reading x and y but not writing y back: y = a*x + y stores its result too, and those "
                "bytes cross the memory bus as well.")
_MATMUL_WHY = N_("You count reading A and B but not writing C: the m × n result is stored once too, and for a thin "
                  "matmul the output is a large share of the bytes.")


def _grade_matmul_intensity(fn: object) -> tuple[bool, str] | None:
    if not callable(fn):
        return False, FormatSlip(_("Give a function intensity(m, n, k, bytes_per_element) -> FLOP per byte."))
    rng = random.Random(7)
    cases = [(1024, 1024, 1024, 4), (4096, 1, 4096, 2), (1, 1, 1, 8)]
    cases += [(rng.randint(1, 3000), rng.randint(1, 3000), rng.randint(1, 3000), rng.choice((1, 2, 4)))
              for _unused in range(20)]
    for m, n, k, b in cases:
        want = R.matmul_cost(m, n, k, b).intensity
        got = fn(m, n, k, b)
        if got is None or got is Ellipsis:
            return None  # still a stub: "not attempted yet"
        if not (isinstance(got, (int, float)) and math.isclose(float(got), want, rel_tol=1e-9)):
            if isinstance(got, (int, float)) and math.isclose(float(got), _forgot_output_intensity(m, n, k, b)):
                return False, _(_MATMUL_WHY)
            return False, _("for m={m}, n={n}, k={k}, {bytes} bytes/element, expected {want:.6g}, got {got!r}.").format(
                m=m, n=n, k=k, bytes=b, want=want, got=got)
    return True, ""


def _reference_intensity(m: int, n: int, k: int, bytes_per_element: int) -> float:
    return 2 * m * n * k / ((m * k + k * n + m * n) * bytes_per_element)


def _forgot_output_intensity(m: int, n: int, k: int, bytes_per_element: int) -> float:
    return 2 * m * n * k / ((m * k + k * n) * bytes_per_element)


_FIRST_WHY = N_("aten::linear has the largest *total* time, but its self time is 0.6 ms: nearly all of it is spent "
                 "in an op it calls. Total time counts the children again; rank by self time.")
_OPS80_WHY = N_("12 is every op in the table. Sort by self time, largest first, and stop as soon as the running sum "
                "reaches 80 % of the total: a handful of ops, which is the point of profiling.")
_BOUND_WHY = N_("A matmul is not always compute-bound. With 8 rows, (8, 8192) @ (8192, 8192) reads the whole 128 MiB "
                "weight matrix to do 2·8·8192² FLOPs: about 8 FLOP/byte, far below the H100's ridge point of ~295. "
                "Decoding with a small batch is memory-bound.")


def _top_self_op() -> str:
    return max(PROFILE_TABLE, key=lambda r: r[1])[0]


def _grade_first(answer: object) -> tuple[bool, str]:
    if not isinstance(answer, str):
        return False, FormatSlip(_("Give the op's name as a string, e.g. 'aten::gelu'."))
    if answer == _top_self_op():
        return True, _("It has the largest self time, about a third of the step.")
    if answer == "aten::linear":
        return False, _(_FIRST_WHY)
    if answer == "Optimizer.step#AdamW.step":
        return False, _("That op has a large total time, but almost all of it is spent in ops it calls.")
    return False, ""


def _ops_for_80() -> int:
    total = sum(r[1] for r in PROFILE_TABLE)
    acc, n = 0.0, 0
    for _op, self_ms, _total_ms, _calls in sorted(PROFILE_TABLE, key=lambda r: -r[1]):
        acc += self_ms
        n += 1
        if acc >= 0.8 * total:
            return n
    return n


def _grade_bound(answer: object) -> tuple[bool, str]:
    if not (isinstance(answer, (tuple, list)) and len(answer) == 3 and all(isinstance(a, str) for a in answer)):
        return False, FormatSlip(_("Give three strings, each 'memory' or 'compute'."))
    ops = (R.matmul_cost(8192, 8192, 8192, "bf16"), R.softmax_cost(8192, 8192, "bf16"),
           R.matmul_cost(8, 8192, 8192, "bf16"))
    want = tuple(R.bound(c.intensity, H100_BF16_FLOPS, H100_BANDWIDTH) for c in ops)
    got = tuple(a.strip().lower() for a in answer)
    if got == want:
        return True, _("The ridge point is {ridge:.0f} FLOP/byte.").format(
            ridge=R.ridge_point(H100_BF16_FLOPS, H100_BANDWIDTH))
    wrong = [i for i, (g, w) in enumerate(zip(got, want)) if g != w]
    if wrong == [2]:
        return False, _(_BOUND_WHY)
    return False, _("Look again at item(s) {items}.").format(items=", ".join(str(i + 1) for i in wrong))


# ---- 07.peak-formula: theoretical peak = devices x units x clock x FLOPs per unit per cycle ---------------
#: A DGX A100 node as NVIDIA's A100 whitepaper ("NVIDIA A100 Tensor Core GPU Architecture") describes its GPUs: 8 A100
#: SXM GPUs, each with 108 SMs at a boost clock of 1410 MHz; the four tensor cores of an SM together deliver 1024 dense
#: FP16 FMA operations per clock (2048 with 2:4 sparsity). One GPU: 312 TFLOP/s dense FP16 on the datasheet.
DGX_A100 = {"gpus": 8, "sms_per_gpu": 108, "boost_clock_mhz": 1410, "dense_fp16_fma_per_sm_per_clock": 1024}


def _dgx_peak() -> float:
    d = DGX_A100
    return float(d["gpus"] * d["sms_per_gpu"] * d["boost_clock_mhz"] * 1e6 * d["dense_fp16_fma_per_sm_per_clock"] * 2)


_FMA_WHY = N_("You counted FMA operations, not FLOPs. A fused multiply-add is a multiply and an add: two "
               "floating-point operations, and FLOP/s counts both.")
_SPARSE_WHY = N_("That is the sparse figure. NVIDIA's headline number for the node assumes 2:4 structured sparsity, "
                 "which skips half the multiplications of a specially pruned matrix and counts them anyway; dense "
                 "training matmuls get the dense rate.")
_ONE_GPU_WHY = N_("That is one GPU: the formula also multiplies by the number of devices, and the node has several.")
_UNITS_WHY = N_("The units are mixed: the answer is off by a power of 1000. Convert the clock from MHz to Hz (cycles "
                "per second) and give the answer in FLOP/s, not TFLOP/s or PFLOP/s.")


def _grade_peak(answer: object) -> tuple[bool, str]:
    if isinstance(answer, bool):
        return False, FormatSlip(_("Give the peak as a number of FLOP/s, not a bool."))
    try:
        got = float(answer)  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError):
        return False, FormatSlip(_("Give the peak as a number of FLOP/s."))
    if not math.isfinite(got) or got <= 0:
        return False, _("A peak is a positive, finite number of FLOP/s.")
    want = _dgx_peak()
    if math.isclose(got, want, rel_tol=1e-2):
        return True, _("The node's dense FP16 tensor-core peak, about 2.5 PFLOP/s. Real training reaches a part of "
                       "it (MFU, section 6), and FP32 without tensor cores has a far lower peak.")
    ratio = got / want
    for factor, why in ((0.5, _FMA_WHY), (2.0, _SPARSE_WHY), (1 / 8, _ONE_GPU_WHY), (1 / 16, _ONE_GPU_WHY)):
        if math.isclose(ratio, factor, rel_tol=1e-2):
            return False, _(why)
    for factor in (0.5, 1.0, 2.0):
        for k in (-6, -5, -4, -3, -2, -1, 1, 2):
            if math.isclose(ratio, factor * 1000.0**k, rel_tol=1e-2):
                return False, _(_UNITS_WHY)
    return False, ""


# ---- 07.launch-overhead: predict, then run ---------------------------------------------------------
_RACE = ("one big add", "2000 tiny adds", "about the same")
_RACE_WHY = N_("Same arithmetic, not the same cost: every op pays a fixed overhead (Python, PyTorch's dispatcher, on "
                "a GPU the kernel launch) of microseconds before any work, and 64 elements are nanoseconds of work. "
                "2000 ops pay that overhead 2000 times; one op pays it once.")


def _grade_race(answer: object) -> tuple[bool, str]:
    got = pair(answer)
    if got is None:
        return False, NOT_A_PAIR
    pred, result = got
    pred = pred.strip().lower() if isinstance(pred, str) else pred
    if pred not in _RACE:
        return False, FormatSlip(_("Predict one of {choices}.").format(choices=list(_RACE)))
    if result not in _RACE:
        raise ValueError(_("the measured winner must be one of {choices}, got {result!r}").format(choices=_RACE,
                                                                                                 result=result))
    if pred == result == "one big add":
        return True, _("Per-op overhead dwarfs 64 elements of work: that is why small models are slow out of "
                       "proportion, and why fused optimizers and CUDA graphs exist.")
    if pred == result:
        return True, _("Your prediction matches what this machine measured.")
    if result == "one big add":
        return False, _(_RACE_WHY)
    return False, _("This machine measured {result!r}, which is unusual: rerun the measurement (another program "
                    "may have been running) before you trust it.").format(result=result)


def _measure_race() -> str:
    """The race of 07.launch-overhead, run again on the notebook's device: 2000 adds of 64 elements against one of
    128 000 (``profiling.launch_overhead``); more than 2x either way names the winner (the notebook's rule)."""
    from labkit import device as dev_gate
    from labkit import profiling as P

    ratio = P.launch_overhead(n_ops=2000, size=64, device=dev_gate.pick_device())["ratio"]
    return "one big add" if ratio > 2 else "2000 tiny adds" if ratio < 0.5 else "about the same"


EXERCISES = [
    Exercise("07.axpy-intensity",
             "The arithmetic intensity (FLOP/byte) of y = a * x + y on fp32 vectors (a is a scalar).",
             _number(2 / 12, N_("the intensity"), mistakes={2 / 8: _AXPY_WHY}),
             "Count, per element, the arithmetic it does and every byte it moves, both ways.",
             method="Intensity = FLOPs / bytes moved. Per element: how many multiplies and adds; which fp32 values "
                    "are read from memory and which are written back?",
             solution="2 FLOPs (a multiply and an add) over 12 bytes (read x, read y, write y, 4 bytes each) = 2/12",
             kind="compute", wrong_why=_AXPY_WHY,
             reference=2 / 12, wrong=2 / 8),
    Exercise("07.matmul-intensity",
             "Write intensity(m, n, k, bytes_per_element) for (m, k) @ (k, n), reading A and B and writing C once.",
             _grade_matmul_intensity,
             "Count the multiply-adds of the product, and every matrix that crosses the memory bus once.",
             method="Each of the m·n outputs is a sum of k products: a multiply and an add each. A (m×k) and B (k×n) "
                    "are read once and C (m×n) is written once, each element bytes_per_element bytes.",
             solution="return 2 * m * n * k / ((m * k + k * n + m * n) * bytes_per_element)",
             kind="implement", wrong_why=_MATMUL_WHY,
             reference=_reference_intensity, wrong=_forgot_output_intensity),
    Exercise("07.optimise-first",
             "From PROFILE_TABLE, the name of the op to optimise first.",
             _grade_first,
             "Two time columns: which one says where the time is really spent inside an op?",
             method="Total time includes the ops an op calls, so parents look expensive twice; self time does not. "
                    "Rank by self time and take the top.",
             solution="max(PROFILE_TABLE, key=lambda r: r[1])[0] = 'aten::addmm' (27.4 ms self, a third of the step)",
             kind="compute", wrong_why=_FIRST_WHY,
             reference=_top_self_op(), wrong="aten::linear"),
    Exercise("07.ops-for-80",
             "From PROFILE_TABLE, how many ops (largest self time first) it takes to cover 80 % of the total self time.",
             _number(float(_ops_for_80()), N_("the count"), mistakes={float(len(PROFILE_TABLE)): _OPS80_WHY}),
             "Work with self times only, and go from the largest down.",
             method="Add up all the self times, sort them largest first, and count until the running sum reaches "
                    "80 % of the total.",
             solution="total 76.6 ms, 80 % = 61.3 ms: 27.4 + 12.9 + 9.8 + 7.6 + 6.9 = 64.6 ms, so 5 ops",
             kind="compute", wrong_why=_OPS80_WHY,
             reference=_ops_for_80(), wrong=len(PROFILE_TABLE)),
    Exercise("07.bound",
             "On an H100 (H100_BF16_FLOPS, H100_BANDWIDTH), say 'memory' or 'compute' for: a bf16 8192^3 matmul, "
             "a bf16 softmax over 8192 x 8192, and a bf16 (8, 8192) @ (8192, 8192) matmul.",
             _grade_bound,
             "Compare each op's FLOPs per byte with what the machine can do per byte.",
             method="The ridge point is H100_BF16_FLOPS / H100_BANDWIDTH (~295 FLOP/byte). An op whose intensity "
                    "(R.matmul_cost / R.softmax_cost) lies below it is memory-bound, above it compute-bound.",
             solution="('compute', 'memory', 'memory'): ~2730, ~1.3 and ~8 FLOP/byte against a ridge of ~295",
             kind="compute", wrong_why=_BOUND_WHY,
             reference=("compute", "memory", "memory"), wrong=("compute", "memory", "compute")),
    Exercise("07.peak-formula",
             "The theoretical dense FP16 peak of a DGX A100 node, in FLOP/s: 8 A100 GPUs, 108 SMs each, boost clock "
             "1410 MHz, 1024 dense FP16 FMA operations per SM per clock (DGX_A100).",
             _grade_peak,
             "Multiply every factor of the formula, each in base units: devices, units per device, cycles per second, "
             "and floating-point operations per unit per cycle.",
             method="Theoretical peak = devices × units per device × clock × FLOPs per unit per cycle. Put the clock in "
                    "Hz (cycles per second), count each FMA as the FLOPs it performs, and use the dense rate: the "
                    "sparse one assumes a pruned matrix.",
             solution="8 × 108 × 1.41e9 × (1024 × 2) = 2.495e15 FLOP/s, about 2.5 PFLOP/s (one GPU: 312 TFLOP/s, the "
                      "datasheet's dense FP16 figure; NVIDIA's 5 PFLOPS for the node is the 2:4-sparse one)",
             kind="compute", wrong_why=_FMA_WHY,
             reference=_dgx_peak(), wrong=_dgx_peak() / 2),
    Exercise("07.launch-overhead",
             "Predict, then run: 2000 adds of 64 elements, or one add of 128 000 elements (the same arithmetic): "
             "'one big add', '2000 tiny adds' or 'about the same' finishes first?",
             _grade_race,
             "Think about what an op costs before it touches its first element.",
             method="Every op pays a fixed cost: Python, PyTorch's dispatcher, on a GPU the kernel launch, a few µs. "
                    "Compare that with the time to add 64 numbers (nanoseconds).",
             solution="prediction = 'one big add': the overhead is paid 2000 times by the tiny adds, once by the big "
                      "one (here tens to hundreds of times slower).",
             kind="predict", wrong_why=_RACE_WHY,
             reference=("one big add", "one big add"), wrong=("about the same", "one big add"),
             measure=_measure_race),
]
