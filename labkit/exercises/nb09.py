"""Exercises of notebook 09 (DDP and communication). Introduced in notebook 09."""

from __future__ import annotations

import math
import random
import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch

from labkit.exercises._core import NOT_MEASURED, Exercise, FormatSlip
from labkit.exercises._graders import NOT_A_PAIR, as_number, pair
from labkit.i18n import N_
from labkit.i18n import gettext as _
from labkit.recipes import allreduce as _ar

__all__ = ["EXERCISES", "simulate_all_reduce"]

# The configuration the first two exercises ask about.
NODES, GPUS_PER_NODE, MICRO_BATCH, ACCUM = 4, 8, 16, 4
BASE_LR, BASE_BATCH = 3e-4, 256
GLOBAL_BATCH = NODES * GPUS_PER_NODE * MICRO_BATCH * ACCUM  # 2048
SCALED_LR = BASE_LR * GLOBAL_BATCH / BASE_BATCH  # 2.4e-3


# The typical mistakes' explanations name the mistake, not the answer (the worked solution, the last help, does).
_GLOBAL_WHY = (f"{GLOBAL_BATCH // ACCUM} = {MICRO_BATCH} × {NODES * GPUS_PER_NODE} ranks forgets the accumulation: "
               "each optimizer step sums the gradients of several micro-batches on every rank, and each of them "
               "brings its own examples.")


def _grade_global_batch(answer: object) -> tuple[bool, str]:
    if isinstance(answer, bool) or not isinstance(answer, (int, float)):
        return False, FormatSlip(_("Give the global batch as a number of examples."))
    if answer == GLOBAL_BATCH:
        return True, ""
    if answer == GLOBAL_BATCH // ACCUM:
        return False, _(_GLOBAL_WHY)
    hints = {GLOBAL_BATCH // NODES: _("that is one node: count the ranks of all {nodes} nodes").format(nodes=NODES),
             GLOBAL_BATCH // GPUS_PER_NODE: _("each node runs one rank per GPU, {gpus} per node").format(
                 gpus=GPUS_PER_NODE),
             MICRO_BATCH * ACCUM: _("the micro-batch is per rank: multiply by every rank of every node"),
             MICRO_BATCH: _("the micro-batch is per rank and per micro-step, not the global batch"),
             MICRO_BATCH * GPUS_PER_NODE: _("{micro} × {gpus} counts the GPUs of a single node for a single "
                                            "micro-step: the ranks of all {nodes} nodes contribute, and the "
                                            "accumulation steps multiply the examples of a step, they do not divide "
                                            "them").format(micro=MICRO_BATCH, gpus=GPUS_PER_NODE, nodes=NODES),
             NODES * GPUS_PER_NODE: _("that is the number of ranks, not of examples: each rank contributes its own "
                                      "micro-batches"),
             GLOBAL_BATCH * NODES: _("a factor {nodes} is counted twice: the ranks are nodes × GPUs per node, and "
                                     "each accumulation step is counted once").format(nodes=NODES)}
    return False, hints.get(int(answer), "") if float(answer).is_integer() else ""


_LR_WHY = N_("That is the square-root rule (some use it with Adam). The linear rule scales the learning rate by "
             "the batch ratio itself, not by its square root.")


_LR_MISTAKES = (
    (BASE_LR * BASE_BATCH / GLOBAL_BATCH, N_("The ratio is upside down: the batch grew, so the learning rate grows "
                                             "with it, by new batch / base batch.")),
    (BASE_LR * GLOBAL_BATCH / ACCUM / BASE_BATCH, N_("That scales by the batch without the accumulation steps: one "
                                                     "optimizer step sees the examples of every accumulated "
                                                     "micro-batch, the global batch of 09.global-batch.")),
    (BASE_LR * NODES * GPUS_PER_NODE, N_("That scales by the number of GPUs. The rule scales by the ratio of the "
                                         "global batches, and the base recipe's batch of 256 was not one GPU's.")),
    (BASE_LR * MICRO_BATCH / BASE_BATCH, N_("That uses the micro-batch of one GPU. The optimizer step averages the "
                                            "gradients of the global batch, so the rule compares global batches.")),
    (BASE_LR * GLOBAL_BATCH, N_("That multiplies by the global batch itself: the rule multiplies by the ratio of the "
                                "new global batch to the base recipe's.")),
)


def _grade_lr(answer: object) -> tuple[bool, str]:
    if isinstance(answer, bool) or not isinstance(answer, (int, float)):
        return False, FormatSlip(_("Give the learning rate as a number."))
    if math.isclose(float(answer), SCALED_LR, rel_tol=1e-9):
        return True, ""
    if math.isclose(float(answer), BASE_LR * math.sqrt(GLOBAL_BATCH / BASE_BATCH), rel_tol=1e-9):
        return False, _(_LR_WHY)
    if math.isclose(float(answer), BASE_LR, rel_tol=1e-9):
        return False, _("That is the lr of the base recipe: the global batch grew, so the lr must follow it.")
    for value, why in _LR_MISTAKES:
        if math.isclose(float(answer), value, rel_tol=1e-9):
            return False, _(why)
    return False, ""


def _reference_busbw(algbw: float, n: int) -> float:
    return algbw * 2 * (n - 1) / n


def _busbw_one_way(algbw: float, n: int) -> float:
    """A typical mistake: counting only the reduce-scatter half of a ring all-reduce."""
    return algbw * (n - 1) / n


_BUSBW_WHY = N_("(n-1)/n counts half of a ring all-reduce, the reduce-scatter. The all-gather that follows moves "
                "as much again, and busbw counts what each rank sends in both halves.")


#: Typical wrong formulas, each with what it gets wrong; told apart on rank counts >= 3 (at n = 2 the factor is 1).
_BUSBW_MISTAKES: tuple[tuple[Callable[[float, int], float], str], ...] = (
    (_busbw_one_way, _BUSBW_WHY),
    (lambda a, n: a * 2.0, N_("2 × algbw leaves out the (n-1)/n: in each half of the ring a rank sends n-1 of the "
                              "n chunks of the message, not all n (and with one rank it sends nothing).")),
    (lambda a, n: a * 2.0 * (n - 1), N_("2(n-1) counts the ring's steps, not bytes: each step moves one chunk, 1/n "
                                        "of the message, so the factor has a /n.")),
    (lambda a, n: a * n / (2.0 * (n - 1)), N_("The factor is upside down: busbw multiplies algbw by the share of the "
                                              "message each rank sends, it does not divide by it.")),
    (lambda a, n: 2.0 * (n - 1) / n, N_("That is the factor alone, the same for every algbw: multiply the measured "
                                        "algbw by it.")),
    (lambda a, n: a, N_("busbw equal to algbw ignores the number of ranks: in a ring each rank sends a share of the "
                        "message that depends on n.")),
    (lambda a, n: a * n, N_("× n would have every rank send the whole message to every other rank; a ring sends "
                            "chunks of 1/n of it, passed along n-1 times in each half of the all-reduce.")),
)


def _busbw_mistake(answer: Callable[..., Any]) -> str:
    """What a wrong busbw gets wrong, if it is one of the typical formulas; "" otherwise."""
    probes = [(100.0, 3), (120.0, 8), (37.5, 5), (0.5, 16)]
    try:
        got = [answer(a, n) for a, n in probes]
    except Exception:  # the learner's function fails on these too: nothing to name
        return ""
    if not all(isinstance(g, (int, float)) and not isinstance(g, bool) for g in got):
        return ""
    for formula, why in _BUSBW_MISTAKES:
        if all(math.isclose(float(g), formula(a, n), rel_tol=1e-9) for g, (a, n) in zip(got, probes)):
            return _(why)
    return ""


def _grade_busbw(answer: object) -> tuple[bool, str] | None:
    if not callable(answer):
        return False, FormatSlip(_("Define a function busbw(algbw, n) and pass the function itself."))
    rng = random.Random(8)
    cases = [(100.0, 1), (100.0, 2), (120.0, 8), (0.5, 3)] + [
        (rng.uniform(0.1, 500.0), rng.randint(1, 1024)) for _unused in range(20)]
    for algbw, n in cases:
        try:
            got = answer(algbw, n)
        except ZeroDivisionError:
            why = _busbw_mistake(answer)
            return False, why or _("busbw({algbw:.3g}, {n}) divided by zero: one rank is a valid world size (it "
                                   "sends nothing), and busbw must handle it.").format(algbw=algbw, n=n)
        if got is None or got is Ellipsis:
            return None  # still a stub: "not attempted yet"
        want = _ar.busbw(algbw, n)
        if not isinstance(got, (int, float)) or not math.isclose(float(got), want, rel_tol=1e-9, abs_tol=1e-12):
            if isinstance(got, (int, float)) and n > 1 and math.isclose(float(got), want / 2, rel_tol=1e-9):
                return False, _(_BUSBW_WHY)
            return False, _busbw_mistake(answer) or _("busbw({algbw:.3g}, {n}) returned {got!r}; expected "
                                                      "{want:.6g}.").format(algbw=algbw, n=n, got=got, want=want)
    return True, ""


_SLOW_WHY = N_("140 ms is the average rank. A synchronous all-reduce cannot finish before the slowest rank arrives, "
               "and it takes its own time after that, for every rank: the fast ranks wait, they do not make up for "
               "the slow one.")


def _grade_slow_rank(answer: object) -> tuple[bool, str]:
    if isinstance(answer, bool) or not isinstance(answer, (int, float)):
        return False, FormatSlip(_("Give the step time in milliseconds, as a number."))
    if math.isclose(float(answer), 180.0, abs_tol=1e-9):
        return True, ""
    if math.isclose(float(answer), 140.0, abs_tol=1e-9):
        return False, _(_SLOW_WHY)
    if math.isclose(float(answer), 160.0, abs_tol=1e-9):
        return False, _("The all-reduce itself still takes its time after the slowest rank arrives.")
    if math.isclose(float(answer), 120.0, abs_tol=1e-9):
        return False, _("A fast rank waits in the all-reduce for the slowest one: it cannot finish at 100 + 20 ms.")
    if math.isclose(float(answer), 380.0, abs_tol=1e-9):
        return False, _("Adding the three compute times runs the ranks one after another; they compute at the same "
                        "time, on their own GPUs.")
    if math.isclose(float(answer), 220.0, abs_tol=1e-9):
        return False, _("The all-reduce is one collective that the ranks run together: it is paid once per step, "
                        "not once per rank.")
    if math.isclose(float(answer), 60.0, abs_tol=1e-9):
        return False, _("That is how long the fast ranks idle, not how long the step takes.")
    return False, ""


# ---- 09.allreduce-count: predict, then run ----------------------------------------------------------
_COUNT_WHY = N_("48 is one all-reduce per micro-batch, what DDP does without no_sync(). Inside ddp.no_sync() the "
                "gradients just add up locally, and only the last micro-batch of each optimizer step all-reduces: "
                "12 optimizer steps, 12 all-reduces, each carrying the whole accumulated gradient.")


#: The micro-batches per optimizer step of the run 09.allreduce-count asks about.
_COUNT_ACCUM = 4


def _grade_count(answer: object) -> tuple[bool, str]:
    got = pair(answer)
    if got is None:
        return False, NOT_A_PAIR
    pred, result = (as_number(v) for v in got)
    if pred is None:
        return False, FormatSlip(_("Predict the number of all-reduces per rank."))
    if result is None:
        raise ValueError(_("the measured count must be a number, got {value!r}").format(value=got[1]))
    if pred == result:
        return True, _("One all-reduce per optimizer step: no_sync() keeps the first 3 micro-batches' gradients "
                       "local, and the 4th all-reduces the sum. Same traffic as without accumulation.")
    if pred == 4 * result:
        return False, _(_COUNT_WHY)
    if pred == 2 * result or pred == 8 * result:
        return False, _("Count per rank: an all-reduce is one collective call that every rank makes together, not "
                        "one per pair of ranks.")
    if pred == 3 * result:
        return False, _("That counts the micro-batches inside no_sync(), the ones that do not all-reduce: there the "
                        "gradients only add up in .grad, and the micro-batch that ends each optimizer step, outside "
                        "no_sync(), is the one that all-reduces.")
    if pred == 0 and result > 0:
        return False, _("no_sync() postpones the synchronisation, it does not drop it: the micro-batch that ends each "
                        "optimizer step runs outside no_sync() and all-reduces, or the ranks' weights would drift "
                        "apart.")
    if pred == 1 and result > 1:
        return False, _("One all-reduce for the whole run would leave the ranks with different weights after the first "
                        "step: every optimizer step needs the gradient summed over the ranks.")
    if pred == _COUNT_ACCUM and result != _COUNT_ACCUM:
        return False, _("4 is the number of micro-batches in one optimizer step; the question counts the all-reduces "
                        "of the whole run, every optimizer step of it.")
    return False, _("Each rank issued {result:g}.").format(result=result) + " " + _(_COUNT_WHY)


# ---- 09.average-grads: debug ------------------------------------------------------------------------
_AVG_WHY = N_("all_reduce sums: after it every rank holds the *sum* of the ranks' gradients, world_size times the "
              "mean. Stepping with the sum is like multiplying the learning rate by the number of ranks.")


def _rank_all_reduce(group: dict[str, Any], rank: int) -> Callable[..., None]:
    """The all_reduce of one simulated rank: sums (or averages) ``tensor`` in place across all ranks."""
    from torch.distributed import ReduceOp

    def all_reduce(tensor: torch.Tensor, op: Any = None, group_: Any = None, async_op: bool = False) -> None:
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(_("all_reduce takes a tensor, got {type}").format(type=type(tensor).__name__))
        if op not in (None, ReduceOp.SUM, ReduceOp.AVG):
            raise ValueError(_("this simulated all_reduce supports ReduceOp.SUM and ReduceOp.AVG, not {op!r}").format(
                op=op))
        barrier: threading.Barrier = group["barrier"]
        group["slots"][rank] = tensor
        barrier.wait()
        parts = group["slots"]
        if any(p.shape != tensor.shape for p in parts):
            barrier.abort()
            raise ValueError(_("the ranks all-reduced tensors of different shapes: call it in the same order "
                               "everywhere"))
        total = torch.stack([p.detach().clone() for p in parts]).sum(0)
        barrier.wait()  # every rank has read the inputs before any rank writes its result
        with torch.no_grad():  # like torch.distributed's, it writes the data, outside autograd (a parameter too)
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
        raise RuntimeError(_("a simulated rank did not finish: do all ranks call all_reduce the same number of "
                             "times?"))
    return [[p.grad for p in ps] for ps in params]


def _reference_average(params: list[torch.nn.Parameter], world_size: int, all_reduce: Callable[..., Any]) -> None:
    for p in params:
        all_reduce(p.grad)
        p.grad /= world_size


def _broken_average(params: list[torch.nn.Parameter], world_size: int, all_reduce: Callable[..., Any]) -> None:
    """The snippet of the exercise: the all-reduced sum, never divided."""
    for p in params:
        all_reduce(p.grad)


_AVG_ELSEWHERE = N_("all_reduce ran, but no parameter's .grad changed: it reduced another tensor, such as a copy "
                    "(p.grad / world_size and p.grad.clone() are new tensors) or a list your function returns. The "
                    "optimizer reads p.grad: the mean must end up in it.")


_AVG_NO_GROUP = N_("Your function called into torch.distributed, which needs an initialised process group. Call the "
                   "all_reduce your function is given, its third argument: in a real run it is "
                   "torch.distributed.all_reduce, here the simulated one.")


def _counting(fn: Callable[..., Any], calls: list[int]) -> Callable[..., Any]:
    """``fn`` with an all_reduce that appends to ``calls`` each time it is called."""
    def run(params: list[torch.nn.Parameter], world_size: int, all_reduce: Callable[..., Any]) -> Any:
        def counted(*args: Any, **kwargs: Any) -> Any:
            calls.append(1)
            return all_reduce(*args, **kwargs)
        return fn(params, world_size, counted)
    return run


def _average_mistake(out: list[list[torch.Tensor]], before: list[list[torch.Tensor]], n: int) -> str:
    """Name what a wrong average_gradients computed on ``n`` ranks, if it is a typical mistake; "" otherwise."""
    mean = [torch.stack([r[i] for r in before]).mean(0) for i in range(len(before[0]))]
    total = [m * n for m in mean]

    def every(expected: Callable[[int, int], torch.Tensor], atol: float = 1e-6) -> bool:
        return all(torch.allclose(o, expected(r, i), atol=atol) for r, ro in enumerate(out) for i, o in enumerate(ro))

    if every(lambda r, i: total[i], atol=1e-5):
        return _(_AVG_WHY)
    if every(lambda r, i: mean[i] / n):
        return _("With {n} ranks you divide twice: the result is the mean divided by {n} again.").format(n=n)
    if every(lambda r, i: before[r][i] / n):
        return _("With {n} ranks each rank's gradient is only its own, divided by {n}: the gradients were never "
                 "summed across the ranks. all_reduce must be handed p.grad, the tensor to sum.").format(n=n)
    k = len(before[0])
    if k != n and every(lambda r, i: total[i] / k, atol=1e-5):
        return _("With {n} ranks you divided by {k}, the number of parameters (len(params)); the mean over the "
                 "ranks divides by the number of ranks.").format(n=n, k=k)
    if all(torch.allclose(o, mean[i], atol=1e-6) or torch.equal(o, before[r][i])
           for r, ro in enumerate(out) for i, o in enumerate(ro)):
        return _("Some gradients are averaged and others are left as they were: average every parameter's gradient "
                 "(a return inside the loop stops after the first).")
    return ""


def _grade_average(fn: Any) -> tuple[bool, str] | None:
    if not callable(fn):
        return False, FormatSlip(_("Define average_gradients(params, world_size, all_reduce) and pass the "
                                   "function itself."))
    g = torch.Generator().manual_seed(9)
    for n in (2, 3, 4):
        local = [[torch.randn(3, 4, generator=g), torch.randn(5, generator=g)] for _unused in range(n)]
        before = [[t.clone() for t in r] for r in local]
        calls: list[int] = []
        try:
            out = simulate_all_reduce(_counting(fn, calls), local)
        except (RuntimeError, ValueError) as exc:
            if calls or "process group" not in str(exc):
                raise
            return False, _(_AVG_NO_GROUP)
        mean = [torch.stack([r[i] for r in before]).mean(0) for i in range(2)]
        if any(not isinstance(o, torch.Tensor) or o.shape != b.shape
               for r, rb in zip(out, before) for o, b in zip(r, rb)):
            return False, _("After your function a p.grad is no longer a gradient of its parameter's shape: leave the "
                            "mean in p.grad.")
        if all(torch.equal(o, b) for r, rb in zip(out, before) for o, b in zip(r, rb)):
            if calls:
                return False, _(_AVG_ELSEWHERE)
            return None  # nothing changed and nothing reduced: still a stub, "not attempted yet"
        if any(not torch.allclose(o, m, atol=1e-6) for r in out for o, m in zip(r, mean)):
            return False, (_average_mistake(out, before, n)
                           or _("With {n} ranks the gradients after your function are not the mean of the ranks' "
                                "gradients.").format(n=n))
    return True, _("Sum with all_reduce, divide by the world size: every rank steps with the mean gradient.")


def _measure_allreduce_count() -> Any:
    """Rank 0's all-reduce calls in the last fp16 accumulation run that rank 0 reported to labkit.dist.launch (the
    experiment of 09.allreduce-count); NOT_MEASURED before that launch has run in this kernel."""
    from labkit.dist import _has_option, _last_result

    run = _last_result("labkit.recipes.ddp", lambda nproc, argv, res: nproc == 2 and _has_option(argv, "--accum", "4")
                       and _has_option(argv, "--precision", "fp16") and "allreduce_calls" in res)
    return NOT_MEASURED if run is None else run["allreduce_calls"][0]


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
             method="A ring all-reduce is a reduce-scatter followed by an all-gather, and the message travels in n "
                    "chunks. In each half, count the chunks one rank sends; busbw scales algbw by the share of the "
                    "message a rank sends in all. (With n = 1 nothing is sent.)",
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
             kind="predict", wrong_why=_COUNT_WHY, reference=(12, 12), wrong=(48, 12),
             measure=_measure_allreduce_count),
    Exercise("09.average-grads",
             "Debug: average_gradients(params, world_size, all_reduce) is meant to leave every rank with the mean "
             "gradient. Write a fixed version.",
             _grade_average,
             "What does all_reduce compute by default: a sum or a mean?",
             method="torch.distributed.all_reduce defaults to ReduceOp.SUM. After it, every rank "
                    "holds the sum over world_size ranks; the mean needs one more step.",
             solution="for p in params:\n    all_reduce(p.grad)\n    p.grad /= world_size",
             kind="debug", wrong_why=_AVG_WHY, reference=_reference_average, wrong=_broken_average),
]
