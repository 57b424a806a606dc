"""Exercises of notebook 05 (BF16, TF32, FP8). Introduced in notebook 05."""

from __future__ import annotations

import math
import random

import torch

from labkit import fp8
from labkit.exercises._core import Exercise, whole

__all__ = ["EXERCISES", "FORMAT_CHOICES", "WORKLOADS", "exercise_tensor"]

#: Exercise 05.choose-format: workload -> the format to choose (the learner sees only the keys and texts).
WORKLOADS: dict[str, str] = {
    "a100-mixed": "Mixed-precision training of a transformer on an A100; you want no loss-scaling code.",
    "a100-fp32-code": "An fp32 model whose code you may not change, on an A100; let its matmuls use tensor cores.",
    "v100-mixed": "Mixed-precision training on a V100 (tensor cores for fp16 only, no bf16).",
    "fp8-forward": "Activations and weights fed to the matmuls of an FP8 forward pass on an H100.",
    "fp8-backward": "The gradients fed to the matmuls of an FP8 backward pass.",
    "master-weights": "The master copy of the weights and the Adam moments that the optimizer updates.",
}
_ANSWERS: dict[str, str] = {"a100-mixed": "bf16", "a100-fp32-code": "tf32", "v100-mixed": "fp16",
                            "fp8-forward": "e4m3fn", "fp8-backward": "e5m2", "master-weights": "fp32"}
#: The names the learner may use.
FORMAT_CHOICES: tuple[str, ...] = ("fp32", "tf32", "bf16", "fp16", "e4m3fn", "e5m2")
_ALIASES = {"e4m3": "e4m3fn", "fp8_e4m3": "e4m3fn", "fp8_e5m2": "e5m2", "bfloat16": "bf16", "float16": "fp16",
            "half": "fp16", "float32": "fp32", "float": "fp32"}
_WHY = {
    "a100-mixed": "bf16 has fp32's exponent range, so gradients do not underflow and no GradScaler is needed.",
    "a100-fp32-code": "TF32 is a math mode for fp32 tensors: one flag, no code change, fp32 range.",
    "v100-mixed": "a V100 has fp16 tensor cores only: fp16 with loss scaling.",
    "fp8-forward": "the forward pass wants precision (3 mantissa bits) more than range: E4M3.",
    "fp8-backward": "gradients span more binades than activations: E5M2's range.",
    "master-weights": "small updates must not be rounded away: fp32.",
}


def _grade_choose(answer: object) -> tuple[bool, str] | bool:
    if not isinstance(answer, dict):
        return False, "Give a dict {workload: format}, with a key for every entry of WORKLOADS."
    missing = [k for k in WORKLOADS if k not in answer]
    if missing:
        return False, f"Missing workloads: {missing}."
    wrong = []
    for k, want in _ANSWERS.items():
        v = answer[k]
        name = _ALIASES.get(str(v).strip().lower(), str(v).strip().lower()) if isinstance(v, str) else v
        if name not in FORMAT_CHOICES:
            return False, f"{k}: {v!r} is not one of {FORMAT_CHOICES}."
        if name != want:
            wrong.append(k)
    if wrong:
        return False, f"Reconsider: {', '.join(wrong)}."
    return True, " ".join(_WHY.values())


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


def _grade_scale(answer: object) -> tuple[bool, str]:
    if isinstance(answer, torch.Tensor) and answer.numel() == 1:
        answer = float(answer)
    if isinstance(answer, bool) or not isinstance(answer, (int, float)):
        return False, "Give the scale as a Python float."
    x = exercise_tensor()
    a = fp8.amax(x)
    want = fp8.compute_scale(a, "e4m3fn", margin=_MARGIN)
    s = float(answer)
    if math.isclose(s, want, rel_tol=1e-6):
        q = fp8.quant_stats(x, "e4m3fn", s)
        return True, f"amax = {a:.4g}; with this scale nothing saturates ({q.saturated:.0%}) and the error is {q.rel_error:.1%}."
    if math.isclose(s, 448.0 / a, rel_tol=1e-6):
        return False, "That is the scale with no margin: the exercise asks for one binade of headroom."
    if math.isclose(s, a / 448.0, rel_tol=1e-3) or math.isclose(s, 2 * a / 448.0, rel_tol=1e-3):
        return False, "Upside down: the scale multiplies the tensor so that amax lands near 448."
    return False, f"Not the per-tensor scale (yours puts amax at {a * s:.4g} instead of 224)."


def _reference_delayed(history: list[float], history_len: int, fmt_max: float, margin: int) -> float:
    return fmt_max / max(history[-history_len:]) / 2.0**margin


def _grade_delayed(fn: object) -> tuple[bool, str] | None:
    if not callable(fn):
        return False, "Define delayed_scale(amax_history, history_len, fmt_max, margin) -> float."
    rng = random.Random(11)
    for _ in range(50):
        n = rng.randint(1, 30)
        history = [10.0 ** rng.uniform(-8, 3) for _ in range(n)]
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
            last = ", ".join(f"{h:.3g}" for h in history[-5:])
            return False, (f"For a history ending [{last}], history_len {history_len}, "
                           f"{fmt} and margin {margin} you give {got!r}; DelayedScaling uses {want:.6g}.")
    return True, "Your rule and labkit.fp8.DelayedScaling agree on 50 random histories."


def _wrong_delayed(history: list[float], history_len: int, fmt_max: float, margin: int) -> float:
    return fmt_max / history[-1] / 2.0**margin  # "most recent", not the max of the window


EXERCISES = [
    Exercise("05.choose-format",
             "For each entry of WORKLOADS, choose one of FORMAT_CHOICES.", _grade_choose,
             "Ask of each workload: does it need range (gradients), precision (forward values, master weights), "
             "or is it a constraint of the hardware or the code?",
             reference=dict(_ANSWERS), wrong={**_ANSWERS, "fp8-backward": "e4m3fn"}),
    Exercise("05.fp8-scale",
             "The per-tensor E4M3 scale for exercise_tensor() with a margin of one binade.", _grade_scale,
             "scale = fp8_max / amax / 2**margin, with amax = x.abs().max() and E4M3's maximum 448.",
             reference=448.0 / fp8.amax(exercise_tensor()) / 2.0, wrong=448.0 / fp8.amax(exercise_tensor())),
    Exercise("05.delayed-scale",
             "Write delayed_scale(amax_history, history_len, fmt_max, margin): the scale delayed scaling uses next.",
             _grade_delayed,
             "Take the last history_len amaxes (the window), their maximum, then fmt_max / that / 2**margin.",
             reference=_reference_delayed, wrong=_wrong_delayed),
]
