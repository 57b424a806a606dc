"""Exercises of notebook 09 (DDP and communication). Introduced in notebook 09."""

from __future__ import annotations

import math
import random
import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch

from labkit.exercises._core import Exercise
from labkit.exercises._graders import NOT_A_PAIR, as_number, pair
from labkit.recipes import allreduce as _ar

__all__ = ["EXERCISES", "simulate_all_reduce"]

# The configuration the first two exercises ask about.
NODES, GPUS_PER_NODE, MICRO_BATCH, ACCUM = 4, 8, 16, 4
BASE_LR, BASE_BATCH = 3e-4, 256
GLOBAL_BATCH = NODES * GPUS_PER_NODE * MICRO_BATCH * ACCUM  # 2048
SCALED_LR = BASE_LR * GLOBAL_BATCH / BASE_BATCH  # 2.4e-3


_GLOBAL_WHY = (f"{GLOBAL_BATCH // ACCUM} = {MICRO_BATCH} × {NODES * GPUS_PER_NODE} ranks forgets the accumulation: "
               f"each optimizer step sums the gradients of {ACCUM} micro-batches on every rank, so it sees "
               f"{ACCUM} × {GLOBAL_BATCH // ACCUM} = {GLOBAL_BATCH} examples.")


def _grade_global_batch(answer: object) -> tuple[bool, str]:
    if isinstance(answer, bool) or not isinstance(answer, (int, float)):
        return False, "Give the global batch as a number of examples."
    if answer == GLOBAL_BATCH:
        return True, ""
    if answer == GLOBAL_BATCH // ACCUM:
        return False, _GLOBAL_WHY
    hints = {GLOBAL_BATCH // NODES: f"that is one node: count the ranks of all {NODES} nodes",
             GLOBAL_BATCH // GPUS_PER_NODE: f"each node runs one rank per GPU, {GPUS_PER_NODE} per node",
             MICRO_BATCH * ACCUM: "the micro-batch is per rank: multiply by every rank of every node",
             MICRO_BATCH: "the micro-batch is per rank and per micro-step, not the global batch"}
    return False, hints.get(int(answer), "") if float(answer).is_integer() else ""


_LR_WHY = ("That is the square-root rule (some use it with Adam). The linear rule scales the learning rate by the "
           f"batch ratio itself: {BASE_LR:g} × {GLOBAL_BATCH}/{BASE_BATCH} = {SCALED_LR:g}.")


def _grade_lr(answer: object) -> tuple[bool, str]:
    if isinstance(answer, bool) or not isinstance(answer, (int, float)):
        return False, "Give the learning rate as a number."
    if math.isclose(float(answer), SCALED_LR, rel_tol=1e-9):
        return True, ""
    if math.isclose(float(answer), BASE_LR * math.sqrt(GLOBAL_BATCH / BASE_BATCH), rel_tol=1e-9):
        return False, _LR_WHY
    if math.isclose(float(answer), BASE_LR, rel_tol=1e-9):
        return False, "That is the lr of the base recipe: the global batch grew 8-fold, so the lr must follow it."
    return False, ""


def _reference_busbw(algbw: float, n: int) -> float:
    return algbw * 2 * (n - 1) / n


def _busbw_one_way(algbw: float, n: int) -> float:
    """A typical mistake: counting only the reduce-scatter half of a ring all-reduce."""
    return algbw * (n - 1) / n


_BUSBW_WHY = ("(n-1)/n counts half of a ring all-reduce, the reduce-scatter. The all-gather that follows moves as "
              "much again, so each rank sends (and receives) 2(n-1)/n of the message: busbw = algbw × 2(n-1)/n.")


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
            if isinstance(got, (int, float)) and n > 1 and math.isclose(float(got), want / 2, rel_tol=1e-9):
                return False, _BUSBW_WHY
            return False, f"busbw({algbw:.3g}, {n}) returned {got!r}; expected {want:.6g}."
    return True, ""


_SLOW_WHY = ("140 ms is the average rank. A synchronous all-reduce cannot finish before the slowest rank arrives "
             "(160 ms) and then takes its 20 ms, for every rank: 180 ms, with two ranks idle for 60 ms.")


def _grade_slow_rank(answer: object) -> tuple[bool, str]:
    if isinstance(answer, bool) or not isinstance(answer, (int, float)):
        return False, "Give the step time in milliseconds, as a number."
    if math.isclose(float(answer), 180.0, abs_tol=1e-9):
        return True, ""
    if math.isclose(float(answer), 140.0, abs_tol=1e-9):
        return False, _SLOW_WHY
    if math.isclose(float(answer), 160.0, abs_tol=1e-9):
        return False, "The all-reduce itself still takes its time after the slowest rank arrives."
    if math.isclose(float(answer), 120.0, abs_tol=1e-9):
        return False, "A fast rank waits in the all-reduce for the slowest one: it cannot finish at 100 + 20 ms."
    return False, ""


# ---- 09.allreduce-count: predict, then run ----------------------------------------------------------
_COUNT_WHY = ("48 is one all-reduce per micro-batch, what DDP does without no_sync(). Inside ddp.no_sync() the "
              "gradients just add up locally, and only the last micro-batch of each optimizer step all-reduces: "
              "12 optimizer steps, 12 all-reduces, each carrying the whole accumulated gradient.")


def _grade_count(answer: object) -> tuple[bool, str]:
    got = pair(answer)
    if got is None:
        return False, NOT_A_PAIR
    pred, result = (as_number(v) for v in got)
    if pred is None:
        return False, "Predict the number of all-reduces per rank."
    if result is None:
        raise ValueError(f"the measured count must be a number, got {got[1]!r}")
    if pred == result:
        return True, ("One all-reduce per optimizer step: no_sync() keeps the first 3 micro-batches' gradients "
                      "local, and the 4th all-reduces the sum. Same traffic as without accumulation.")
    if pred == 4 * result:
        return False, _COUNT_WHY
    if pred == 2 * result or pred == 8 * result:
        return False, ("Count per rank: an all-reduce is one collective call that every rank makes together, not "
                       "one per pair of ranks.")
    return False, f"Each rank issued {result:g}. {_COUNT_WHY}"


# ---- 09.average-grads: debug ------------------------------------------------------------------------
_AVG_WHY = ("all_reduce sums: after it every rank holds the *sum* of the ranks' gradients, world_size times the "
            "mean. Stepping with the sum is like multiplying the learning rate by the number of ranks. Divide by "
            "world_size, before or after the sum: DDP scales each gradient bucket by 1/world_size before its "
            "all-reduce (notebook 11 shows it), which also keeps an fp16 sum from overflowing.")


def _rank_all_reduce(group: dict[str, Any], rank: int) -> Callable[..., None]:
    """The all_reduce of one simulated rank: sums (or averages) ``tensor`` in place across all ranks."""
    from torch.distributed import ReduceOp

    def all_reduce(tensor: torch.Tensor, op: Any = None, group_: Any = None, async_op: bool = False) -> None:
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"all_reduce takes a tensor, got {type(tensor).__name__}")
        if op not in (None, ReduceOp.SUM, ReduceOp.AVG):
            raise ValueError(f"this simulated all_reduce supports ReduceOp.SUM and ReduceOp.AVG, not {op!r}")
        barrier: threading.Barrier = group["barrier"]
        group["slots"][rank] = tensor
        barrier.wait()
        parts = group["slots"]
        if any(p.shape != tensor.shape for p in parts):
            barrier.abort()
            raise ValueError("the ranks all-reduced tensors of different shapes: call it in the same order everywhere")
        total = torch.stack([p.detach().clone() for p in parts]).sum(0)
        barrier.wait()  # every rank has read the inputs before any rank writes its result
        tensor.copy_(total / len(parts) if op is ReduceOp.AVG else total)
    return all_reduce


def simulate_all_reduce(fn: Callable[..., Any],
                        local_grads: Sequence[Sequence[torch.Tensor]]) -> list[list[torch.Tensor]]:
    """Run ``fn(params, world_size, all_reduce)`` once per simulated rank, in threads; return each rank's gradients.

    ``local_grads[r]`` are rank r's gradients, one tensor per parameter (the same shapes on every rank). Each rank
    gets parameters whose ``.grad`` holds a copy of its gradients, and an ``all_reduce(tensor, op=None)`` that sums
    the tensor in place across all ranks, as ``torch.distributed.all_reduce`` does (``ReduceOp.AVG`` averages).
    Returns the ``.grad`` of every rank's parameters after ``fn``. An exception in any rank is raised here.
    Introduced in notebook 09.
    """
    if not callable(fn):
        raise TypeError(f"fn must be a function fn(params, world_size, all_reduce), got {type(fn).__name__}")
    if isinstance(local_grads, (str, bytes)) or not isinstance(local_grads, Sequence) or not local_grads:
        raise TypeError("local_grads must be a non-empty list (one entry per rank) of lists of tensors")
    ranks = [list(g) if isinstance(g, Sequence) and not isinstance(g, (str, bytes)) else None for g in local_grads]
    if any(r is None or not r or not all(isinstance(t, torch.Tensor) and t.is_floating_point() for t in r)
           for r in ranks):
        raise TypeError("each rank's entry must be a non-empty list of floating-point tensors")
    shapes = [[t.shape for t in r] for r in ranks]  # type: ignore[union-attr]
    if any(s != shapes[0] for s in shapes):
        raise ValueError("every rank must have gradients of the same shapes")
    n = len(ranks)
    group: dict[str, Any] = {"barrier": threading.Barrier(n, timeout=20), "slots": [None] * n}
    params = [[torch.nn.Parameter(torch.zeros_like(t)) for t in r] for r in ranks]  # type: ignore[union-attr]
    for ps, r in zip(params, ranks):
        for p, t in zip(ps, r):  # type: ignore[arg-type]
            p.grad = t.detach().clone()
    errors: list[BaseException] = []

    def run(rank: int) -> None:
        try:
            fn(params[rank], n, _rank_all_reduce(group, rank))
        except BaseException as exc:  # handed to the caller below
            errors.append(exc)
            group["barrier"].abort()  # the other ranks stop waiting for this one

    threads = [threading.Thread(target=run, args=(r,), daemon=True) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    if errors:
        first = next((e for e in errors if not isinstance(e, threading.BrokenBarrierError)), errors[0])
        raise first
    if any(t.is_alive() for t in threads):
        raise RuntimeError("a simulated rank did not finish: do all ranks call all_reduce the same number of times?")
    return [[p.grad for p in ps] for ps in params]


def _reference_average(params: list[torch.nn.Parameter], world_size: int, all_reduce: Callable[..., Any]) -> None:
    for p in params:
        all_reduce(p.grad)
        p.grad /= world_size


def _broken_average(params: list[torch.nn.Parameter], world_size: int, all_reduce: Callable[..., Any]) -> None:
    """The snippet of the exercise: the all-reduced sum, never divided."""
    for p in params:
        all_reduce(p.grad)


def _grade_average(fn: Any) -> tuple[bool, str] | None:
    if not callable(fn):
        return False, "Define average_gradients(params, world_size, all_reduce) and pass the function itself."
    g = torch.Generator().manual_seed(9)
    for n in (2, 3, 4):
        local = [[torch.randn(3, 4, generator=g), torch.randn(5, generator=g)] for _ in range(n)]
        before = [[t.clone() for t in r] for r in local]
        out = simulate_all_reduce(fn, local)
        mean = [torch.stack([r[i] for r in before]).mean(0) for i in range(2)]
        total = [m * n for m in mean]
        if all(torch.equal(o, b) for r, rb in zip(out, before) for o, b in zip(r, rb)):
            return None  # nothing changed: still a stub, "not attempted yet"
        if any(not torch.allclose(o, m, atol=1e-6) for r in out for o, m in zip(r, mean)):
            if all(torch.allclose(o, t, atol=1e-5) for r in out for o, t in zip(r, total)):
                return False, _AVG_WHY
            if all(torch.allclose(o, m / n, atol=1e-6) for r in out for o, m in zip(r, mean)):
                return False, f"With {n} ranks you divide twice: the result is the mean divided by {n} again."
            return False, f"With {n} ranks the gradients after your function are not the mean of the ranks' gradients."
    return True, "Sum with all_reduce, divide by the world size: every rank steps with the mean gradient."


EXERCISES = [
    Exercise("09.global-batch",
             f"{NODES} nodes × {GPUS_PER_NODE} GPUs, micro-batch {MICRO_BATCH} per GPU, {ACCUM} accumulation "
             "steps: the global batch per optimizer step.",
             _grade_global_batch,
             "Count everything one optimizer step has seen gradients from.",
             method="Every rank (one per GPU, on every node) runs its own micro-batches, and each optimizer step "
                    "accumulates several of them per rank before the all-reduce.",
             solution=f"global batch = micro-batch × ranks × accumulation = {MICRO_BATCH} × ({NODES} × "
                      f"{GPUS_PER_NODE}) × {ACCUM} = {GLOBAL_BATCH}",
             kind="compute", wrong_why=_GLOBAL_WHY,
             success=f"{MICRO_BATCH} × {NODES * GPUS_PER_NODE} × {ACCUM} = {GLOBAL_BATCH}.",
             reference=GLOBAL_BATCH, wrong=GLOBAL_BATCH // ACCUM),
    Exercise("09.lr-scaling",
             f"A recipe tuned with lr {BASE_LR:g} at global batch {BASE_BATCH}: the lr for the global batch of "
             "09.global-batch under the linear scaling rule.",
             _grade_lr,
             "The rule's name says how the learning rate follows the batch.",
             method="Linear scaling: when the global batch grows by a factor k, the learning rate grows by k too "
                    "(usually with a warm-up).",
             solution=f"{BASE_LR:g} × {GLOBAL_BATCH}/{BASE_BATCH} = {SCALED_LR:g}",
             kind="compute", wrong_why=_LR_WHY,
             success=f"{BASE_LR:g} × {GLOBAL_BATCH}/{BASE_BATCH} = {SCALED_LR:g}.",
             reference=SCALED_LR, wrong=BASE_LR * math.sqrt(GLOBAL_BATCH / BASE_BATCH)),
    Exercise("09.busbw",
             "Write busbw(algbw, n): the all-reduce bus bandwidth nccl-tests reports for n ranks.",
             _grade_busbw,
             "busbw corrects algbw for how much each rank really sends in a ring all-reduce.",
             method="A ring all-reduce is a reduce-scatter followed by an all-gather; in each, every rank sends "
                    "(n-1)/n of the message. One rank sends nothing at all.",
             solution="return algbw * 2 * (n - 1) / n",
             kind="implement", wrong_why=_BUSBW_WHY,
             success="busbw no longer depends on n, so it can be compared with the link's bandwidth.",
             reference=_reference_busbw, wrong=_busbw_one_way),
    Exercise("09.slow-rank",
             "Three ranks need 100, 100 and 160 ms of compute per step and the all-reduce takes 20 ms once "
             "everyone has arrived: the step time in ms.",
             _grade_slow_rank,
             "A collective finishes for nobody until everybody has joined it.",
             method="Every rank waits in the all-reduce for the slowest one, then all of them pay for the all-reduce.",
             solution="max(100, 100, 160) + 20 = 180 ms",
             kind="compute", wrong_why=_SLOW_WHY,
             success="160 + 20 = 180 ms: two ranks idle 60 ms per step. One slow rank slows the whole job.",
             reference=180.0, wrong=140.0),
    Exercise("09.allreduce-count",
             "Predict, then run: the fp16 run trained 12 optimizer steps of 4 micro-batches each on 2 ranks, with "
             "no_sync(). How many gradient all-reduces did each rank issue?",
             _grade_count,
             "Look at the `sync = ...` line of train_loop: on which micro-batches does DDP all-reduce?",
             method="Inside ddp.no_sync() backward only accumulates into .grad; the all-reduce runs on the backward "
                    "of the last micro-batch of each optimizer step.",
             solution="prediction = 12: one gradient all-reduce per bucket per optimizer step, and this model's gradients "
                      "fit in one bucket (48 without no_sync()).",
             kind="predict", wrong_why=_COUNT_WHY, reference=(12, 12), wrong=(48, 12)),
    Exercise("09.average-grads",
             "Debug: average_gradients(params, world_size, all_reduce) is meant to leave every rank with the mean "
             "gradient. Write a fixed version.",
             _grade_average,
             "What does all_reduce compute by default: a sum or a mean?",
             method="torch.distributed.all_reduce defaults to ReduceOp.SUM (gloo has no AVG). After it, every rank "
                    "holds the sum over world_size ranks; the mean needs one more step.",
             solution="for p in params:\n    all_reduce(p.grad)\n    p.grad /= world_size",
             kind="debug", wrong_why=_AVG_WHY, reference=_reference_average, wrong=_broken_average),
]
