"""Exercises of notebook 03 (loss scaling). Introduced in notebook 03."""

from __future__ import annotations

import math
import random
from typing import Any

import torch

from labkit import scaling
from labkit.exercises._core import Exercise, FormatSlip, whole
from labkit.exercises._graders import NOT_A_PAIR, as_number, pair
from labkit.i18n import N_
from labkit.i18n import gettext as _

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


_STATIC_WHY = N_("S = 1 is no scaling at all: the smallest gradients, 2^-32, stay below FP16's smallest subnormal "
                  "2^-24 and flush to zero. The scale has to lift them into FP16's range without pushing the "
                  "largest, 2^-6, past FP16's largest value.")


def _grade_static_scale(answer: object) -> tuple[bool, str]:
    if isinstance(answer, bool) or not isinstance(answer, (int, float)):
        return False, FormatSlip(_("Give the scale as a number, e.g. 2.0**10."))
    s = float(answer)
    if not (0 < s < math.inf):
        return False, _("A loss scale is a positive finite number.")
    g = exercise_gradients()
    under = scaling.underflow_fraction(g, "fp16", s)
    over = scaling.overflow_fraction(g, "fp16", s)
    if under == 0 and over == 0:
        lo, hi = scaling.safe_scale_powers(g, "fp16")  # type: ignore[misc]
        return True, _("Any power 2^k with {lo} <= k <= {hi} works.").format(lo=lo, hi=hi)
    if s == 1.0:
        return False, _(_STATIC_WHY)
    if over:
        return False, _("With {scale:g}, {share:.2%} of the gradients overflow to inf: too big.").format(
            scale=s, share=over)
    return False, _("With {scale:g}, {share:.2%} of the gradients still flush to zero: too small.").format(
        scale=s, share=under)


_PREDICT_WHY = N_("2^10 is where the scale started, as if growth and back-off cancelled out. They do not: walk the "
                   "pattern one step at a time, count every overflow (two in a row halve twice), and grow only after "
                   "growth_interval clean steps in a row.")


def _grade_predict(answer: object) -> tuple[bool, str]:
    if isinstance(answer, bool) or not isinstance(answer, (int, float)):
        return False, FormatSlip(_("Give the scale as a number."))
    want = scaling.simulate_scales(PATTERN, **PATTERN_KNOBS)[-1]
    if float(answer) == want:
        return True, ""
    if float(answer) == PATTERN_KNOBS["init_scale"]:
        return False, _(_PREDICT_WHY)
    return False, _("Walk the pattern step by step: count clean steps, reset the count on growth and on overflow.")


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


_LATE_WHY = N_("You grow one clean step late: GradScaler counts the current clean step first and doubles as soon as "
                "that count, the current step included, reaches growth_interval.")


def _grade_rule(update: object) -> tuple[bool, str] | None:
    if not callable(update):
        return False, FormatSlip(
            _("Define a function update(scale, tracker, found_inf) -> (new_scale, new_tracker)."))
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
                return False, FormatSlip(_("Return a tuple (new_scale, new_tracker)."))
            before = scale
            scale, tracker = float(out[0]), int(out[1])
            ref.update(found_inf=found)
            want = (ref.get_scale(), ref.state_dict()["_growth_tracker"])
            if (scale, tracker) != want:
                if not found and want == (2 * before, 0) and (scale, tracker) == (before, RULE_KNOBS["growth_interval"]):
                    return False, _(_LATE_WHY)
                return False, _("After step {step} (found_inf={found}) you have scale={scale:g}, tracker={tracker}; "
                                "GradScaler has scale={want_scale:g}, tracker={want_tracker}.").format(
                    step=step, found=found, scale=scale, tracker=tracker, want_scale=want[0], want_tracker=want[1])
    return True, _("Your rule and GradScaler's agree on 40 random runs.")


_HYSTERESIS_WHY = N_("Without a 'hysteresis' key DeepSpeed keeps its default: it lets one overflow pass (skipping the "
                      "step but keeping the scale) before it halves, while GradScaler halves at the first overflow.")


_FLOOR_WHY = N_("Your min_loss_scale stops the halving where GradScaler, which has no floor, keeps going: with a high "
                 "floor, gradients too large for that scale overflow at every step. Keep DeepSpeed's floor where it "
                 "does no harm, its default.")


def _grade_ds_config(answer: object) -> tuple[bool, str]:
    if not isinstance(answer, dict):
        return False, FormatSlip(
            _("Give DeepSpeed's fp16 block as a dict, e.g. {'enabled': True, 'loss_scale': 0, ...}."))
    if answer.get("loss_scale", 0) == 0 and "hysteresis" not in answer:
        return False, _(_HYSTERESIS_WHY)
    try:
        kw = scaling.scaler_kwargs_from_deepspeed(answer)
    except (ValueError, TypeError) as exc:
        return False, str(exc)
    if answer.get("enabled") is not True:
        return False, _("Set 'enabled': True, or DeepSpeed ignores the block.")
    if kw["init_scale"] != 2.0**12:
        return False, _("Your initial scale is {scale:g}, not 4096: initial_scale_power is the exponent k of 2**k.").format(
            scale=kw["init_scale"])
    if kw["growth_interval"] != 500:
        return False, _("The GradScaler grows after 500 clean steps: that is the loss_scale_window.")
    if kw["min_scale"] > 1:
        return False, _(_FLOOR_WHY)
    return True, _("Remember DeepSpeed's first growth comes one step later (window + 1 clean steps).")


# ---- 03.collapse: predict, then run -----------------------------------------------------------------
_COLLAPSE_WHY = N_("GradScaler has no floor: it halves on every overflow, whatever the reason, and never stops at 1 "
                    "(DeepSpeed's min_loss_scale does). After 16 halvings it reaches 1, after 142 FP32's smallest "
                    "normal, and after 165 the smallest subnormal 2^-149; one more halving rounds to exactly 0.")


def _grade_collapse(answer: object) -> tuple[bool, str]:
    got = pair(answer)
    if got is None:
        return False, NOT_A_PAIR
    pred, result = (as_number(v) for v in got)
    if pred is None:
        return False, FormatSlip(_("Predict the scale as a number."))
    if result is None:
        raise ValueError(_("the measured scale must be a number, got {value!r}").format(value=got[1]))
    if pred == result:
        return True, _("Every step overflowed, so every step halved the scale: 2^16 → 1 after 16 steps, FP32's "
                       "smallest subnormal 2^-149 after 165, and the next halving rounds to 0.")
    if pred == 1.0:
        return False, _(_COLLAPSE_WHY)
    if 0 < pred < 2.0**-120:
        return False, _("Halving 170 times from 2^16 would give 2^-154 in exact arithmetic, but the scale is an FP32 "
                        "number: below the smallest subnormal, 2^-149, it rounds to exactly 0.")
    if pred >= 2.0**16:
        return False, _("The scaler cannot tell a broken label from a scale that is too big: every overflow halves "
                        "the scale, 170 times in a row here.")
    return False, _("The scale ended at {result!r}: {why}").format(result=result, why=_(_COLLAPSE_WHY))


# ---- 03.scaler-step: debug --------------------------------------------------------------------------
_STEP_WHY = N_("opt.step() bypasses the scaler: it steps even when the gradients hold inf/NaN, and writes them into "
                "the weights. One scaler call is missing, and one comes too early: the call that ends the step's "
                "bookkeeping may only come last.")


def _fp16() -> bool:
    from labkit import device as dev_gate

    return dev_gate.computes(torch.float16, "cpu")


def _reference_step(model: torch.nn.Module, opt: torch.optim.Optimizer, scaler: Any, xb: torch.Tensor,
                    yb: torch.Tensor) -> None:
    opt.zero_grad()
    with torch.autocast("cpu", dtype=torch.float16, enabled=_fp16()):
        loss = torch.nn.functional.mse_loss(model(xb), yb)
    scaler.scale(loss).backward()
    scaler.unscale_(opt)
    scaler.step(opt)
    scaler.update()


def _broken_step(model: torch.nn.Module, opt: torch.optim.Optimizer, scaler: Any, xb: torch.Tensor,
                 yb: torch.Tensor) -> None:
    """The snippet of the exercise: update() before the step, and opt.step() instead of scaler.step(opt)."""
    opt.zero_grad()
    with torch.autocast("cpu", dtype=torch.float16, enabled=_fp16()):
        loss = torch.nn.functional.mse_loss(model(xb), yb)
    scaler.scale(loss).backward()
    scaler.unscale_(opt)
    scaler.update()
    opt.step()


def _grade_step(fn: Any) -> tuple[bool, str] | None:
    if not callable(fn):
        return False, FormatSlip(_("Define train_step(model, opt, scaler, xb, yb) and pass the function itself."))
    from labkit import models

    g = torch.Generator().manual_seed(3)
    xb, yb = torch.randn(32, 16, generator=g), torch.randn(32, 1, generator=g)
    bad_y = yb.clone()
    bad_y[0] = math.inf

    def run(step: Any, y: torch.Tensor) -> tuple[list[torch.Tensor], float, list[torch.Tensor]]:
        net = models.MLP(16, 32, 1, depth=2, activation="tanh", seed=1)
        before = [p.detach().clone() for p in net.parameters()]
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=1)
        step(net, opt, scaler, xb, y)
        return before, float(scaler.get_scale()), [p.detach().clone() for p in net.parameters()]

    w0, ref_scale, ref_w = run(_reference_step, yb)
    _w0, got_scale, got_w = run(fn, yb)
    moved = [q - p for p, q in zip(w0, got_w)]
    if got_scale == 2.0**10 and all(not m.any() for m in moved):
        return None  # it changed nothing at all: still a stub, "not attempted yet"
    ref_moved = torch.cat([(q - p).flatten() for p, q in zip(w0, ref_w)])
    got_moved = torch.cat([m.flatten() for m in moved])
    if not torch.isfinite(got_moved).all() or (got_moved - ref_moved).norm() > 0.05 * ref_moved.norm():
        ratio = (got_moved.norm() / ref_moved.norm()).item()
        if 0 < ratio < 0.01:
            return False, _("On a clean step your update is about 1/scale of the right one: the gradients were "
                            "unscaled twice. One of your scaler calls forgets, too early, that unscale_ already ran.")
        return False, _("On a clean step your update differs from a correct one: scale, backward, unscale_, step.")
    if got_scale != ref_scale:
        return False, _("After a clean step the scale should grow (growth_interval=1), but it stayed {scale:g}: "
                        "the call that adjusts the scale is missing, or comes more than once.").format(scale=got_scale)
    _w0, bad_scale, bad_w = run(fn, bad_y)
    if not all(torch.equal(p, q) for p, q in zip(w0, bad_w)):
        return False, _(_STEP_WHY)
    if bad_scale != 2.0**9:
        return False, _("After an overflow the scale must halve to 512, got {scale:g}: call scaler.update().").format(
            scale=bad_scale)
    return True, _("Clean steps update and grow the scale; an overflowing step is skipped and halves it.")


def _measure_collapse() -> float:
    """The scale of a default GradScaler after 170 steps whose loss is inf (the experiment of 03.collapse), run
    through the same training step as the notebook (``scaling.train_with_scaler``) on a small model."""
    import torch.nn.functional as F

    from labkit import models

    net = models.MLP(4, 8, 1, depth=1, seed=0)
    x, y = torch.ones(8, 4), torch.zeros(8, 1)
    y[0] = math.inf  # one broken label per batch
    run = scaling.train_with_scaler(net, F.mse_loss, lambda step: (x, y), torch.optim.SGD(net.parameters(), lr=0.1),
                                    torch.amp.GradScaler("cpu"), 170, emulate=True)
    return run["scale"][-1]

EXERCISES = [
    Exercise("03.static-scale",
             "Choose a static loss scale S so that no gradient of exercise_gradients() flushes to zero or "
             "overflows in FP16.", _grade_static_scale,
             "Find the smallest and the largest |g| in the histogram, and where FP16's range starts and ends.",
             method="S multiplies every gradient: as a power of two, 2^k, it adds k to every gradient's exponent. "
                    "The smallest gradient, 2^-32, must land at or above FP16's smallest subnormal, 2^-24; the "
                    "largest, 2^-6, must stay below where FP16 overflows, just under 2^16. Each end bounds k; pick "
                    "a k between the two bounds, away from both.",
             solution="Any power of two from 2^8 to 2^21 works; S = 2.0**14 sits in the middle of that range, with "
                      "headroom on both sides.",
             kind="design", wrong_why=_STATIC_WHY, reference=2.0**14, wrong=1.0),
    Exercise("03.predict-scale", "The scale after the overflow pattern PATTERN with PATTERN_KNOBS.", _grade_predict,
             "Walk the pattern one step at a time, keeping two numbers: the scale and the count of clean steps.",
             method="A clean step adds 1 to the count; when the count reaches growth_interval the scale doubles and "
                    "the count restarts at 0. An overflow halves the scale and restarts the count.",
             solution="1024 → (3 clean) 2048 → (overflow, overflow) 512 → (3 clean) 1024 → (1 clean) → (overflow) "
                      "512 → (1 clean) 512.0",
             kind="compute", wrong_why=_PREDICT_WHY,
             reference=scaling.simulate_scales(PATTERN, **PATTERN_KNOBS)[-1], wrong=2.0**10),
    Exercise("03.update-rule",
             "Write update(scale, tracker, found_inf) -> (new_scale, new_tracker), GradScaler's rule with "
             "RULE_KNOBS.", _grade_rule,
             "Two cases: the step overflowed, or it was clean. Each one decides the new scale and the new count.",
             method="Write the two branches on found_inf; in each, decide the new scale (backoff_factor, "
                    "growth_factor, or unchanged) and the new count. The detail that matters: does GradScaler "
                    "compare the count with growth_interval before or after it counts the current clean step?",
             solution="if found_inf: return scale * 0.5, 0\ntracker += 1\nif tracker == 3: return scale * 2.0, 0\n"
                      "return scale, tracker",
             kind="implement", wrong_why=_LATE_WHY, reference=_reference_rule, wrong=_late_rule),
    Exercise("03.deepspeed-config",
             "DeepSpeed's fp16 block that behaves like GradScaler(init_scale=2**12, growth_interval=500).",
             _grade_ds_config,
             "Go through the table of section 5 key by key: which DeepSpeed key plays each GradScaler role, and "
             "which DeepSpeed default differs from GradScaler's behaviour?",
             method="loss_scale 0 means dynamic; initial_scale_power is k in 2**k; loss_scale_window is the growth "
                    "interval; hysteresis is the overflow that halves: with the default 2, one overflow passes and the second halves.",
             solution='{"enabled": True, "loss_scale": 0, "initial_scale_power": 12, "loss_scale_window": 500, '
                      '"hysteresis": 1, "min_loss_scale": 1}',
             kind="design", wrong_why=_HYSTERESIS_WHY,
             reference={"enabled": True, "loss_scale": 0, "initial_scale_power": 12, "loss_scale_window": 500,
                        "hysteresis": 1, "min_loss_scale": 1},
             wrong={"enabled": True, "loss_scale": 0, "initial_scale_power": 12, "loss_scale_window": 500}),
    Exercise("03.collapse",
             "Predict, then run: a GradScaler with its defaults (2^16) sees 170 steps in a row whose gradients all "
             "hold inf (one broken label per batch). What is its scale afterwards?",
             _grade_collapse,
             "The scaler only sees an overflow; it cannot tell a broken label from a scale that is too big.",
             method="Every overflowing step halves the scale and nothing stops it. The scale is an FP32 number: how "
                    "far down can FP32 go, and what happens below its smallest subnormal (2^-149)?",
             solution="prediction = 0.0: 170 halvings from 2^16 would be 2^-154, below FP32's smallest subnormal, so "
                      "the scale rounds to exactly 0 (and unscaling by 1/0 then poisons the weights).",
             kind="predict", wrong_why=_COLLAPSE_WHY, reference=(0.0, 0.0), wrong=(1.0, 0.0),
             measure=_measure_collapse),
    Exercise("03.scaler-step",
             "Debug: train_step lets an overflowing batch write NaN into the weights. Write a fixed "
             "train_step(model, opt, scaler, xb, yb).",
             _grade_step,
             "Which call decides whether an overflowing step is skipped, and does the broken step make it?",
             method="List the scaler calls of one AMP step (section 4) and ask what each does: which call looks "
                    "at the inf check before the weights change, and which call closes the step's bookkeeping (so "
                    "nothing of the step may come after it)? The broken step calls one of them too early and "
                    "misses the other.",
             solution="opt.zero_grad()\nwith torch.autocast('cpu', dtype=torch.float16, enabled=FP16):\n"
                      "    loss = F.mse_loss(model(xb), yb)\nscaler.scale(loss).backward()\nscaler.unscale_(opt)\n"
                      "scaler.step(opt)\nscaler.update()",
             kind="debug", wrong_why=_STEP_WHY, reference=_reference_step, wrong=_broken_step),
]
