"""Exercises of notebook 09 (DDP and communication). Introduced in notebook 09."""

from __future__ import annotations

import math
import random

from labkit.exercises._core import Exercise
from labkit.recipes import allreduce as _ar

__all__ = ["EXERCISES"]

# The configuration the first two exercises ask about.
NODES, GPUS_PER_NODE, MICRO_BATCH, ACCUM = 4, 8, 16, 4
BASE_LR, BASE_BATCH = 3e-4, 256
GLOBAL_BATCH = NODES * GPUS_PER_NODE * MICRO_BATCH * ACCUM  # 2048
SCALED_LR = BASE_LR * GLOBAL_BATCH / BASE_BATCH  # 2.4e-3


def _grade_global_batch(answer: object) -> tuple[bool, str]:
    if isinstance(answer, bool) or not isinstance(answer, (int, float)):
        return False, "Give the global batch as a number of examples."
    if answer == GLOBAL_BATCH:
        return True, ""
    if answer in (GLOBAL_BATCH // ACCUM, GLOBAL_BATCH // NODES):
        return False, (f"{answer} is {GLOBAL_BATCH // answer} times too small: count every rank of every node, and "
                       f"all {ACCUM} micro-batches that an optimizer step accumulates.")
    return False, ""


def _grade_lr(answer: object) -> tuple[bool, str]:
    if isinstance(answer, bool) or not isinstance(answer, (int, float)):
        return False, "Give the learning rate as a number."
    if math.isclose(float(answer), SCALED_LR, rel_tol=1e-9):
        return True, ""
    if math.isclose(float(answer), BASE_LR * math.sqrt(GLOBAL_BATCH / BASE_BATCH), rel_tol=1e-9):
        return False, "That is the square-root rule (used with Adam by some); the exercise asks for the linear rule."
    return False, ""


def _reference_busbw(algbw: float, n: int) -> float:
    return algbw * 2 * (n - 1) / n


def _busbw_one_way(algbw: float, n: int) -> float:
    """A typical mistake: counting only the reduce-scatter half of a ring all-reduce."""
    return algbw * (n - 1) / n


def _grade_busbw(answer: object) -> tuple[bool, str] | None:
    if not callable(answer):
        return False, "Define a function busbw(algbw, n) and pass the function itself."
    rng = random.Random(8)
    cases = [(100.0, 1), (100.0, 2), (120.0, 8), (0.5, 3)] + [
        (rng.uniform(0.1, 500.0), rng.randint(1, 1024)) for _ in range(20)]
    for algbw, n in cases:
        got = answer(algbw, n)
        if got is None or got is Ellipsis:
            return None  # still a stub: "not attempted yet"
        want = _ar.busbw(algbw, n)
        if not isinstance(got, (int, float)) or not math.isclose(float(got), want, rel_tol=1e-9, abs_tol=1e-12):
            return False, f"busbw({algbw:.3g}, {n}) returned {got!r}; expected {want:.6g}."
    return True, ""


def _grade_slow_rank(answer: object) -> tuple[bool, str]:
    if isinstance(answer, bool) or not isinstance(answer, (int, float)):
        return False, "Give the step time in milliseconds, as a number."
    if math.isclose(float(answer), 180.0, abs_tol=1e-9):
        return True, ""
    if math.isclose(float(answer), 140.0, abs_tol=1e-9):
        return False, "That is the average rank; a synchronous all-reduce waits for the slowest one."
    if math.isclose(float(answer), 160.0, abs_tol=1e-9):
        return False, "The all-reduce itself still takes its time after the slowest rank arrives."
    return False, ""


EXERCISES = [
    Exercise("09.global-batch",
             f"{NODES} nodes × {GPUS_PER_NODE} GPUs, micro-batch {MICRO_BATCH} per GPU, {ACCUM} accumulation "
             "steps: the global batch per optimizer step.",
             _grade_global_batch,
             "global batch = micro-batch per rank × number of ranks × accumulation steps.",
             success=f"{MICRO_BATCH} × {NODES * GPUS_PER_NODE} × {ACCUM} = {GLOBAL_BATCH}.",
             reference=GLOBAL_BATCH, wrong=GLOBAL_BATCH // ACCUM),
    Exercise("09.lr-scaling",
             f"A recipe tuned with lr {BASE_LR:g} at global batch {BASE_BATCH}: the lr for the global batch of "
             "09.global-batch under the linear scaling rule.",
             _grade_lr,
             "Linear scaling: the learning rate grows in proportion to the global batch (and usually gets a warm-up).",
             success=f"{BASE_LR:g} × {GLOBAL_BATCH}/{BASE_BATCH} = {SCALED_LR:g}.",
             reference=SCALED_LR, wrong=BASE_LR * math.sqrt(GLOBAL_BATCH / BASE_BATCH)),
    Exercise("09.busbw",
             "Write busbw(algbw, n): the all-reduce bus bandwidth nccl-tests reports for n ranks.",
             _grade_busbw,
             "A ring all-reduce sends and receives 2(n-1)/n of the message per rank: busbw = algbw × 2(n-1)/n "
             "(0 for one rank).",
             success="busbw no longer depends on n, so it can be compared with the link's bandwidth.",
             reference=_reference_busbw, wrong=_busbw_one_way),
    Exercise("09.slow-rank",
             "Three ranks need 100, 100 and 160 ms of compute per step and the all-reduce takes 20 ms once "
             "everyone has arrived: the step time in ms.",
             _grade_slow_rank,
             "Every rank waits in the all-reduce for the slowest one, then all of them pay for the all-reduce.",
             success="160 + 20 = 180 ms: two ranks idle 60 ms per step. One slow rank slows the whole job.",
             reference=180.0, wrong=140.0),
]
