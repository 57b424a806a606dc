"""Exercises of notebook 06 (where memory goes). Introduced in notebook 06."""

from __future__ import annotations

from labkit import memory as M
from labkit.exercises._core import Exercise, number_grader
from labkit.exercises._zero import stage2_shards_params, zero_bytes_grader

__all__ = ["EXERCISES"]




def _bytes_per_param(answer: object) -> tuple[bool, str]:
    ok, msg = number_grader(M.bytes_per_param("bf16-master", "sgd-momentum"), "the bytes per parameter")(answer)
    if ok or msg:
        return ok, msg
    if float(answer) in (16.0, 18.0, 20.0):  # type: ignore[arg-type]
        return False, "That is an Adam figure; SGD with momentum keeps one state, not two."
    return False, ""


def _smallest_stage(answer: object) -> tuple[bool, str]:
    want = M.smallest_fitting_stage(7 * 10**9, 32 * M.GB, 8, "bf16-master", "adam")
    if isinstance(answer, bool) or not isinstance(answer, int):
        return False, "Give the stage as an int (0, 1, 2 or 3)."
    if answer == want:
        return True, ""
    per_gpu = M.model_state_bytes(7 * 10**9, "bf16-master", "adam", stage=answer, world_size=8).device_total \
        if answer in (0, 1, 2, 3) else None
    if per_gpu is not None and per_gpu > 32 * M.GB:
        return False, f"At stage {answer} a GPU holds {M.fmt_bytes(per_gpu)}: more than 32 GB."
    return False, "A smaller stage already fits."


def _reference_per_gpu(n_params: int, stage: int, world_size: int) -> float:
    psi, n = n_params, world_size
    return [16 * psi, 4 * psi + 12 * psi / n, 2 * psi + 14 * psi / n, 16 * psi / n][stage]


_per_gpu_function = zero_bytes_grader("per_gpu_bytes", seed=6, fixed=[(7_500_000_000, s, 64) for s in range(4)],
                                      success="It reproduces the ZeRO paper's 120 / 31.4 / 16.6 / 1.9 GB.")


EXERCISES = [
    Exercise("06.bytes-per-param",
             "Bytes per parameter of model state: bf16 weights and bf16 grads, fp32 master weights, "
             "SGD with momentum (fp32), no ZeRO.",
             _bytes_per_param,
             "Add 2 (bf16 weights) + 2 (bf16 grads) + 4 (fp32 master) + 4 per fp32 optimizer state.",
             reference=2 + 2 + 4 + 4, wrong=16),
    Exercise("06.smallest-stage",
             "Smallest ZeRO stage at which the model states of a 7B model (16 B/param, Adam) fit on "
             "8 GPUs of 32 GB each.",
             _smallest_stage,
             "Per GPU: stage 1 = 4Ψ + 12Ψ/N, stage 2 = 2Ψ + 14Ψ/N, stage 3 = 16Ψ/N, with Ψ = 7e9, N = 8.",
             reference=2, wrong=1),
    Exercise("06.zero-per-gpu",
             "A function per_gpu_bytes(n_params, stage, world_size) giving the ZeRO paper's per-GPU "
             "model-state bytes (16 B/param: 2 + 2 + K, K = 12).",
             _per_gpu_function,
             "Stage 0: 16Ψ. Stage 1 shards K: (2 + 2)Ψ + KΨ/N. Stage 2 also the grads: 2Ψ + (2 + K)Ψ/N. "
             "Stage 3 everything: 16Ψ/N.",
             reference=_reference_per_gpu, wrong=stage2_shards_params(_reference_per_gpu)),
]
