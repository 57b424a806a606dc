"""Exercises of notebook 10 (DeepSpeed and ZeRO). Introduced in notebook 10."""

from __future__ import annotations

import math
from typing import Any

from labkit.exercises._core import Exercise
from labkit.exercises._zero import stage2_shards_params, zero_bytes_grader

__all__ = ["CONFIG_SETUP", "EXERCISES"]

#: The setup exercise 10.config describes (the notebook prints it).
CONFIG_SETUP = {
    "world_size": 16, "stage": 3, "micro_batch": 2, "grad_accum": 4, "initial_scale_power": 12,
    "hysteresis": 1, "loss_scale_window": 500, "gradient_clipping": 1.0, "overlap_comm": True,
}


def _grade_config(answer: Any) -> tuple[bool, str]:
    from labkit import zero

    s = CONFIG_SETUP
    if not isinstance(answer, dict):
        return False, "Give the DeepSpeed config as a dict (zero.config(...) builds one)."
    try:
        zero.validate(answer, world_size=s["world_size"])
    except (TypeError, ValueError) as exc:
        return False, f"labkit.zero.validate rejects it: {exc}"
    zo = answer.get("zero_optimization", {})
    fp16 = answer.get("fp16", {})
    checks = [
        (zo.get("stage") == s["stage"], "zero_optimization.stage should shard parameters too"),
        (fp16.get("enabled") is True and not answer.get("bf16", {}).get("enabled", False),
         "the setup trains in fp16 (fp16.enabled true, no bf16)"),
        (fp16.get("loss_scale", 0) == 0, "dynamic loss scaling is fp16.loss_scale = 0"),
        (fp16.get("initial_scale_power") == s["initial_scale_power"], "the scale starts at 2**12"),
        (fp16.get("hysteresis") == s["hysteresis"], "halving at the first overflow is hysteresis 1"),
        (fp16.get("loss_scale_window") == s["loss_scale_window"], "doubling after 500 clean steps"),
        (answer.get("train_micro_batch_size_per_gpu") == s["micro_batch"], "micro-batch per GPU is 2"),
        (answer.get("gradient_accumulation_steps") == s["grad_accum"], "4 accumulation steps"),
        (answer.get("train_batch_size") == s["micro_batch"] * s["grad_accum"] * s["world_size"],
         "train_batch_size = micro x accumulation x GPUs"),
        (answer.get("gradient_clipping") == s["gradient_clipping"], "clip the gradient norm at 1.0"),
        (zo.get("overlap_comm") is True, "overlap_comm should be on"),
    ]
    for ok, why in checks:
        if not ok:
            return False, why + "."
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


def _reference_per_rank(n_params: int, stage: int, world_size: int) -> int:
    shard = -(-n_params // world_size)
    return (2 * (shard if stage >= 3 else n_params) + 2 * (shard if stage >= 2 else n_params)
            + 12 * (shard if stage >= 1 else n_params))


_grade_per_rank = zero_bytes_grader(
    "per_rank_bytes", seed=9, fixed=[(1_300_000_000, 2, 8), (1_300_000_000, 3, 8), (7 * 10**9, 0, 64),
                                     (7_500_000_000, 1, 64)])


def _grade_comm(answer: Any) -> tuple[bool, str]:
    if not isinstance(answer, (tuple, list)) or len(answer) != 2:
        return False, "Give a pair (stage-2 volume, stage-3 volume), in units of the parameter count."
    if any(isinstance(a, bool) or not isinstance(a, (int, float)) for a in answer):
        return False, "Both volumes are numbers."
    s2, s3 = (float(a) for a in answer)
    if math.isclose(s2, 2.0) and math.isclose(s3, 3.0):
        return True, ""
    if math.isclose(s2, 1.0):
        return False, "A reduce-scatter of the gradients is Ψ, but the updated parameters must come back too."
    if math.isclose(s3, 2.0):
        return False, "Stage 3 gathers the parameters twice (forward and backward) on top of the reduce-scatter."
    return False, ""


EXERCISES = [
    Exercise(
        id="10.config",
        prompt="Write the DeepSpeed config for the setup described in the notebook (ZeRO-3, fp16 dynamic "
               "scaling from 2**12, hysteresis 1, window 500, micro-batch 2, 4 accumulation steps, 16 GPUs, "
               "clipping 1.0, overlap_comm).",
        grade=_grade_config,
        hint="zero.config(stage, 'fp16', micro_batch=..., grad_accum=..., world_size=..., "
             "initial_scale_power=..., hysteresis=..., loss_scale_window=..., overlap_comm=True) builds it.",
        success="DeepSpeed would accept it, and every knob says what the setup asks.",
        reference=_reference_config(),
        wrong=_wrong_config(),
    ),
    Exercise(
        id="10.per-rank-bytes",
        prompt="Write per_rank_bytes(n_params, stage, world_size): model-state bytes per GPU for bf16/fp16 "
               "mixed precision with Adam (the ZeRO paper's 2 + 2 + 12 bytes per parameter).",
        grade=_grade_per_rank,
        hint="Stage 1 divides the 12 optimizer bytes by the ranks, stage 2 also the 2 gradient bytes, stage 3 "
             "also the 2 parameter bytes; use ceil(n / world_size) elements per shard.",
        success="Stage 2 keeps 2 bytes/param whole; stage 3 divides everything.",
        reference=_reference_per_rank,
        wrong=stage2_shards_params(_reference_per_rank),
    ),
    Exercise(
        id="10.comm-volume",
        prompt="Per optimizer step, how much data does each rank move at ZeRO-2 and at ZeRO-3, in units of "
               "the parameter count Ψ (the ZeRO paper's analysis)?",
        grade=_grade_comm,
        hint="An all-reduce is a reduce-scatter (Ψ) plus an all-gather (Ψ). Which collectives does stage 3 "
             "add for its sharded parameters?",
        success="2Ψ, like plain DDP, and 3Ψ (1.5x) once the parameters are sharded too.",
        reference=(2, 3),
        wrong=(1, 3),
    ),
]
