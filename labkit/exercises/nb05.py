"""Exercises of notebook 05 (BF16, TF32, FP8). Introduced in notebook 05."""

from __future__ import annotations

import math
import random
from collections.abc import Mapping

import torch

from labkit import fp8
from labkit.exercises._core import Described, Exercise, FormatSlip, whole
from labkit.exercises._graders import NOT_A_PAIR, as_number, pair
from labkit.i18n import N_
from labkit.i18n import gettext as _

__all__ = ["EXERCISES", "FORMAT_CHOICES", "WORKLOADS", "exercise_tensor"]


#: Exercise 05.choose-format: workload -> the format to choose (the learner sees only the keys and texts).
WORKLOADS: Mapping[str, str] = Described({
    "a100-mixed": N_("Mixed-precision training of a transformer on an A100; you want no loss-scaling code."),
    "a100-fp32-code": N_("An fp32 model whose code you may not change, on an A100; let its matmuls use tensor "
                         "cores."),
    "v100-mixed": N_("Mixed-precision training on a V100 (tensor cores for fp16 only, no bf16)."),
    "fp8-forward": N_("Activations and weights fed to the matmuls of an FP8 forward pass on an H100."),
    "fp8-backward": N_("The gradients fed to the matmuls of an FP8 backward pass."),
    "master-weights": N_("The master copy of the weights and the Adam moments that the optimizer updates."),
})
_ANSWERS: dict[str, str] = {"a100-mixed": "bf16", "a100-fp32-code": "tf32", "v100-mixed": "fp16",
                            "fp8-forward": "e4m3fn", "fp8-backward": "e5m2", "master-weights": "fp32"}
#: The names the learner may use.
FORMAT_CHOICES: tuple[str, ...] = ("fp32", "tf32", "bf16", "fp16", "e4m3fn", "e5m2")
_ALIASES = {"e4m3": "e4m3fn", "fp8_e4m3": "e4m3fn", "fp8_e5m2": "e5m2", "bfloat16": "bf16", "float16": "fp16",
            "half": "fp16", "float32": "fp32", "float": "fp32"}
_WHY = {
    "a100-mixed": N_("bf16 has fp32's exponent range, so gradients do not underflow and no GradScaler is needed."),
    "a100-fp32-code": N_("TF32 is a math mode for fp32 tensors: one flag, no code change, fp32 range."),
    "v100-mixed": N_("a V100 has fp16 tensor cores only: fp16 with loss scaling."),
    "fp8-forward": N_("the forward pass wants precision (3 mantissa bits) more than range: E4M3."),
    "fp8-backward": N_("gradients span more binades than activations: E5M2's range."),
    "master-weights": N_("small updates must not be rounded away: fp32."),
}


_CHOOSE_WHY = N_("E4M3 for the backward pass trades away the range gradients need: 18 binades against E5M2's 32. "
                 "Real gradients span more than 18 even with a per-tensor scale (section 3's table: a sizable share "
                 "still flushes to zero in E4M3), so gradients get E5M2: range over precision.")


def _grade_choose(answer: object) -> tuple[bool, str] | bool:
    if not isinstance(answer, dict):
        return False, FormatSlip(_("Give a dict {workload: format}, with a key for every entry of WORKLOADS."))
    missing = [k for k in WORKLOADS if k not in answer]
    if missing:
        return False, _("Missing workloads: {missing}.").format(missing=missing)
    wrong = []
    for k, want in _ANSWERS.items():
        v = answer[k]
        name = _ALIASES.get(str(v).strip().lower(), str(v).strip().lower()) if isinstance(v, str) else v
        if name not in FORMAT_CHOICES:
            return False, FormatSlip(_("{workload}: {value!r} is not one of {choices}.").format(
                workload=k, value=v, choices=FORMAT_CHOICES))
        if name != want:
            wrong.append((k, name))
    if wrong == [("fp8-backward", "e4m3fn")]:
        return False, _(_CHOOSE_WHY)
    if wrong:
        return False, _("Reconsider: {workloads}.").format(workloads=", ".join(k for k, _unused in wrong))
    return True, " ".join(_(why) for why in _WHY.values())


def exercise_tensor(n: int = 4096, seed: int = 5) -> torch.Tensor:
    """Return the tensor of exercise 05.fp8-scale: activations-like values with a few outliers.

    Introduced in notebook 05.
    """
    whole("n", n, 1)
    g = torch.Generator().manual_seed(whole("seed", seed, 0))
    x = torch.randn(n, generator=g) * 0.7
    x[::512] *= 40.0  # outlier features, as real activations have
    return x


_MARGIN = 1


_SCALE_WHY = N_("448 / amax is the scale with no margin: it puts amax exactly on E4M3's largest value, so a tensor "
                "that is a little larger at the next step saturates. The exercise asks for a margin of one binade: "
                "headroom between amax and E4M3's largest value.")


def _grade_scale(answer: object) -> tuple[bool, str]:
    if isinstance(answer, torch.Tensor) and answer.numel() == 1:
        answer = float(answer)
    if isinstance(answer, bool) or not isinstance(answer, (int, float)):
        return False, FormatSlip(_("Give the scale as a Python float."))
    x = exercise_tensor()
    a = fp8.amax(x)
    want = fp8.compute_scale(a, "e4m3fn", margin=_MARGIN)
    s = float(answer)
    if math.isclose(s, want, rel_tol=1e-6):
        q = fp8.quant_stats(x, "e4m3fn", s)
        return True, _("amax = {amax:.4g}; with this scale nothing saturates ({saturated:.0%}) and the error is "
                       "{error:.1%}.").format(amax=a, saturated=q.saturated, error=q.rel_error)
    if math.isclose(s, 448.0 / a, rel_tol=1e-6):
        return False, _(_SCALE_WHY)
    if math.isclose(s, a / 448.0, rel_tol=1e-3) or math.isclose(s, 2 * a / 448.0, rel_tol=1e-3):
        return False, _("Upside down: the scale multiplies the tensor so that amax lands near 448.")
    return False, _("Not the per-tensor scale: yours puts amax at {placed:.4g}, not one binade below E4M3's largest "
                    "value.").format(placed=a * s)


def _reference_delayed(history: list[float], history_len: int, fmt_max: float, margin: int) -> float:
    return fmt_max / max(history[-history_len:]) / 2.0**margin


_DELAYED_WHY = N_("You use only the most recent amax. Delayed scaling takes the maximum over the last history_len "
                  "amaxes, so that one quiet step does not set a scale that the next, larger tensor overflows.")


def _grade_delayed(fn: object) -> tuple[bool, str] | None:
    if not callable(fn):
        return False, FormatSlip(_("Define delayed_scale(amax_history, history_len, fmt_max, margin) -> float."))
    rng = random.Random(11)
    for _case in range(50):
        n = rng.randint(1, 30)
        history = [10.0 ** rng.uniform(-8, 3) for _i in range(n)]
        history_len = rng.randint(1, 20)
        fmt = rng.choice(["e4m3fn", "e5m2"])
        margin = rng.randint(0, 3)
        got = fn(list(history), history_len, fp8.fp8_max(fmt), margin)
        if got is None or got is Ellipsis:
            return None
        # the same scale labkit.fp8.DelayedScaling would use next
        ds = fp8.DelayedScaling(fmt, history_len=history_len, margin=margin)
        for a in history:
            ds.update(a)
        want = ds.scale
        if not (isinstance(got, (int, float, torch.Tensor)) and math.isclose(float(got), want, rel_tol=1e-9)):
            if isinstance(got, (int, float)) and math.isclose(float(got), _wrong_delayed(history, history_len,
                                                                                          fp8.fp8_max(fmt), margin)):
                return False, _(_DELAYED_WHY)
            last = ", ".join(f"{h:.3g}" for h in history[-5:])
            return False, _("For a history ending [{last}], history_len {history_len}, {fmt} and margin {margin} you "
                            "give {got!r}; DelayedScaling uses {want:.6g}.").format(
                last=last, history_len=history_len, fmt=fmt, margin=margin, got=got, want=want)
    return True, _("Your rule and labkit.fp8.DelayedScaling agree on 50 random histories.")


def _wrong_delayed(history: list[float], history_len: int, fmt_max: float, margin: int) -> float:
    return fmt_max / history[-1] / 2.0**margin  # "most recent", not the max of the window


# ---- 05.bf16-vs-tf32: predict, then run -------------------------------------------------------------
_RATIO_WHY = N_("TF32 and bf16 both keep fp32's 8 exponent bits, but not the same mantissa: TF32 keeps 10 bits, "
                "bf16 7. Each bit fewer doubles the rounding error of the inputs, so bf16's error is about 2^3 = 8 "
                "times TF32's. 'Reduced precision' is not one thing.")


def _grade_ratio(answer: object) -> tuple[bool, str]:
    got = pair(answer)
    if got is None:
        return False, NOT_A_PAIR
    pred, result = (as_number(v) for v in got)
    if pred is None or not pred > 0:
        return False, FormatSlip(_("Predict the ratio as a positive number, e.g. 2."))
    if result is None or not result > 0:
        raise ValueError(_("the measured ratio must be a positive number, got {value!r}").format(value=got[1]))
    if result / 1.5 <= pred <= result * 1.5:
        return True, _("Measured: {result:.1f}x. 3 mantissa bits apart (10 against 7), 2^3 = 8: the input rounding "
                       "error halves with every bit kept.").format(result=result)
    if pred < result:
        return False, _(_RATIO_WHY)
    return False, _("TF32 is not fp32: it keeps 10 of fp32's 23 mantissa bits, bf16 keeps 7. Three bits apart, so "
                    "about 2^3 times the error (measured {result:.1f}x), not orders of magnitude.").format(
        result=result)


# ---- 05.fp8-roundtrip: debug ------------------------------------------------------------------------
_ROUNDTRIP_WHY = N_("The scale is upside down in the cast: x / scale pushes the values away from E4M3's range (for "
                    "gradients of 1e-6, towards 1e-15) and they flush to zero. The scale multiplies the tensor "
                    "before the cast, so that amax lands on 448, and divides it back after.")


def _reference_roundtrip(x: torch.Tensor) -> torch.Tensor:
    scale = 448.0 / x.abs().max()
    return (x * scale).to(torch.float8_e4m3fn).float() / scale


def _broken_roundtrip(x: torch.Tensor) -> torch.Tensor:
    """The snippet of the exercise: divides before the cast and multiplies after."""
    scale = 448.0 / x.abs().max()
    return (x / scale).to(torch.float8_e4m3fn).float() * scale


def _grade_roundtrip(fn: object) -> tuple[bool, str] | None:
    if not callable(fn):
        return False, FormatSlip(_("Define fp8_roundtrip(x) and pass the function itself."))
    g = torch.Generator().manual_seed(21)
    cases = [(N_("gradients of size ~1e-6"), torch.randn(4096, generator=g) * 1e-6),
             (N_("activations of size ~3"), torch.randn(4096, generator=g) * 3),
             (N_("values up to ~1e4"), torch.randn(2048, generator=g) * 2e3)]
    for label, x in cases:
        what = _(label)
        got = fn(x.clone())
        if got is None or got is Ellipsis:
            return None  # still a stub: "not attempted yet"
        if not isinstance(got, torch.Tensor) or got.shape != x.shape:
            return False, FormatSlip(_("Return a tensor of the same shape as x (the values after the round trip)."))
        if not got.is_floating_point() or got.element_size() < 2:
            return False, _("Return the values back in float (e.g. .float()), not the FP8 tensor itself.")
        got = got.float()
        if not torch.isfinite(got).all():
            return False, _("For {what} the result holds inf/NaN.").format(what=what)
        err = ((got - x).norm() / x.norm()).item()
        if err < 0.05:
            # one E4M3 code per value and one scale per tensor: at most 256 distinct values can come back
            if torch.unique(got).numel() > 256:
                return False, _("For {what} {count} distinct values came back, more than E4M3's 256 codes can give "
                                "with one scale: the values did not go through torch.float8_e4m3fn. Scale, cast to "
                                "E4M3, cast back, unscale.").format(what=what, count=torch.unique(got).numel())
            continue
        ratio = (got.norm() / x.norm()).item()
        scale = 448.0 / x.abs().max().item()
        if err > 0.5 and ratio < 0.5:
            return False, _(_ROUNDTRIP_WHY)
        if math.isclose(ratio, scale, rel_tol=0.1):
            return False, _("For {what} you return the scaled values: divide by the scale after the cast.").format(
                what=what)
        return False, _("For {what} the round trip is {error:.0%} off; E4M3 with a per-tensor scale is ~2-3 % "
                        "off.").format(what=what, error=err)
    return True, _("Scale up into E4M3's range, cast, scale back: ~2.6 % error at every magnitude.")


def _measure_bf16_vs_tf32() -> float:
    """The relative error of a matmul with bf16-rounded inputs over that with tf32-rounded inputs, on the
    notebook's two seeded 256x256 matrices (the experiment of 05.bf16-vs-tf32)."""
    from labkit import tf32

    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(256, 256, generator=g), torch.randn(256, 256, generator=g)
    return tf32.input_rounding_error(a, b, "bf16") / tf32.input_rounding_error(a, b, "tf32")


EXERCISES = [
    Exercise("05.choose-format",
             "For each entry of WORKLOADS, choose one of FORMAT_CHOICES.", _grade_choose,
             "Ask of each workload: does it need range, precision, or is it a constraint of the hardware or the code?",
             method="Range protects gradients (they span many binades); precision protects forward values and "
                    "master weights (small updates). A V100 has fp16 tensor cores only; TF32 needs no code change; "
                    "FP8 splits into E4M3 (more mantissa) and E5M2 (more exponent).",
             solution="a100-mixed bf16, a100-fp32-code tf32, v100-mixed fp16, fp8-forward e4m3fn, fp8-backward e5m2, "
                      "master-weights fp32",
             kind="design", wrong_why=_CHOOSE_WHY,
             reference=dict(_ANSWERS), wrong={**_ANSWERS, "fp8-backward": "e4m3fn"}),
    Exercise("05.fp8-scale",
             "The per-tensor E4M3 scale for exercise_tensor() with a margin of one binade.", _grade_scale,
             "The scale multiplies the tensor so that its largest magnitude lands near E4M3's largest value.",
             method="Compute amax = x.abs().max() of the tensor first. The scale maps amax onto E4M3's largest "
                    "value (448); a margin of m binades lowers that target by a factor 2^m.",
             solution="scale = 448.0 / xt.abs().max().item() / 2**1",
             kind="compute", wrong_why=_SCALE_WHY,
             reference=448.0 / fp8.amax(exercise_tensor()) / 2.0, wrong=448.0 / fp8.amax(exercise_tensor())),
    Exercise("05.delayed-scale",
             "Write delayed_scale(amax_history, history_len, fmt_max, margin): the scale delayed scaling uses next.",
             _grade_delayed,
             "The scale comes from earlier steps' amaxes, but not from all of them, and not from only one.",
             method="Slice the last history_len amaxes out of the history and reduce the window to the one amax "
                    "the next scale must protect against; then apply the per-tensor scale of 05.fp8-scale to it, "
                    "with fmt_max and margin.",
             solution="return fmt_max / max(amax_history[-history_len:]) / 2**margin",
             kind="implement", wrong_why=_DELAYED_WHY,
             reference=_reference_delayed, wrong=_wrong_delayed),
    Exercise("05.bf16-vs-tf32",
             "Predict, then run: rounding the inputs of a 256x256 matmul to bf16 costs how many times the relative "
             "error of rounding them to TF32?",
             _grade_ratio,
             "Both keep fp32's exponent; compare what they keep of the mantissa.",
             method="Rounding to m mantissa bits makes a relative error of up to 2^-(m+1), so each bit fewer doubles "
                    "it. TF32 keeps 10 bits, bf16 7.",
             solution="prediction = 8: 2^(10 - 7); measured 7.9.",
             kind="predict", wrong_why=_RATIO_WHY, reference=(8.0, 7.94), wrong=(1.0, 7.94),
             measure=_measure_bf16_vs_tf32),
    Exercise("05.fp8-roundtrip",
             "Debug: fp8_roundtrip(x), a per-tensor-scaled E4M3 round trip, loses nearly all of a gradient. Write "
             "a fixed fp8_roundtrip(x) that returns x after scale, cast to E4M3 and back.",
             _grade_roundtrip,
             "Compute x / scale for a gradient of 1e-6 by hand: where does it land on E4M3's number line?",
             method="A per-tensor scale maps amax onto E4M3's largest value. Follow a small gradient through the "
                    "two steps: before the cast it must move into E4M3's range, after the cast back to its true "
                    "size. Which operation does each step need?",
             solution="scale = 448.0 / x.abs().max()\nreturn (x * scale).to(torch.float8_e4m3fn).float() / scale",
             kind="debug", wrong_why=_ROUNDTRIP_WHY, reference=_reference_roundtrip, wrong=_broken_roundtrip),
]
