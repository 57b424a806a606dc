"""Exercises of notebook 04 (AMP training). Introduced in notebook 04."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch

from labkit.exercises._core import Exercise

__all__ = ["EXERCISES", "reference_amp_step", "reference_island_softmax", "reference_pick_amp"]


def _expect(*checks: tuple[str, Any, type | tuple[type, ...]]) -> None:
    """Raise TypeError for the first ``(name, value, types)`` whose value is not one of the types."""
    for name, value, types in checks:
        if not isinstance(value, types):
            want = " or ".join(t.__name__ for t in (types if isinstance(types, tuple) else (types,)))
            raise TypeError(f"{name} must be a {want}, got {type(value).__name__}")


def reference_amp_step(model: torch.nn.Module, opt: torch.optim.Optimizer, scaler: torch.amp.GradScaler,
                       x: torch.Tensor, y: torch.Tensor, dtype: torch.dtype) -> None:
    """One AMP step: autocast forward + loss, scaled backward, unscale, clip to 1.0, step, update.

    Introduced in notebook 04.
    """
    from labkit import precision
    from labkit.models import lm_loss

    _expect(("model", model, torch.nn.Module), ("opt", opt, torch.optim.Optimizer),
            ("scaler", scaler, (torch.amp.GradScaler, type(None))), ("x", x, torch.Tensor), ("y", y, torch.Tensor),
            ("dtype", dtype, torch.dtype))
    opt.zero_grad(set_to_none=True)
    with torch.autocast(device_type=x.device.type, dtype=dtype):
        loss = lm_loss(model(x), y)
    precision.backward(loss, scaler)
    precision.update(opt, scaler, model.parameters(), clip_grad_norm=1.0)


def reference_pick_amp(caps: dict[str, Any]) -> tuple[str, bool]:
    """Choose ``(autocast dtype name, use a GradScaler?)`` from ``caps["bf16"]``/``caps["fp16"]``.

    Introduced in notebook 04.
    """
    _expect(("caps", caps, dict))
    if caps.get("bf16"):
        return "bf16", False
    if caps.get("fp16"):
        return "fp16", True
    return "fp32", False


def reference_island_softmax(scores: torch.Tensor) -> torch.Tensor:
    """Softmax over the last dim computed in an fp32 island, returned in the input dtype.

    Introduced in notebook 04.
    """
    _expect(("scores", scores, torch.Tensor))
    with torch.autocast(device_type=scores.device.type, enabled=False):
        return torch.softmax(scores.float(), dim=-1).to(scores.dtype)


def _clip_before_unscale(model: torch.nn.Module, opt: torch.optim.Optimizer, scaler: torch.amp.GradScaler,
                         x: torch.Tensor, y: torch.Tensor, dtype: torch.dtype) -> None:
    """A typical mistake: clipping the still-scaled gradients, before ``scaler.unscale_``."""
    from labkit.models import lm_loss

    opt.zero_grad(set_to_none=True)
    with torch.autocast(device_type=x.device.type, dtype=dtype):
        loss = lm_loss(model(x), y)
    scaler.scale(loss).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
    scaler.step(opt)
    scaler.update()


def _fp16_first(caps: dict[str, Any]) -> tuple[str, bool]:
    """A typical mistake: fp16 wherever it works, even where bf16 (no scaler needed) does too."""
    if caps.get("fp16"):
        return "fp16", True
    if caps.get("bf16"):
        return "bf16", False
    return "fp32", False


def _island_no_cast_back(scores: torch.Tensor) -> torch.Tensor:
    """A typical mistake: the fp32 island that forgets to cast its result back to the input dtype."""
    with torch.autocast(device_type=scores.device.type, enabled=False):
        return torch.softmax(scores.float(), dim=-1)


def _amp_dtype() -> torch.dtype:
    from labkit import device as dev_gate

    return torch.float16 if dev_gate.computes(torch.float16, "cpu") else torch.bfloat16


def _grade_amp_step(answer: Any) -> tuple[bool, str] | None:
    if not callable(answer):
        return False, "Define a function amp_step(model, opt, scaler, x, y, dtype) and pass it."
    from labkit import data, models

    dtype = _amp_dtype()
    task = data.make_token_task("reverse", n=64, n_digits=4, vocab_size=9, seed=11)
    x, y = task.inputs[:16], task.targets[:16]
    base = models.TinyGPT(vocab_size=9, seq_len=task.seq_len, d_model=32, n_layers=1, n_heads=2, seed=5)

    def run(fn: Callable[..., Any], init_scale: float, steps: int) -> tuple[torch.nn.Module, float]:
        m = copy.deepcopy(base)
        opt = torch.optim.SGD(m.parameters(), lr=0.5)
        scaler = torch.amp.GradScaler("cpu", init_scale=init_scale, growth_interval=1)
        for _ in range(steps):
            fn(m, opt, scaler, x, y, dtype)
        return m, float(scaler.get_scale())

    ref, ref_scale = run(reference_amp_step, 2.0**10, 2)
    got, got_scale = run(answer, 2.0**10, 2)
    if got_scale == 2.0**10 and all(torch.equal(p, q) for p, q in zip(got.parameters(), base.parameters())):
        return None  # it changed nothing at all: still a stub, "not attempted yet"
    if got_scale != ref_scale:
        return False, (f"after two clean steps the scale should be {ref_scale:g} (scaler.update() grows it), "
                       f"got {got_scale:g}.")
    for (name, p), q in zip(got.named_parameters(), ref.parameters()):
        if not torch.allclose(p, q, rtol=1e-3, atol=1e-5):
            return False, (f"parameter {name} differs from a correct AMP step. Is the loss computed under "
                           "autocast, and is the gradient clipped to 1.0 *after* scaler.unscale_?")
    big, big_scale = run(answer, 2.0**127, 1)  # the scaled loss overflows: the step must be skipped
    if not all(torch.equal(p, q) for p, q in zip(big.parameters(), base.parameters())):
        return False, "with an overflowing scale the step must be skipped: use scaler.step(opt), not opt.step()."
    if big_scale != 2.0**126:
        return False, "after an overflow the scale must be halved: call scaler.update() every step."
    return True, "Scaled backward, unscale, clip, step and update, in that order."


def _grade_pick_amp(answer: Any) -> tuple[bool, str] | None:
    if not callable(answer):
        return False, "Define a function pick_amp(caps) returning e.g. ('bf16', False)."
    from labkit import device as dev_gate

    here = dev_gate.capabilities("cpu").as_dict()
    cases = [
        {"device_type": "cuda", "device_name": "V100", "bf16": False, "fp16": True},
        {"device_type": "cuda", "device_name": "A100", "bf16": True, "fp16": True},
        {"device_type": "cpu", "device_name": "old laptop", "bf16": False, "fp16": False},
        {"device_type": "cpu", "device_name": "bf16-only CPU", "bf16": True, "fp16": False},
        here,
    ]
    for caps in cases:
        want = reference_pick_amp(caps)
        got = answer(dict(caps))
        if got is None or got is Ellipsis:
            return None  # still a stub: "not attempted yet"
        if not isinstance(got, (tuple, list)) or tuple(got) != want:
            return False, f"for {caps['device_name']} (bf16={caps['bf16']}, fp16={caps['fp16']}) expected {want}, got {got}."
    return True, "bf16 where it computes (no scaler needed), fp16 + GradScaler otherwise, else fp32."


def _grade_island(answer: Any) -> tuple[bool, str] | None:
    if not callable(answer):
        return False, "Define a function island_softmax(scores) and pass it."
    g = torch.Generator().manual_seed(4)
    scores = (torch.randn(3, 5, 7, generator=g) * 30).to(torch.float16)
    scores[0, 0, 3:] = float("-inf")  # a causal mask
    want = reference_island_softmax(scores)
    got = answer(scores)
    if got is None or got is Ellipsis:
        return None  # still a stub: "not attempted yet"
    if not isinstance(got, torch.Tensor) or got.shape != scores.shape:
        return False, "return a tensor of the same shape as scores."
    if got.dtype != scores.dtype:
        return False, f"return the input dtype ({scores.dtype}), got {got.dtype}: cast back after the island."
    if not torch.isfinite(got).all():
        return False, "the result holds inf/NaN: compute exp and the sum in float32 (and subtract the max)."
    if not torch.allclose(got.float(), want.float(), atol=2e-3):
        return False, "the values are off: softmax over the last dimension."
    with torch.autocast("cpu", dtype=torch.bfloat16):
        inside = answer(scores.to(torch.bfloat16))
    if inside.dtype != torch.bfloat16 or not torch.isfinite(inside).all():
        return False, "inside autocast the result must still be finite and in the input dtype."
    return True, "Upcast, compute, cast back: the fp32 island."


def _grade_lost_update(answer: Any) -> tuple[bool, str]:
    if isinstance(answer, bool) or not isinstance(answer, (int, float)):
        return False, "Give a number such as 2.0**-5."
    one = torch.tensor(1.0, dtype=torch.bfloat16)
    u = float(answer)
    if not (u > 0):
        return False, "The update is a positive number."
    lost = bool(one + torch.tensor(u, dtype=torch.bfloat16) == one)
    twice_lost = bool(one + torch.tensor(2 * u, dtype=torch.bfloat16) == one)
    if lost and not twice_lost:
        k = torch.log2(torch.tensor(u)).item()
        if k != int(k):
            return False, "Give a power of two."
        return True, "2^-8 is half an ulp of 1.0 in bf16 (ulp 2^-7); the tie rounds to even, back to 1.0."
    if not lost:
        return False, f"1 + {u:g} does change a bf16 1.0: try smaller."
    return False, f"1 + {2 * u:g} is lost too: there is a larger power of two."


EXERCISES = [
    Exercise(
        id="04.amp-step",
        prompt="Write amp_step(model, opt, scaler, x, y, dtype): one AMP step with clipping to 1.0.",
        grade=_grade_amp_step,
        hint="zero_grad; autocast(forward + lm_loss); scaler.scale(loss).backward(); scaler.unscale_(opt); "
             "clip_grad_norm_(..., 1.0); scaler.step(opt); scaler.update().",
        reference=reference_amp_step,
        wrong=_clip_before_unscale,
    ),
    Exercise(
        id="04.pick-dtype",
        prompt="Write pick_amp(caps) -> (dtype name, use_scaler) for a device's capabilities.",
        grade=_grade_pick_amp,
        hint="Prefer bf16 (fp32's range, no scaler); fall back to fp16 with a GradScaler; else fp32.",
        reference=reference_pick_amp,
        wrong=_fp16_first,
    ),
    Exercise(
        id="04.fp32-island",
        prompt="Write island_softmax(scores): a softmax that never overflows in half precision.",
        grade=_grade_island,
        hint="Inside torch.autocast(..., enabled=False): softmax of scores.float(), then .to(scores.dtype).",
        reference=reference_island_softmax,
        wrong=_island_no_cast_back,
    ),
    Exercise(
        id="04.lost-update",
        prompt="The largest power of two u for which 1.0 + u == 1.0 in bf16.",
        grade=_grade_lost_update,
        hint="bf16 keeps 7 fraction bits: the ulp of 1.0 is 2^-7. What happens exactly halfway?",
        reference=2.0**-8,
        wrong=2.0**-7,
    ),
]
