"""Exercises of notebook 10 (DeepSpeed and ZeRO). Introduced in notebook 10."""

from __future__ import annotations

import math
import numbers
from typing import Any

from labkit.exercises._core import NOT_MEASURED, Exercise, FormatSlip
from labkit.exercises._graders import NOT_A_PAIR, pair
from labkit.i18n import N_
from labkit.i18n import gettext as _

__all__ = ["CONFIG_SETUP", "EXERCISES", "STAGE2_OUTCOMES"]

#: The setup exercise 10.config describes (the notebook prints it).
CONFIG_SETUP = {
    "world_size": 16, "stage": 3, "micro_batch": 2, "grad_accum": 4, "initial_scale_power": 12,
    "hysteresis": 1, "loss_scale_window": 500, "gradient_clipping": 1.0, "overlap_comm": True,
}


_CONFIG_WHY = N_("hysteresis 2 is DeepSpeed's default: it lets the first overflow pass (the step is skipped, the scale "
                 "kept) and halves only at the second. The setup halves at the first overflow, like GradScaler: "
                 "hysteresis 1.")


#: Keys a hand-written config puts at its top level that DeepSpeed reads only inside a section.
_SECTION_KEYS = {
    "fp16": ("loss_scale", "initial_scale_power", "hysteresis", "loss_scale_window", "min_loss_scale"),
    "zero_optimization": ("stage", "overlap_comm", "contiguous_gradients", "reduce_bucket_size", "offload_optimizer"),
}

_HYSTERESIS_ZERO = N_("hysteresis counts the overflows up to and including the one that halves the scale: 1 halves at "
                      "the first. With 0, DeepSpeed counts down past 1 and never halves.")


def _misplaced(answer: dict[str, Any]) -> str:
    """A message for a section's key written at the config's top level, where DeepSpeed ignores it; "" if none."""
    for section, keys in _SECTION_KEYS.items():
        for key in keys:
            if key in answer:
                return _("{key!r} is at the top level of the config, where DeepSpeed does not look for it: it "
                         "belongs inside the {section!r} section.").format(key=key, section=section)
    return ""


def _grade_config(answer: Any) -> tuple[bool, str]:
    from labkit import zero

    s = CONFIG_SETUP
    if not isinstance(answer, dict):
        return False, FormatSlip(_("Give the DeepSpeed config as a dict (zero.config(...) builds one)."))
    misplaced = _misplaced(answer)
    if misplaced:
        return False, misplaced
    fp16 = answer.get("fp16", {})
    if isinstance(fp16, dict) and fp16.get("hysteresis") == 0:
        return False, _(_HYSTERESIS_ZERO)
    try:
        zero.validate(answer, world_size=s["world_size"])
    except (TypeError, ValueError) as exc:
        return False, _("labkit.zero.validate rejects it: {error}").format(error=exc)
    zo = answer.get("zero_optimization", {})
    power = fp16.get("initial_scale_power")
    checks = [
        (zo.get("stage") == s["stage"], N_("zero_optimization.stage should shard parameters too.")),
        (fp16.get("enabled") is True and not answer.get("bf16", {}).get("enabled", False),
         N_("the setup trains in fp16 (fp16.enabled true, no bf16).")),
        (fp16.get("loss_scale", 0) == 0, N_("dynamic loss scaling is fp16.loss_scale = 0.")),
        (power != 2 ** s["initial_scale_power"], N_("initial_scale_power is the exponent k of the starting scale "
                                                    "2**k, not the scale itself.")),
        (fp16.get("initial_scale_power") == s["initial_scale_power"], N_("the scale starts at 2**12.")),
        (fp16.get("min_loss_scale", 1) < 2 ** s["initial_scale_power"],
         N_("min_loss_scale is the floor the scale never drops below, not where it starts: at the starting scale or "
            "above it, the scale could never halve.")),
        (fp16.get("hysteresis") == s["hysteresis"], _CONFIG_WHY),
        (fp16.get("loss_scale_window") == s["loss_scale_window"], N_("doubling after 500 clean steps.")),
        (answer.get("train_micro_batch_size_per_gpu") == s["micro_batch"], N_("micro-batch per GPU is 2.")),
        (answer.get("gradient_accumulation_steps") == s["grad_accum"], N_("4 accumulation steps.")),
        (answer.get("train_batch_size") == s["micro_batch"] * s["grad_accum"] * s["world_size"],
         N_("train_batch_size = micro x accumulation x GPUs.")),
        (answer.get("gradient_clipping") == s["gradient_clipping"], N_("clip the gradient norm at 1.0.")),
        (zo.get("overlap_comm") is True, N_("overlap_comm should be on.")),
    ]
    for ok, why in checks:
        if not ok:
            return False, _(why)
    return True, ""


def _reference_config() -> dict[str, Any]:
    from labkit import zero

    s = CONFIG_SETUP
    return zero.config(s["stage"], "fp16", micro_batch=s["micro_batch"], grad_accum=s["grad_accum"],
                       world_size=s["world_size"], initial_scale_power=s["initial_scale_power"],
                       hysteresis=s["hysteresis"], loss_scale_window=s["loss_scale_window"],
                       gradient_clipping=s["gradient_clipping"], overlap_comm=s["overlap_comm"])


def _wrong_config() -> dict[str, Any]:
    """A typical mistake: DeepSpeed's default hysteresis (2) left in place of the asked-for 1."""
    cfg = _reference_config()
    cfg["fp16"] = {**cfg["fp16"], "hysteresis": 2}
    return cfg


_COMM_WHY = N_("That counts one micro-batch per step. A ZeRO-2 rank keeps only its slice of the gradients, so it "
               "cannot hold on to the other ranks' parts until the last micro-batch: it has to reduce-scatter the "
               "gradients of every micro-batch. Stage 3 also gathers the weights for every micro-batch's forward and "
               "backward.")


#: 10.comm-volume: micro-batches accumulated per optimizer step
COMM_MICRO_BATCHES = 4


def _grade_comm(answer: Any) -> tuple[bool, str]:
    if not isinstance(answer, (tuple, list)) or len(answer) != 3:
        return False, FormatSlip(_("Give a triple (ZeRO-1, ZeRO-2, ZeRO-3 volume per optimizer step), "
                                   "in units of Ψ."))
    if any(isinstance(a, bool) or not isinstance(a, numbers.Real) or type(a).__name__ == "bool_"
           or not math.isfinite(float(a)) for a in answer):
        return False, FormatSlip(_("All three volumes are numbers (multiples of Ψ)."))
    s1, s2, s3 = (float(a) for a in answer)
    k = COMM_MICRO_BATCHES
    if (s1, s2, s3) == (2.0, k + 1.0, 3.0 * k):
        return True, ""
    if (s1, s2, s3) == (2.0, 2.0, 3.0):
        return False, _(_COMM_WHY)
    if s1 == 3.0 or s2 == 2.0 * k + 1.0:
        return False, _("You counted an all-reduce (2Ψ) for the gradients, as DeepSpeed's bucket all-reduce moves; the "
                        "ZeRO paper's count, which the question asks for, uses a reduce-scatter (Ψ).")
    if s1 != 2.0:
        if s1 in (2.0 * k, k + 1.0, float(k)):
            return False, _("Stage 1 holds the whole gradient on every rank, so it adds the micro-batches up locally, "
                            "as DDP does under no_sync(), and reduces once per step.")
        if s1 == 1.0:
            return False, _("Stage 1 also has to hand the updated weights back: a reduce-scatter of the gradients (Ψ) "
                            "and an all-gather of the weights (Ψ).")
        return False, _("Stage 1: which collectives does a rank that holds the whole gradient need, and how often?")
    if s2 == 2.0:
        return False, _("Stage 2 counts one micro-batch per step: a ZeRO-2 rank keeps only its slice of the gradients, "
                        "so it cannot hold on to the other ranks' parts until the last micro-batch.")
    if s2 == 2.0 * k:
        return False, _("The updated weights are all-gathered once, after the optimizer step, not after every "
                        "micro-batch.")
    if s2 == float(k):
        return False, _("Count the all-gather of the updated weights after the step too.")
    if s2 != k + 1.0:
        return False, _("Stage 2: which collective happens on every micro-batch, and which once per step?")
    if s3 == 2.0 * k:
        return False, _("In the paper's analysis stage 3 gathers the weights twice per micro-batch, before its forward "
                        "and again before its backward (DeepSpeed keeps them gathered in between only for small "
                        "models), and it reduce-scatters its gradients too.")
    if s3 == 3.0 * k + 1.0:
        return False, _("Stage 3 does no all-gather after the step: each rank keeps its updated shard, and the next "
                        "forward gathers it.")
    if s3 == 4.0 * k:
        return False, _("Stage 3 reduce-scatters its gradients (Ψ), it does not all-reduce them (2Ψ).")
    if s3 == 3.0:
        return False, _("Stage 3 gathers and reduces for every micro-batch, not once per step.")
    return False, _("Stage 3: which collectives does each micro-batch need, in forward and in backward?")


# ---- 10.stage2-grads: predict, then run ------------------------------------------------------------
#: What the learner predicts about each rank's measured ZeRO-2 gradient bytes, against 2 bytes × ceil(Ψ/2).
STAGE2_OUTCOMES: tuple[str, ...] = ("equal", "more", "less")
_STAGE2_WHY = N_("ZeRO-2 shards the gradients by element, Ψ/N each, but DeepSpeed accumulates them per parameter "
                 "tensor: a rank keeps whole every tensor that touches its slice of the flattened model. The tensor "
                 "the slice boundary cuts through is kept whole on both ranks, so both hold more than Ψ/N.")


def _grade_stage2(answer: object) -> tuple[bool, str]:
    got = pair(answer)
    if got is None:
        return False, NOT_A_PAIR
    pred, result = got
    pred = pred.strip().lower() if isinstance(pred, str) else pred
    if pred not in STAGE2_OUTCOMES:
        return False, FormatSlip(_("Predict one of {outcomes}.").format(outcomes=list(STAGE2_OUTCOMES)))
    if result not in (*STAGE2_OUTCOMES, "mixed"):
        raise ValueError(_("the measured outcome must be one of {outcomes}, got {result!r}").format(
            outcomes=STAGE2_OUTCOMES + ("mixed",), result=result))
    if pred == result == "more":
        return True, _("Both ranks keep more: DeepSpeed accumulates gradients for whole parameter tensors, and the "
                       "tensor the slice boundary cuts through is kept whole on both. With thousands of tensors "
                       "that is noise; with 29 it shows.")
    if pred == result:
        return True, _("Your prediction matches what the ranks measured.")
    if pred == "equal" and result == "more":
        return False, _(_STAGE2_WHY)
    if pred == "less":
        return False, _("Sharding never leaves a rank with less than its slice: the extra comes from tensors kept "
                        "whole at the slice boundaries.") + " " + _(_STAGE2_WHY)
    return False, _("The ranks measured {result!r}.").format(result=result) + " " + _(_STAGE2_WHY)


# ---- 10.batch-triple: debug -------------------------------------------------------------------------
_TRIPLE_WHY = N_("global_batch // micro_batch forgets the ranks: each of the world_size ranks contributes micro_batch "
                 "examples per micro-step, so DeepSpeed requires train_batch_size = micro × accumulation × "
                 "world_size.")


_TRIPLE_NO_MICRO = N_("global_batch // world_size forgets the micro-batch: each accumulation step runs micro_batch "
                      "examples on every rank, not one.")


def _reference_batch_keys(global_batch: int, micro_batch: int, world_size: int) -> dict[str, int]:
    accum, rest = divmod(global_batch, micro_batch * world_size)
    if rest or accum < 1:
        raise ValueError(f"global batch {global_batch} is not a multiple of {micro_batch} x {world_size}")
    return {"train_batch_size": global_batch, "train_micro_batch_size_per_gpu": micro_batch,
            "gradient_accumulation_steps": accum}


def _broken_batch_keys(global_batch: int, micro_batch: int, world_size: int) -> dict[str, int]:
    """The snippet of the exercise: the accumulation steps computed without the ranks."""
    return {"train_batch_size": global_batch, "train_micro_batch_size_per_gpu": micro_batch,
            "gradient_accumulation_steps": global_batch // micro_batch}


def _grade_triple(fn: Any) -> tuple[bool, str] | None:
    if not callable(fn):
        return False, FormatSlip(_("Define batch_keys(global_batch, micro_batch, world_size) and pass the "
                                   "function itself."))
    from labkit import zero

    for gb, mb, ws in ((256, 8, 16), (1024, 4, 8), (96, 2, 3), (64, 64, 1), (4096, 16, 256)):
        got = fn(gb, mb, ws)
        if got is None or got is Ellipsis:
            return None  # still a stub: "not attempted yet"
        if not isinstance(got, dict):
            return False, FormatSlip(_("Return a dict with DeepSpeed's three batch keys."))
        try:
            zero.validate({**got, "zero_optimization": {"stage": 2}}, world_size=ws)
        except (TypeError, ValueError) as exc:
            if got.get("gradient_accumulation_steps") == gb // mb and ws > 1:
                return False, _(_TRIPLE_WHY)
            if got.get("gradient_accumulation_steps") == gb // ws and mb > 1:
                return False, _(_TRIPLE_NO_MICRO)
            return False, _("batch_keys({gb}, {mb}, {ws}): labkit.zero.validate rejects it: {error}").format(
                gb=gb, mb=mb, ws=ws, error=exc)
        if got.get("train_batch_size") != gb or got.get("train_micro_batch_size_per_gpu") != mb:
            return False, _("batch_keys({gb}, {mb}, {ws}) must keep the global batch {gb} and the micro-batch "
                            "{mb}.").format(gb=gb, mb=mb, ws=ws)
    # 100 is not even a multiple of the micro-batch; 48 is one, but not of micro-batch × ranks
    for gb, mb, ws in ((100, 8, 4), (48, 8, 4)):
        try:
            got = fn(gb, mb, ws)
        except ValueError:
            continue
        except AssertionError:
            return False, _("An assert is not a refusal to count on: python -O removes it, and callers catch "
                            "ValueError. Raise ValueError for a global batch that cannot be split.")
        if gb % mb == 0:
            return False, _("batch_keys({gb}, {mb}, {ws}) returned {got!r}: {gb} is a multiple of the micro-batch "
                            "{mb} but not of {mb} × {ws} = {product}, the examples of one micro-step on all ranks. "
                            "Refuse what micro_batch × world_size does not divide.").format(
                gb=gb, mb=mb, ws=ws, got=got, product=mb * ws)
        return False, _("batch_keys({gb}, {mb}, {ws}) returned {got!r}: {gb} is not a multiple of {mb} × {ws} = "
                        "{product}, and rounding silently trains with another global batch. Raise ValueError "
                        "instead.").format(gb=gb, mb=mb, ws=ws, got=got, product=mb * ws)
    return True, _("Every triple multiplies out, and a global batch that cannot be split is refused.")


def _measure_stage2_grads() -> Any:
    """How each rank's gradient bytes at ZeRO-2 (bf16) compare with an even split, 2 x ceil(Ψ/2), in the last
    DeepSpeed run rank 0 reported to labkit.dist.launch (the experiment of 10.stage2-grads); NOT_MEASURED before
    that launch has run in this kernel."""
    from labkit.dist import _last_result

    def stage2_bf16(res: Any) -> Any:
        return next((r for r in res.get("runs", []) if (r["stage"], r["offload"], r["dtype"]) == (2, "none", "bf16")),
                    None)

    res = _last_result("labkit.recipes.zero", lambda nproc, argv, res: nproc == 2 and stage2_bf16(res) is not None)
    if res is None:
        return NOT_MEASURED
    run = stage2_bf16(res)
    half = 2 * -(-run["n_params"] // 2)
    grads = [b["bytes"]["grads"] for b in run["bytes_per_rank"]]
    return ("more" if min(grads) > half else "equal" if grads == [half, half] else
            "less" if max(grads) < half else "mixed")


EXERCISES = [
    Exercise(
        id="10.config",
        prompt="Write the DeepSpeed config for the setup described in the notebook (ZeRO-3, fp16 dynamic "
               "scaling from 2**12, hysteresis 1, window 500, micro-batch 2, 4 accumulation steps, 16 GPUs, "
               "clipping 1.0, overlap_comm).",
        grade=_grade_config,
        hint="Go through the setup phrase by phrase and find the config key for each (zero.explain shows them all).",
        method="zero.config(stage, dtype, ...) takes micro_batch, grad_accum, world_size and the fp16 knobs: "
               "initial_scale_power (k in 2**k), hysteresis (the overflow that halves: h-1 are tolerated), "
               "loss_scale_window (clean steps before doubling), gradient_clipping, overlap_comm.",
        solution="zero.config(3, 'fp16', micro_batch=2, grad_accum=4, world_size=16, initial_scale_power=12, "
                 "hysteresis=1, loss_scale_window=500, gradient_clipping=1.0, overlap_comm=True)",
        kind="design", wrong_why=_CONFIG_WHY,
        success="DeepSpeed would accept it, and every knob says what the setup asks.",
        reference=_reference_config(),
        wrong=_wrong_config(),
    ),
    Exercise(
        id="10.comm-volume",
        prompt="A step accumulates 4 micro-batches. Per optimizer step, how much data does each rank move at ZeRO-1, "
               "ZeRO-2 and ZeRO-3, in units of the parameter count Ψ (the ZeRO paper's analysis: a reduce-scatter "
               "or an all-gather of Ψ elements counts Ψ; stage 3 gathers the weights before each forward and again "
               "before each backward)? Give a triple.",
        grade=_grade_comm,
        hint="Ask, for each stage, which collectives happen on every micro-batch and which once per step.",
        method="A rank that holds the whole gradient can accumulate locally and reduce once. A rank that holds only "
               "its slice must reduce-scatter every micro-batch's gradients. The updated weights are all-gathered "
               "once, after the step. Stage 3 gathers the weights before each micro-batch's forward and again "
               "before its backward.",
        solution="(2, 5, 12): ZeRO-1 = reduce-scatter Ψ + all-gather Ψ once per step; ZeRO-2 = 4 reduce-scatters "
                 "+ 1 all-gather = 5Ψ; ZeRO-3 = 4 × (2 all-gathers + 1 reduce-scatter) = 12Ψ.",
        kind="compute", wrong_why=_COMM_WHY,
        success="2Ψ, 5Ψ and 12Ψ: accumulation is free for ZeRO-1 (and DDP), not for ZeRO-2 and ZeRO-3.",
        reference=(2, 5, 12),
        wrong=(2, 2, 3),
    ),
    Exercise(
        id="10.stage2-grads",
        prompt="Predict, then run: at ZeRO-2 on 2 ranks, does each rank's measured gradient memory equal 2 bytes "
               "× Ψ/2, or is it more, or less? ('equal', 'more' or 'less')",
        grade=_grade_stage2,
        hint="The table says what stage 2 shards. Ask at what granularity DeepSpeed really keeps gradients.",
        method="The flattened parameters are cut into two slices of Ψ/2 elements. DeepSpeed accumulates gradients "
               "per parameter tensor. What happens to the tensor that the cut goes through?",
        solution="prediction = 'more': the tensor cut by the slice boundary is kept whole on both ranks "
                 "(labkit.zero.partition_layout predicts the bytes exactly).",
        kind="predict", wrong_why=_STAGE2_WHY,
        reference=("more", "more"), wrong=("equal", "more"),
        measure=_measure_stage2_grads,
    ),
    Exercise(
        id="10.batch-triple",
        prompt="Debug: batch_keys(global_batch, micro_batch, world_size) writes DeepSpeed batch keys that DeepSpeed "
               "rejects on more than one GPU. Write a fixed batch_keys.",
        grade=_grade_triple,
        hint="Multiply the micro-batch, the accumulation steps it returns and world_size, and compare with train_batch_size.",
        method="DeepSpeed checks train_batch_size == train_micro_batch_size_per_gpu × gradient_accumulation_steps × "
               "world_size. Solve for the accumulation steps, and refuse inputs where it is not a whole number.",
        solution="accum, rest = divmod(global_batch, micro_batch * world_size)\nif rest: raise ValueError(...)\n"
                 "return {'train_batch_size': global_batch, 'train_micro_batch_size_per_gpu': micro_batch, "
                 "'gradient_accumulation_steps': accum}",
        kind="debug", wrong_why=_TRIPLE_WHY,
        reference=_reference_batch_keys, wrong=_broken_batch_keys,
    ),
]
