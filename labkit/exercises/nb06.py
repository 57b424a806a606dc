"""Exercises of notebook 06 (where memory goes). Introduced in notebook 06."""

from __future__ import annotations

import math
import random
from typing import Any

import torch

from labkit import memory as M
from labkit.exercises._core import Exercise, FormatSlip
from labkit.exercises._graders import NOT_A_PAIR, as_number, number, pair
from labkit.i18n import N_
from labkit.i18n import gettext as _

__all__ = ["EXERCISES"]

# The typical mistakes' explanations name the mistake, not the answer (the worked solution, the last help, does).
_BYTES_WHY = N_("16 is the figure for Adam, which keeps two fp32 optimizer states per parameter. SGD with momentum "
                "keeps fewer: list the states it keeps, with their sizes.")


def _bytes_per_param(answer: object) -> tuple[bool, str]:
    ok, msg = number(M.bytes_per_param("bf16-master", "sgd-momentum"), _("the bytes per parameter"),
                     {16.0: _(_BYTES_WHY)})(answer)
    if ok or msg:
        return ok, msg
    if as_number(answer) in (18.0, 20.0):
        return False, _("That is an Adam figure (with fp32 gradients); SGD with momentum keeps one state, not two.")
    return False, ""


_STAGE_WHY = N_("At stage 1 only the optimizer side (12 B/param) is sharded; the 16-bit weights and gradients stay "
                "whole on every GPU. Add up what one GPU then holds for 7B parameters, and compare it with 32 GB.")


def _smallest_stage(answer: object) -> tuple[bool, str]:
    want = M.smallest_fitting_stage(7 * 10**9, 32 * M.GB, 8, "bf16-master", "adam")
    if isinstance(answer, bool) or not isinstance(answer, int):
        return False, FormatSlip(_("Give the stage as an int (0, 1, 2 or 3)."))
    if answer == want:
        return True, ""
    if answer == 1:
        return False, _(_STAGE_WHY)
    per_gpu = M.model_state_bytes(7 * 10**9, "bf16-master", "adam", stage=answer, world_size=8).device_total \
        if answer in (0, 1, 2, 3) else None
    if per_gpu is not None and per_gpu > 32 * M.GB:
        return False, _("At stage {stage} a GPU holds {held}: more than 32 GB.").format(
            stage=answer, held=M.fmt_bytes(per_gpu))
    return False, _("A smaller stage already fits.")


def _reference_per_gpu(n_params: int, stage: int, world_size: int) -> float:
    psi, n = n_params, world_size
    return [16 * psi, 4 * psi + 12 * psi / n, 2 * psi + 14 * psi / n, 16 * psi / n][stage]


def _stage2_shards_params(n_params: int, stage: int, world_size: int) -> float:
    """The typical mistake: stage 2 sharding the 16-bit weights too (that is stage 3)."""
    return _reference_per_gpu(n_params, 3 if stage == 2 else stage, world_size)


_PER_GPU_WHY = N_("At stage 2 you shard the 16-bit weights too: that is stage 3. Stage 2 shards the optimizer side "
                  "and the gradients, and every rank still holds all the 16-bit weights.")


def _grade_per_gpu(fn: Any) -> tuple[bool, str] | None:
    """Grade per_gpu_bytes(n_params, stage, world_size) against labkit.memory on fresh inputs.

    The paper's 7.5B on 64 GPUs first, then 20 random cases. A tolerance of 16 bytes (or 1e-6 relative) accepts
    both Ψ/N and ceil(Ψ/N) sharding.
    """
    if not callable(fn):
        return False, FormatSlip(_("Define a function per_gpu_bytes(n_params, stage, world_size) and pass the "
                                   "function."))
    rng = random.Random(6)
    cases = [(7_500_000_000, s, 64) for s in range(4)]
    cases += [(rng.randrange(10**6, 10**11), rng.randrange(4), rng.choice([1, 2, 4, 8, 64, 512])) for _i in range(20)]
    for n, stage, ws in cases:
        want = M.model_state_bytes(n, "bf16-master", "adam", stage=stage, world_size=ws).device_total
        got = fn(n, stage, ws)
        if got is None or got is Ellipsis:
            return None
        if isinstance(got, bool) or not isinstance(got, (int, float)) or not abs(got - want) <= max(16.0, 1e-6 * want):
            if isinstance(got, (int, float)) and stage == 2 and ws > 1 and math.isclose(float(got), 16 * n / ws,
                                                                                        rel_tol=1e-6):
                return False, _(_PER_GPU_WHY)
            return False, _("per_gpu_bytes({n_params}, {stage}, {world_size}) returned {got!r}; expected "
                            "{want:.6g}.").format(n_params=n, stage=stage, world_size=ws, got=got, want=want)
    return True, _("It reproduces the ZeRO paper's 120 / 31.4 / 16.6 / 1.9 GB.")


# ---- 06.amp-saved: predict, then run ----------------------------------------------------------------
_SAVED_WHY = N_("Not everything halves. Autocast saves bf16 copies of the matmul inputs, but the LayerNorm inputs, "
                "the fp32 softmax island and the residual stream stay fp32, and the bf16 copies of the weights "
                "(weight_copies) come on top of the activations.")


def _grade_saved(answer: object) -> tuple[bool, str]:
    got = pair(answer)
    if got is None:
        return False, NOT_A_PAIR
    pred, result = (as_number(v) for v in got)
    if pred is None or not pred > 0:
        return False, FormatSlip(_("Predict the ratio as a positive number, e.g. 0.5 for 'half as much'."))
    if result is None or not result > 0:
        raise ValueError(_("the measured ratio must be a positive number, got {value!r}").format(value=got[1]))
    if abs(pred - result) <= 0.12:
        return True, _("Measured {result:.2f}: the matmul inputs are saved in bf16, the rest of the activations stay "
                       "fp32, and autocast's bf16 weight copies come on top. Less than fp32, far from half.").format(
            result=result)
    if pred <= 0.55:
        return False, _(_SAVED_WHY)
    if pred >= 1:
        return False, _("It went down, to {result:.2f} of fp32: activations do shrink. What grows with autocast is "
                        "the model state side (fp32 weights and states stay, bf16 weight copies are added), which the "
                        "saved-tensor hooks do not count.").format(result=result)
    return False, _("Measured {result:.2f}.").format(result=result) + " " + _(_SAVED_WHY)


# ---- 06.kept-loss: debug ----------------------------------------------------------------------------
_KEPT_WHY = N_("Every loss in the returned list is a tensor at the root of its autograd graph, and that graph owns "
               "every activation saved for backward: the list keeps all the batches' activations alive.")


def _reference_validation(model: torch.nn.Module, batches: Any) -> list[float]:
    from labkit import models

    losses = []
    with torch.no_grad():
        for x, y in batches:
            losses.append(models.lm_loss(model(x), y).item())
    return losses


def _broken_validation(model: torch.nn.Module, batches: Any) -> list[Any]:
    """The snippet of the exercise: outside no_grad, the loss tensors kept."""
    from labkit import models

    losses = []
    for x, y in batches:
        losses.append(models.lm_loss(model(x), y))
    return losses


def _grade_kept(fn: Any) -> tuple[bool, str] | None:
    if not callable(fn):
        return False, FormatSlip(_("Define validation_losses(model, batches) and pass the function itself."))
    from labkit import activations, data, models

    task = data.make_token_task("reverse", n=96, n_digits=4, vocab_size=10, seed=4)
    model = models.TinyGPT(vocab_size=10, seq_len=task.seq_len, d_model=32, n_layers=1, n_heads=2, seed=7)
    batches = [(task.inputs[i:i + 32], task.targets[i:i + 32]) for i in range(0, 96, 32)]
    with torch.no_grad():
        want = [models.lm_loss(model(x), y).item() for x, y in batches]
    got = fn(model, list(batches))
    if got is None or got is Ellipsis:
        return None  # still a stub: "not attempted yet"
    if not isinstance(got, (list, tuple)) or len(got) != len(batches):
        return False, _("Return a list with one loss per batch ({count} here).").format(count=len(batches))
    params = list(model.parameters())
    held = sum(activations.graph_saved_bytes(v, exclude=params) for v in got if isinstance(v, torch.Tensor))
    if held or any(isinstance(v, torch.Tensor) and v.grad_fn is not None for v in got):
        return False, _(_KEPT_WHY) + (" " + _("(Your list holds {held:,} bytes of saved tensors.)").format(held=held)
                                      if held else "")
    if any(p.grad is not None for p in params):
        return False, _("Validation computes no gradients: no backward(), and nothing written to the parameters' "
                        ".grad.")
    values = [as_number(v) for v in got]
    if None in values or not all(math.isclose(v, w, rel_tol=1e-5) for v, w in zip(values, want)):  # type: ignore[arg-type]
        return False, _("The losses should be {want}, got {got!r}.").format(want=[round(w, 4) for w in want], got=got)
    return True, _("Numbers in the log, no graph behind them: validation memory stays flat however many batches.")


def _measure_amp_saved() -> float:
    """The bytes a bf16-autocast forward of the notebook's tiny GPT keeps for backward (activations and weight
    copies) over the fp32 forward's, on the notebook's batch of 32 (the experiment of 06.amp-saved)."""
    from labkit import data, models

    task = data.make_token_task("reverse", n=512, n_digits=6, vocab_size=12, seed=0)
    small = models.TinyGPT(models.GPTConfig(vocab_size=task.vocab_size, seq_len=task.seq_len), seed=0)
    x = task.inputs[:32].clone()
    kept = {}
    for enabled in (False, True):
        def fwd(enabled: bool = enabled) -> torch.Tensor:
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=enabled):
                return small(x)
        out, saved = M.measure_saved_tensors(fwd, small.parameters())
        kept[enabled] = saved.activations + saved.weight_copies
        del out
    return kept[True] / kept[False]


EXERCISES = [
    Exercise("06.bytes-per-param",
             "Bytes per parameter of model state: bf16 weights and bf16 grads, fp32 master weights, "
             "SGD with momentum (fp32), no ZeRO.",
             _bytes_per_param,
             "List every tensor the setup keeps per parameter, with its dtype's size.",
             method="16-bit weights and 16-bit gradients are 2 bytes each; the fp32 master copy is 4; each fp32 "
                    "optimizer state is 4. How many states does SGD with momentum keep?",
             solution="2 (bf16 weights) + 2 (bf16 grads) + 4 (fp32 master) + 4 (momentum) = 12",
             kind="compute", wrong_why=_BYTES_WHY,
             reference=2 + 2 + 4 + 4, wrong=16),
    Exercise("06.smallest-stage",
             "Smallest ZeRO stage at which the model states of a 7B model (16 B/param, Adam) fit on "
             "8 GPUs of 32 GB each.",
             _smallest_stage,
             "Work out the bytes per GPU at each stage, starting from stage 0, and stop at the first that fits.",
             method="Per GPU, with Ψ = 7e9 and N = 8: stage 0 = 16Ψ; stage 1 shards the 12 optimizer bytes (4Ψ + "
                    "12Ψ/N); stage 2 also the gradients (2Ψ + 14Ψ/N); stage 3 everything (16Ψ/N).",
             solution="stage 0: 112 GB; stage 1: 28 + 10.5 = 38.5 GB; stage 2: 14 + 12.25 = 26.25 GB <= 32 GB: 2",
             kind="compute", wrong_why=_STAGE_WHY,
             reference=2, wrong=1),
    Exercise("06.zero-per-gpu",
             "A function per_gpu_bytes(n_params, stage, world_size) giving the ZeRO paper's per-GPU "
             "model-state bytes (16 B/param: 2 + 2 + K, K = 12).",
             _grade_per_gpu,
             "Split the 16 bytes into three parts, and ask for each stage which parts are divided by the GPUs.",
             method="Write the per-GPU bytes as three terms, 16-bit weights + 16-bit gradients + optimizer side (K "
                    "bytes per parameter), each either whole on every GPU or divided by N. Then go through the "
                    "stages as section 5 describes them: which terms does each stage divide?",
             solution="return [16 * psi, 4 * psi + 12 * psi / n, 2 * psi + 14 * psi / n, 16 * psi / n][stage]",
             kind="implement", wrong_why=_PER_GPU_WHY,
             reference=_reference_per_gpu, wrong=_stage2_shards_params),
    Exercise("06.amp-saved",
             "Predict, then run: with bf16 autocast, what fraction of the fp32 forward pass's saved bytes "
             "(activations + weight copies) does the tiny GPT keep for backward?",
             _grade_saved,
             "Which of the saved tensors come out of autocast in bf16, and which does autocast not touch?",
             method="Matmul inputs are saved in bf16 (half the bytes); LayerNorm inputs, the fp32 softmax island and "
                    "the residual stream stay fp32; the bf16 copies of the weights are added.",
             solution="prediction = 0.7 (measured 0.68): less than fp32, far from half.",
             kind="predict", wrong_why=_SAVED_WHY, reference=(0.7, 0.68), wrong=(0.5, 0.68),
             measure=_measure_amp_saved),
    Exercise("06.kept-loss",
             "Debug: validation_losses(model, batches) makes memory grow with every batch. Write a fixed "
             "validation_losses that returns the same per-batch losses and keeps no memory alive.",
             _grade_kept,
             "What does each element of the returned list still refer to?",
             method="A loss tensor computed with autograd on is the root of a graph that owns the saved activations. "
                    "Two habits keep none of it alive: one stops the graph from being built at all during "
                    "validation, the other keeps only the number out of each loss. Use both.",
             solution="losses = []\nwith torch.no_grad():\n    for x, y in batches:\n"
                      "        losses.append(models.lm_loss(model(x), y).item())\nreturn losses",
             kind="debug", wrong_why=_KEPT_WHY, reference=_reference_validation, wrong=_broken_validation),
]
