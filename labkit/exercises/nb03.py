"""Exercises of notebook 03 (loss scaling). Introduced in notebook 03."""

from __future__ import annotations

import math
import random
from typing import Any

import torch

from labkit import scaling
from labkit.exercises._core import Exercise, whole

__all__ = ["EXERCISES", "PATTERN", "PATTERN_KNOBS", "RULE_KNOBS", "exercise_gradients"]

#: Exercise 03.predict-scale: True = that step's gradients held an inf/NaN.
PATTERN: tuple[bool, ...] = (False, False, False, True, True, False, False, False, False, True, False)
#: ... with these DynamicLossScaler / GradScaler knobs.
PATTERN_KNOBS: dict[str, Any] = {"init_scale": 2.0**10, "growth_factor": 2.0, "backoff_factor": 0.5,
                                 "growth_interval": 3}
#: Exercise 03.update-rule: the knobs the learner's rule must implement.
RULE_KNOBS: dict[str, Any] = {"growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 3}


def exercise_gradients(n: int = 20_000, seed: int = 3) -> torch.Tensor:
    """Return the gradients of exercise 03.static-scale: |g| log-uniform in [2^-32, 2^-6], random signs.

    Introduced in notebook 03.
    """
    whole("n", n, 2)  # the two extremes are always in the sample
    gen = torch.Generator().manual_seed(whole("seed", seed, 0))
    log2 = torch.empty(n, dtype=torch.float64).uniform_(-32.0, -6.0, generator=gen)
    log2[0], log2[1] = -32.0, -6.0  # the extremes are in the sample
    signs = torch.randint(0, 2, (n,), generator=gen) * 2 - 1
    return (signs * torch.exp2(log2)).float()


def _grade_static_scale(answer: object) -> tuple[bool, str]:
    if isinstance(answer, bool) or not isinstance(answer, (int, float)):
        return False, "Give the scale as a number, e.g. 2.0**10."
    s = float(answer)
    if not (0 < s < math.inf):
        return False, "A loss scale is a positive finite number."
    g = exercise_gradients()
    under = scaling.underflow_fraction(g, "fp16", s)
    over = scaling.overflow_fraction(g, "fp16", s)
    if under == 0 and over == 0:
        lo, hi = scaling.safe_scale_powers(g, "fp16")  # type: ignore[misc]
        return True, f"Any power 2^k with {lo} <= k <= {hi} works."
    if over:
        return False, f"With {s:g}, {over:.2%} of the gradients overflow to inf: too big."
    return False, f"With {s:g}, {under:.2%} of the gradients still flush to zero: too small."


def _grade_predict(answer: object) -> tuple[bool, str]:
    if isinstance(answer, bool) or not isinstance(answer, (int, float)):
        return False, "Give the scale as a number."
    want = scaling.simulate_scales(PATTERN, **PATTERN_KNOBS)[-1]
    if float(answer) == want:
        return True, ""
    return False, "Walk the pattern step by step: count clean steps, reset the count on growth and on overflow."


def _reference_rule(scale: float, tracker: int, found_inf: bool) -> tuple[float, int]:
    if found_inf:
        return scale * RULE_KNOBS["backoff_factor"], 0
    tracker += 1
    if tracker == RULE_KNOBS["growth_interval"]:
        return scale * RULE_KNOBS["growth_factor"], 0
    return scale, tracker


def _late_rule(scale: float, tracker: int, found_inf: bool) -> tuple[float, int]:
    """A typical mistake: growing one clean step late (tracker compared before the increment)."""
    if found_inf:
        return scale * RULE_KNOBS["backoff_factor"], 0
    if tracker == RULE_KNOBS["growth_interval"]:
        return scale * RULE_KNOBS["growth_factor"], 0
    return scale, tracker + 1


def _grade_rule(update: object) -> tuple[bool, str] | None:
    if not callable(update):
        return False, "Define a function update(scale, tracker, found_inf) -> (new_scale, new_tracker)."
    rng = random.Random(7)
    for _trial in range(40):
        ref = scaling.DynamicLossScaler(init_scale=2.0 ** rng.randint(0, 20), **RULE_KNOBS)
        scale, tracker = ref.get_scale(), 0
        for step in range(rng.randint(1, 30)):
            found = rng.random() < 0.3
            out = update(scale, tracker, found)
            if out is None or out is Ellipsis:
                return None  # still a stub: "not attempted yet"
            if not (isinstance(out, tuple) and len(out) == 2):
                return False, "Return a tuple (new_scale, new_tracker)."
            scale, tracker = float(out[0]), int(out[1])
            ref.update(found_inf=found)
            want = (ref.get_scale(), ref.state_dict()["_growth_tracker"])
            if (scale, tracker) != want:
                return False, (f"After step {step} (found_inf={found}) you have scale={scale:g}, tracker={tracker}; "
                               f"GradScaler has scale={want[0]:g}, tracker={want[1]}.")
    return True, "Your rule and GradScaler's agree on 40 random runs."


def _grade_ds_config(answer: object) -> tuple[bool, str]:
    if not isinstance(answer, dict):
        return False, "Give DeepSpeed's fp16 block as a dict, e.g. {'enabled': True, 'loss_scale': 0, ...}."
    try:
        kw = scaling.scaler_kwargs_from_deepspeed(answer)
    except (ValueError, TypeError) as exc:
        return False, str(exc)
    if answer.get("enabled") is not True:
        return False, "Set 'enabled': True, or DeepSpeed ignores the block."
    if kw["init_scale"] != 2.0**12:
        return False, f"Your initial scale is {kw['init_scale']:g}, not 4096: initial_scale_power is a power of 2."
    if kw["growth_interval"] != 500:
        return False, "The GradScaler grows after 500 clean steps: that is the loss_scale_window."
    return True, "Remember DeepSpeed's first growth comes one step later (window + 1 clean steps)."


EXERCISES = [
    Exercise("03.static-scale",
             "Choose a static loss scale S so that no gradient of exercise_gradients() flushes to zero or "
             "overflows in FP16.", _grade_static_scale,
             "The smallest |g| is 2^-32 and must land at or above FP16's smallest subnormal, 2^-24; the largest, "
             "2^-6, must stay below 65520 (~2^16).", reference=2.0**14, wrong=1.0),
    Exercise("03.predict-scale", "The scale after the overflow pattern PATTERN with PATTERN_KNOBS.", _grade_predict,
             "Clean steps count up; at growth_interval clean steps in a row the scale doubles and the count "
             "restarts; an overflow halves the scale and restarts the count.",
             reference=scaling.simulate_scales(PATTERN, **PATTERN_KNOBS)[-1], wrong=2.0**10),
    Exercise("03.update-rule",
             "Write update(scale, tracker, found_inf) -> (new_scale, new_tracker), GradScaler's rule with "
             "RULE_KNOBS.", _grade_rule,
             "On found_inf: scale * backoff_factor, tracker 0. Otherwise tracker + 1; if that equals "
             "growth_interval: scale * growth_factor and tracker 0.", reference=_reference_rule, wrong=_late_rule),
    Exercise("03.deepspeed-config",
             "DeepSpeed's fp16 block that behaves like GradScaler(init_scale=2**12, growth_interval=500).",
             _grade_ds_config,
             "loss_scale 0 means dynamic; initial_scale_power is k in 2**k; loss_scale_window is the growth "
             "interval; hysteresis 1 backs off at the first overflow, as GradScaler does.",
             reference={"enabled": True, "loss_scale": 0, "initial_scale_power": 12, "loss_scale_window": 500,
                        "hysteresis": 1, "min_loss_scale": 1},
             wrong={"enabled": True, "loss_scale": 0, "initial_scale_power": 12, "loss_scale_window": 500}),
]
