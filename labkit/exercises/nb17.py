"""Exercises of notebook 17 (the low-precision frontier: FP8 scaling, MX and NVFP4). Introduced in notebook 17."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

from labkit import microscaling
from labkit.exercises._core import Described, Exercise, FormatSlip, whole
from labkit.exercises._graders import NOT_A_PAIR, as_number, pair
from labkit.i18n import N_
from labkit.i18n import gettext as _

__all__ = ["EXERCISES", "RECIPE_CHOICES", "SITUATIONS", "exercise_blocks", "round_to"]

#: Exercise 17.recipe: situation -> description (the learner sees these and picks from RECIPE_CHOICES).
SITUATIONS: Mapping[str, str] = Described({
    "a100": N_("Pretraining a transformer on A100s (Ampere)."),
    "l40s": N_("Fine-tuning on L40S GPUs (Ada), whose matmuls are large enough for FP8 to pay."),
    "h100-simple": N_("Fine-tuning on H100s; the activations have no outliers and you want the simplest FP8 recipe."),
    "h100-outliers": N_("Pretraining on H100s; outlier channels in the activations make one scale per tensor or per "
                        "row too coarse."),
    "b200-fp8": N_("Pretraining on B200s in 8 bits, with block scales that the tensor cores apply themselves."),
    "b200-fp4": N_("Pretraining on B200s where the highest matmul throughput matters most."),
})
_ANSWERS: dict[str, str] = {"a100": "bf16", "l40s": "fp8-tensor", "h100-simple": "fp8-tensor",
                            "h100-outliers": "fp8-blockwise", "b200-fp8": "mxfp8", "b200-fp4": "nvfp4"}
#: The names the learner may use.
RECIPE_CHOICES: tuple[str, ...] = ("bf16", "fp8-tensor", "fp8-blockwise", "mxfp8", "nvfp4")
_WHY = {
    "a100": N_("an A100 has no FP8 tensor cores: bf16."),
    "l40s": N_("Ada has FP8 tensor cores with per-tensor scales, and no block scales."),
    "h100-simple": N_("per-tensor current scaling is torchao's default and the simplest FP8 recipe on Hopper."),
    "h100-outliers": N_("1 x 128 / 128 x 128 blocks with FP32 scales confine an outlier; Hopper's tensor cores do not "
                        "apply block scales, so the kernels do (DeepSeek-V3, with FP32 promotion)."),
    "b200-fp8": N_("Blackwell's tensor cores apply MX block scales themselves: MXFP8."),
    "b200-fp4": N_("NVFP4, the 4-bit format with the finer blocks and the E4M3 scales, and its recipe's tricks."),
}
_RECIPE_WHY = N_("MX on a Hopper GPU: the H100's tensor cores multiply FP8 but know nothing of E8M0 block scales; "
                 "MX (and NVFP4) run natively only on Blackwell. On Hopper, finer scales are applied by the kernel "
                 "around the tensor-core instruction, with FP32 scales per block.")


def _grade_recipe(answer: object) -> tuple[bool, str]:
    if not isinstance(answer, dict):
        return False, FormatSlip(_("Give a dict {situation: recipe}, with a key for every entry of SITUATIONS."))
    missing = [k for k in SITUATIONS if k not in answer]
    if missing:
        return False, _("Missing situations: {missing}.").format(missing=missing)
    wrong = []
    for k, want in _ANSWERS.items():
        v = answer[k]
        name = v.strip().lower() if isinstance(v, str) else v
        if name not in RECIPE_CHOICES:
            return False, FormatSlip(_("{situation}: {recipe!r} is not one of {choices}.").format(
                situation=k, recipe=v, choices=RECIPE_CHOICES))
        if name != want:
            wrong.append((k, name))
    if any(k in ("h100-outliers", "h100-simple", "l40s") and v in ("mxfp8", "nvfp4") for k, v in wrong):
        return False, _(_RECIPE_WHY)
    if wrong:
        return False, _("Reconsider: {situations}.").format(situations=", ".join(k for k, _name in wrong))
    return True, " ".join(_(why) for why in _WHY.values())


#: The two blocks' amaxes: 1.84 x 2^-3 (a mantissa above E2M1's 1.5: the spec's rule and RCEIL differ) and
#: 1.03 x 2^-1 (just above a power of two: the spec's rule and floor(log2(amax / 6)) or its rounding differ).
_AMAXES = (0.23, 0.515)


def exercise_blocks(seed: int = 17) -> torch.Tensor:
    """Return the two MX blocks of exercise 17.mx-scale, one per row: shape (2, 32), float64.

    Introduced in notebook 17.
    """
    g = torch.Generator().manual_seed(whole("seed", seed, 0))
    x = torch.randn(2, 32, generator=g, dtype=torch.float64)
    return x * (torch.tensor(_AMAXES, dtype=torch.float64) / x.abs().amax(1)).unsqueeze(1)


round_to = microscaling.round_tensor  # the name the exercises use: the codec of labkit.formats on a tensor


# ---- 17.mx-scale: MXFP4 (E2M1 elements, emax 2) ----------------------------------------------------------
def _mx_scale(x: torch.Tensor, rounding: str, fmt: str = "e2m1fn") -> float:
    return 2.0 ** int(microscaling.mx_scale_exponent(x.abs().max().reshape(1), fmt, rounding))


_NO_EMAX = N_("That power of two is the block's amax rounded down, 2^floor(log2(amax)): it maps amax to about 1. The "
              "scale must bring amax up to the top of E2M1's range, so subtract E2M1's emax (the exponent of its "
              "largest value) from the exponent.")
_CEIL = N_("That is the rounded-up scale (RCEIL, the MXFP8 recipe's choice), ceil(log2(amax / max)). The OCP spec "
           "rounds the exponent down: floor(log2(amax)) minus the element format's emax. For this block the two "
           "differ, which is the point.")
_FP32 = N_("That is an FP32 scale, amax / max (or its inverse): MX stores only a power of two, the E8M0 byte. Round "
           "the exponent, not the ratio.")
_E4M3_EMAX = N_("Those are the scales for MXFP8 E4M3 (emax 8). The exercise asks for MXFP4: E2M1's largest value has "
                "a smaller exponent.")
_RATIO_FLOOR = N_("That rounds log2(amax / 6), the ratio to E2M1's largest value. The spec subtracts emax, the exponent "
                  "of the largest value, from amax's own exponent: floor first, then subtract. The two agree for some "
                  "blocks (the first one here) and not for others (the second).")


def _rules(rule: Any) -> list[float]:
    return [rule(float(b.abs().max())) for b in exercise_blocks()]


def _grade_mx_scale(answer: object) -> tuple[bool, str]:
    if isinstance(answer, torch.Tensor):
        answer = answer.tolist()
    if not isinstance(answer, (list, tuple)) or len(answer) != 2:
        return False, FormatSlip(_("Give a list of two scales, one per block (row) of exercise_blocks()."))
    got = [as_number(v) for v in answer]
    if any(v is None or isinstance(v, bool) for v in got) or any(isinstance(v, bool) for v in answer):
        return False, FormatSlip(_("Give each scale as a number, e.g. 2.0 ** -3."))
    want = [_mx_scale(b, "floor") for b in exercise_blocks()]
    if got == want:
        amax = [float(b.abs().max()) for b in exercise_blocks()]
        return True, _("amax / scale = {first:.2f} and {second:.2f}: the first lands above E2M1's 6, so under the "
                       "spec's rule that block's largest element saturates; rounded up, its scale would be twice as "
                       "large.").format(first=amax[0] / want[0], second=amax[1] / want[1])
    mistakes = (
        (_rules(lambda a: 2.0 ** math.floor(math.log2(a))), _NO_EMAX),
        ([_mx_scale(b, "rceil") for b in exercise_blocks()], _CEIL),
        ([_mx_scale(b, "floor", "e4m3fn") for b in exercise_blocks()], _E4M3_EMAX),
        (_rules(lambda a: 2.0 ** math.floor(math.log2(a / 6))), _RATIO_FLOOR),
        (_rules(lambda a: 2.0 ** round(math.log2(a / 6))), _RATIO_FLOOR),
        (_rules(lambda a: a / 6), _FP32), (_rules(lambda a: 6 / a), _FP32),
        ([1 / w for w in want], N_("Upside down: x = element x scale, so the scale is small when the values are "
                                   "small.")),
        ([math.log2(w) for w in want], N_("Those are the exponents k; the scales are the powers of two they stand "
                                          "for.")),
        ([math.log2(w) + 127 for w in want], N_("Those are the E8M0 bytes that store the scales (k + 127); give the "
                                                "scales themselves.")),
    )
    for values, why in mistakes:
        if all(g is not None and math.isclose(g, v, rel_tol=1e-9) for g, v in zip(got, values)):
            return False, _(why)
    right = [g == w for g, w in zip(got, want)]
    if any(right):
        return False, _("Block {block} is not right yet (the other one is).").format(block=right.index(False) + 1)
    return False, ""


# ---- 17.nvfp4-block --------------------------------------------------------------------------------------
_NVFP4_WHY = N_("The block scale is left in full precision: NVFP4 stores it as E4M3, so round amax / 6 / tensor_scale "
                "to E4M3 before you divide by it. Otherwise your elements fit a scale the format cannot store.")


def _reference_nvfp4_block(x: torch.Tensor, tensor_scale: float) -> torch.Tensor:
    block_scale = round_to(x.abs().max() / 6 / tensor_scale, "e4m3fn")
    return round_to(x / (block_scale * tensor_scale), "e2m1fn") * block_scale * tensor_scale


def _wrong_nvfp4_block(x: torch.Tensor, tensor_scale: float) -> torch.Tensor:
    block_scale = x.abs().max() / 6 / tensor_scale
    return round_to(x / (block_scale * tensor_scale), "e2m1fn") * block_scale * tensor_scale


def _with_scale(scale_of: Any) -> Any:
    def f(x: torch.Tensor, t: float) -> torch.Tensor:
        s = scale_of(x, t)
        return round_to(x / (s * t), "e2m1fn") * s * t
    return f


_NVFP4_MISTAKES = (
    (_with_scale(lambda x, t: round_to(x.abs().max() / 448 / t, "e4m3fn")),
     N_("The block scale maps the block's amax onto 448, E4M3's largest value: but the elements are E2M1, whose "
        "largest value is what the block's amax must land on. (448 belongs to the tensor scale, which is given.)")),
    (lambda x, t: (lambda s: round_to(x / s, "e2m1fn") * s)(round_to(x.abs().max() / 6, "e4m3fn")),
     N_("The tensor scale is missing: NVFP4's block scale is stored relative to it (amax / 6 / tensor_scale), and "
        "decoding multiplies by both.")),
)


def _grade_nvfp4_block(fn: object) -> tuple[bool, str] | None:
    if not callable(fn):
        return False, FormatSlip(_("Give the function nvfp4_block itself (no call, no parentheses)."))
    g = torch.Generator().manual_seed(2026)
    for trial in range(6):
        x = torch.randn(4, 16, generator=g, dtype=torch.float64) * 10.0 ** float(trial - 3)
        x[trial % 4, trial] *= 30.0  # an outlier in one block
        q = microscaling.nvfp4(x)
        want = q.dequantise()
        for r in range(4):
            got = fn(x[r].clone(), q.tensor_scale)
            if got is None or got is ...:
                return None
            if not isinstance(got, torch.Tensor) or tuple(got.shape) != (16,):
                return False, FormatSlip(_("Return a tensor of the block's 16 decoded values."))
            if not torch.allclose(got.double(), want[r], rtol=1e-6, atol=0):
                if torch.allclose(_wrong_nvfp4_block(x[r], q.tensor_scale), got.double(), rtol=1e-9, atol=0):
                    return False, _(_NVFP4_WHY)
                for mistake, why in _NVFP4_MISTAKES:
                    if torch.allclose(mistake(x[r], q.tensor_scale), got.double(), rtol=1e-9, atol=0):
                        return False, _(why)
                return False, _("Block with amax {amax:.3g}: expected {want}..., got {got}...").format(
                    amax=float(x[r].abs().max()), want=want[r][:4].tolist(), got=got.double()[:4].tolist())
    return True, _("Two scales, two roundings: the block scale to E4M3, the elements to E2M1, each saturating.")


# ---- 17.outlier-spread: predict, then run ---------------------------------------------------------------
_SPREAD_WHY = N_("That counts every value that shares the outlier's scale, as if a larger scale re-rounded them all. "
                 "An MX scale is a power of two: dividing by it only shifts the exponent, so a neighbour that stays in "
                 "E4M3's normal range keeps exactly its mantissa bits. Only the neighbours pushed down into the "
                 "subnormals change.")


def _grade_spread(answer: object) -> tuple[bool, str]:
    got = pair(answer)
    if got is None:
        return False, NOT_A_PAIR
    pred, result = (as_number(v) for v in got)
    if pred is None or pred < 0:
        return False, FormatSlip(_("Predict a count, a number such as 100."))
    if result is None or result < 0:
        raise ValueError(_("the measured count must be a number, got {result!r}").format(result=got[1]))
    if abs(pred - result) <= max(2.0, result / 2):
        return True, _("Measured: {result:g}. Only the outlier's own block gets a new scale, a larger power of two: "
                       "its neighbours keep their mantissas unless the shift pushes them below E4M3's smallest "
                       "normal.").format(result=result)
    if pred >= 31:
        return False, _(_SPREAD_WHY) + " " + _("(Measured: {result:g}.)").format(result=result)
    return False, _("Measured: {result:g}. Which neighbours does a larger power-of-two scale push out of E4M3's "
                    "normal range? Those are the ones that change.").format(result=result)


def _measure_spread() -> float:
    """How many other values of a seeded 384 x 256 tensor one outlier changes under MXFP8, scale rounded up (exact)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(384, 256, generator=g, dtype=torch.float64)
    spiked = x.clone()
    spiked[5, 40] = 1e4
    diff = (microscaling.mx(x, scale_rounding="rceil").dequantise()
            != microscaling.mx(spiked, scale_rounding="rceil").dequantise())
    diff[5, 40] = False
    return float(diff.sum())


EXERCISES = [
    Exercise("17.mx-scale", "The E8M0 shared scales of the two blocks of exercise_blocks() for MXFP4 (E2M1), by the "
             "OCP spec's rule.",
             _grade_mx_scale,
             "The scale is a power of two chosen from the block's largest magnitude, so that it lands at the top of "
             "the element format's range.",
             method="Take amax = x.abs().max(); its exponent is floor(log2(amax)). Write the element format's largest "
                    "value as a mantissa times 2^emax: subtract emax from amax's exponent, and the scale is 2 to "
                    "that power.",
             solution="E2M1's largest value 6 = 1.5 x 2^2, emax = 2. Block 1: amax = 0.23, floor(log2(0.23)) = -3, "
                      "k = -5, scale 2.0 ** -5 (amax / scale = 7.36 > 6: its largest element saturates; rounding up "
                      "would give 2 ** -4). Block 2: amax = 0.515, floor(log2(0.515)) = -1, k = -3, scale 2.0 ** -3. "
                      "scales = [2.0 ** -5, 2.0 ** -3]",
             kind="compute", wrong_why=_NO_EMAX,
             reference=[_mx_scale(b, "floor") for b in exercise_blocks()],
             wrong=_rules(lambda a: 2.0 ** math.floor(math.log2(a)))),
    Exercise("17.nvfp4-block", "Write nvfp4_block(x, tensor_scale): quantise 16 values to NVFP4 and decode them.",
             _grade_nvfp4_block,
             "Two scales multiply: the tensor's and the block's. Which one does the block store, in which format, "
             "and which value of E2M1 should the block's amax land on?",
             method="Divide the block's amax by E2M1's largest value and by the tensor scale, round that to E4M3: the "
                    "block scale. Divide x by block scale times tensor scale, round to E2M1 (saturating), and "
                    "multiply back by both scales.",
             solution="block_scale = round_to(x.abs().max() / 6 / tensor_scale, 'e4m3fn')\n"
                      "elements = round_to(x / (block_scale * tensor_scale), 'e2m1fn')\n"
                      "return elements * block_scale * tensor_scale",
             kind="implement", wrong_why=_NVFP4_WHY,
             reference=_reference_nvfp4_block, wrong=_wrong_nvfp4_block),
    Exercise("17.recipe", "For each entry of SITUATIONS, choose one of RECIPE_CHOICES.", _grade_recipe,
             "Ask of each: which GPU generation, and does it apply block scales in the tensor cores?",
             method="Ampere has no FP8. Ada and Hopper multiply FP8 with scales applied around the instruction (per "
                    "tensor or row by cuBLAS, finer blocks by your own kernels). Blackwell's tensor cores read MX "
                    "and NVFP4 block scales themselves.",
             solution="a100 bf16, l40s fp8-tensor, h100-simple fp8-tensor, h100-outliers fp8-blockwise, b200-fp8 "
                      "mxfp8, b200-fp4 nvfp4",
             kind="design", wrong_why=_RECIPE_WHY,
             reference=dict(_ANSWERS), wrong={**_ANSWERS, "h100-outliers": "mxfp8"}),
    Exercise("17.outlier-spread", "Predict how many other values of a Gaussian tensor one outlier changes under MXFP8.",
             _grade_spread,
             "Which values share a scale with the outlier in an MX tensor?",
             method="Find the values that share the outlier's scale (an MX block runs along the last dimension), "
                    "then ask what dividing by a larger power of two does to a number's mantissa, and when it does "
                    "something more.",
             solution="Only a few (8 here): the outlier's block gets a scale about 2^12 larger, and of its 31 neighbours only "
                      "those divided below 2^-6 (E4M3's smallest normal) lose mantissa bits; the rest are shifted "
                      "exactly. No other block's scale moves.",
             kind="predict", wrong_why=_SPREAD_WHY,
             reference=(8, 8.0), wrong=(31, 8.0), measure=_measure_spread),
]
