"""Exercises of notebook 04 (AMP training). Introduced in notebook 04."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch

from labkit._validate import check_dense
from labkit.exercises._core import Exercise, FormatSlip
from labkit.exercises._graders import NOT_A_PAIR, pair
from labkit.i18n import N_
from labkit.i18n import gettext as _

__all__ = ["EXERCISES", "PREDICT_OPS", "reference_amp_step", "reference_island_softmax", "reference_pick_amp"]


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
    check_dense("scores", scores)
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


_CLIP_WHY = N_("You clip the still-scaled gradients: before unscale_ their norm is S times the true norm (S = 1024 "
               "here), so the clip always fires and shrinks the step about S-fold, and scaler.step then unscales what "
               "is left.")


def _grade_amp_step(answer: Any) -> tuple[bool, str] | None:
    if not callable(answer):
        return False, FormatSlip(_("Define a function amp_step(model, opt, scaler, x, y, dtype) and pass it."))
    from labkit import data, models

    dtype = _amp_dtype()
    task = data.make_token_task("reverse", n=64, n_digits=4, vocab_size=9, seed=11)
    x, y = task.inputs[:16], task.targets[:16]
    base = models.TinyGPT(vocab_size=9, seq_len=task.seq_len, d_model=32, n_layers=1, n_heads=2, seed=5)

    def run(fn: Callable[..., Any], init_scale: float, steps: int) -> tuple[torch.nn.Module, float]:
        m = copy.deepcopy(base)
        opt = torch.optim.SGD(m.parameters(), lr=0.5)
        scaler = torch.amp.GradScaler("cpu", init_scale=init_scale, growth_interval=1)
        for _step in range(steps):
            fn(m, opt, scaler, x, y, dtype)
        return m, float(scaler.get_scale())

    ref, ref_scale = run(reference_amp_step, 2.0**10, 2)
    got, got_scale = run(answer, 2.0**10, 2)
    if got_scale == 2.0**10 and all(torch.equal(p, q) for p, q in zip(got.parameters(), base.parameters())):
        return None  # it changed nothing at all: still a stub, "not attempted yet"
    if got_scale != ref_scale:
        return False, _("after two clean steps the scale should be {want:g} (scaler.update() grows it), "
                        "got {got:g}.").format(want=ref_scale, got=got_scale)
    for (name, p), q in zip(got.named_parameters(), ref.parameters()):
        if not torch.allclose(p, q, rtol=1e-3, atol=1e-5):
            late, _late_scale = run(_clip_before_unscale, 2.0**10, 2)
            if all(torch.allclose(a, b, rtol=1e-3, atol=1e-5) for a, b in zip(got.parameters(), late.parameters())):
                return False, _(_CLIP_WHY)
            return False, _("parameter {name} differs from a correct AMP step. Is the loss computed under "
                            "autocast, and is the gradient clipped to 1.0 *after* scaler.unscale_?").format(name=name)
    big, big_scale = run(answer, 2.0**127, 1)  # the scaled loss overflows: the step must be skipped
    if not all(torch.equal(p, q) for p, q in zip(big.parameters(), base.parameters())):
        return False, _("with an overflowing scale the step must be skipped: use scaler.step(opt), not opt.step().")
    if big_scale != 2.0**126:
        return False, _("after an overflow the scale must be halved: call scaler.update() every step.")
    return True, _("Scaled backward, unscale, clip, step and update, in that order.")


_PICK_WHY = N_("Where both compute, prefer bf16: it has fp32's exponent range, so gradients do not underflow and no "
               "GradScaler is needed. fp16 with a GradScaler is the fallback for hardware without bf16 (V100, T4).")


def _grade_pick_amp(answer: Any) -> tuple[bool, str] | None:
    if not callable(answer):
        return False, FormatSlip(_("Define a function pick_amp(caps) returning e.g. ('bf16', False)."))
    from labkit import device as dev_gate

    here = dev_gate.capabilities("cpu").as_dict()
    cases = [
        {"device_type": "cuda", "device_name": "V100", "bf16": False, "fp16": True},
        {"device_type": "cuda", "device_name": "A100", "bf16": True, "fp16": True},
        {"device_type": "cpu", "device_name": N_("old laptop"), "bf16": False, "fp16": False},
        {"device_type": "cpu", "device_name": N_("bf16-only CPU"), "bf16": True, "fp16": False},
        here,
    ]
    for caps in cases:
        want = reference_pick_amp(caps)
        got = answer(dict(caps))
        if got is None or got is Ellipsis:
            return None  # still a stub: "not attempted yet"
        if not isinstance(got, (tuple, list)) or tuple(got) != want:
            if caps["bf16"] and caps["fp16"] and isinstance(got, (tuple, list)) and tuple(got) == ("fp16", True):
                return False, _(_PICK_WHY)
            return False, _("for {device} (bf16={bf16}, fp16={fp16}) expected {want}, got {got}.").format(
                device=_(caps["device_name"]), bf16=caps["bf16"], fp16=caps["fp16"], want=want, got=got)
    return True, _("bf16 where it computes (no scaler needed), fp16 + GradScaler otherwise, else fp32.")


_ISLAND_WHY = N_("Your island computes in fp32 but hands fp32 on: every op after it follows its input's dtype, so the "
                 "rest of the model silently runs in fp32 and the memory and speed of half precision are gone.")


def _grade_island(answer: Any) -> tuple[bool, str] | None:
    if not callable(answer):
        return False, FormatSlip(_("Define a function island_softmax(scores) and pass it."))
    g = torch.Generator().manual_seed(4)
    scores = (torch.randn(3, 5, 7, generator=g) * 30).to(torch.float16)
    scores[0, 0, 3:] = float("-inf")  # a causal mask
    scores[1, 0] = torch.tensor([100.0, 95.0, 90.0, 0.0, -5.0, 60.0, 99.0])  # sharp: exp(100) is inf in fp32 too
    want = reference_island_softmax(scores)
    got = answer(scores)
    if got is None or got is Ellipsis:
        return None  # still a stub: "not attempted yet"
    if not isinstance(got, torch.Tensor) or got.shape != scores.shape:
        return False, _("return a tensor of the same shape as scores.")
    if got.dtype == torch.float32 and torch.isfinite(got).all():
        return False, _(_ISLAND_WHY)
    if got.dtype != scores.dtype:
        return False, _("return the input dtype ({want}), got {got}: cast back after the island.").format(
            want=scores.dtype, got=got.dtype)
    if not torch.isfinite(got).all():
        return False, _("the result holds inf/NaN. exp overflows fp16 above 11.09 and fp32 above 88.7, and scores "
                       "can be larger: subtract the row max, and compute exp and the sum in float32.")
    if not torch.allclose(got.float(), want.float(), atol=2e-3):
        return False, _("the values are off: softmax over the last dimension.")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        inside = answer(scores.to(torch.bfloat16))
    if inside.dtype != torch.bfloat16 or not torch.isfinite(inside).all():
        return False, _("inside autocast the result must still be finite and in the input dtype.")
    return True, _("Upcast, compute, cast back: the fp32 island.")


# ---- 04.autocast-dtypes: predict, then run ----------------------------------------------------------
#: The ops whose output dtype under autocast the learner predicts (names of labkit.train.AUTOCAST_OPS).
PREDICT_OPS: tuple[str, ...] = ("linear", "softmax", "layer_norm", "exp", "cross_entropy")
_CPU_TABLE = {"linear": "low", "softmax": "low", "layer_norm": "low", "exp": "low", "cross_entropy": "fp32"}
_CUDA_TABLE = {"linear": "low", "softmax": "fp32", "layer_norm": "fp32", "exp": "fp32", "cross_entropy": "fp32"}
_AUTOCAST_WHY = N_("That is CUDA autocast's table, the one behind 'autocast protects my softmax'. CPU autocast "
                   "(torch 2.13) upcasts only the losses: softmax, layer_norm and exp run in bf16/fp16 here, so a "
                   "numerically fragile op gets no help unless you write the fp32 island yourself.")
_LOW = {"low", "fp16", "bf16", "float16", "bfloat16", "half", "16"}
_HIGH = {"fp32", "float32", "float", "32", "high"}
_WHY_OP = {
    "linear": N_("linear is a matmul: the first entry of autocast's low-precision list, on every device."),
    "cross_entropy": N_("losses are on autocast's fp32 list, on CPU and on CUDA."),
}


def _dtype_word(v: object) -> str | None:
    w = str(v).strip().lower().replace("torch.", "")
    return "low" if w in _LOW else "fp32" if w in _HIGH else None


def _grade_autocast(answer: object) -> tuple[bool, str]:
    got = pair(answer)
    if got is None:
        return False, NOT_A_PAIR
    pred, result = got
    if not isinstance(pred, dict) or set(pred) != set(PREDICT_OPS):
        return False, FormatSlip(_("Predict a dict with exactly the keys {keys}, each 'low' or 'fp32'.").format(
            keys=list(PREDICT_OPS)))
    words = {op: _dtype_word(v) for op, v in pred.items()}
    if None in words.values():
        return False, FormatSlip(_("Each value is 'low' (fp16/bf16) or 'fp32'."))
    if not isinstance(result, dict) or set(result) != set(PREDICT_OPS):
        raise ValueError(_("the measured table must map {ops} to 'low'/'fp32', got {result!r}").format(
            ops=PREDICT_OPS, result=result))
    if words == result:
        if result == _CPU_TABLE:
            return True, _("That is CPU autocast: matmuls go low, losses go fp32, and everything else follows its "
                           "input. Measure the table on the device you train on; CUDA upcasts softmax & co.")
        return True, _("That is this device's autocast: matmuls go low, losses go fp32, and everything else follows "
                       "its input. Measure the table on the device you train on; CUDA upcasts softmax & co.")
    if words == _CUDA_TABLE and result == _CPU_TABLE:
        return False, _(_AUTOCAST_WHY)
    off = [op for op in PREDICT_OPS if words[op] != result[op]]
    why = " ".join(_(_WHY_OP[op]) if op in _WHY_OP else _("{op} came out {dtype} here.").format(op=op, dtype=result[op])
                   for op in off)
    return False, _("Off for {ops}.").format(ops=", ".join(off)) + " " + why


# ---- 04.resume-scaler: debug ------------------------------------------------------------------------
_RESUME_WHY = N_("The checkpoint has no scaler state, so the resumed GradScaler starts again at 2^16 with a growth "
                 "count of 0: it forgets the scale it had learned and pays for it in skipped steps, and the resumed "
                 "run no longer matches the uninterrupted one.")


def _reference_save(path: Any, model: torch.nn.Module, opt: torch.optim.Optimizer,
                    scaler: torch.amp.GradScaler) -> None:
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "scaler": scaler.state_dict()}, path)


def _reference_load(path: Any, model: torch.nn.Module, opt: torch.optim.Optimizer,
                    scaler: torch.amp.GradScaler) -> None:
    ckpt = torch.load(path, weights_only=True)
    model.load_state_dict(ckpt["model"])
    opt.load_state_dict(ckpt["opt"])
    scaler.load_state_dict(ckpt["scaler"])


def _broken_save(path: Any, model: torch.nn.Module, opt: torch.optim.Optimizer,
                 scaler: torch.amp.GradScaler) -> None:
    """The snippet of the exercise: model and optimizer, but not the scaler."""
    torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, path)


def _broken_load(path: Any, model: torch.nn.Module, opt: torch.optim.Optimizer,
                 scaler: torch.amp.GradScaler) -> None:
    ckpt = torch.load(path, weights_only=True)
    model.load_state_dict(ckpt["model"])
    opt.load_state_dict(ckpt["opt"])


def _grade_resume(answer: Any) -> tuple[bool, str] | None:
    import tempfile
    from pathlib import Path

    if not (isinstance(answer, (tuple, list)) and len(answer) == 2 and all(callable(f) for f in answer)):
        return False, FormatSlip(_("Pass the two functions: check('04.resume-scaler', (save_checkpoint, "
                                   "load_checkpoint))."))
    save, load = answer
    from labkit import models

    g = torch.Generator().manual_seed(8)
    x, y = torch.randn(16, 8, generator=g), torch.randn(16, 1, generator=g)
    model = models.MLP(8, 16, 1, depth=1, seed=2)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=2)
    for _step in range(5):  # clean steps: the scale grows to 2^12, the growth count ends at 1
        opt.zero_grad()
        scaler.scale(torch.nn.functional.mse_loss(model(x), y)).backward()
        scaler.step(opt)
        scaler.update()
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "ckpt.pt"
        save(str(path), model, opt, scaler)
        if not path.exists():
            return None  # save wrote nothing: still a stub, "not attempted yet"
        try:
            torch.load(path, weights_only=True)
        except Exception:  # any failure to read it back is the learner's to fix
            return False, _("torch.load(path, weights_only=True) cannot read your checkpoint: save state_dicts "
                           "(tensors and plain values), never whole objects.")
        model2 = models.MLP(8, 16, 1, depth=1, seed=3)
        opt2 = torch.optim.AdamW(model2.parameters(), lr=1e-2)
        scaler2 = torch.amp.GradScaler("cpu", growth_interval=2)
        load(str(path), model2, opt2, scaler2)
    if not all(torch.equal(p, q) for p, q in zip(model.parameters(), model2.parameters())):
        return False, _("load_checkpoint did not restore the model's weights.")
    if opt2.state_dict()["state"].keys() != opt.state_dict()["state"].keys():
        return False, _("load_checkpoint did not restore the optimizer's state (Adam's moments).")
    if scaler2.get_scale() == 2.0**16 and scaler.get_scale() != 2.0**16:
        return False, _(_RESUME_WHY)
    if scaler2.state_dict() != scaler.state_dict():
        return False, _("The resumed scaler has {got}, the saved one had {saved}: restore its whole state_dict (the "
                        "scale and the growth tracker).").format(got=scaler2.state_dict(), saved=scaler.state_dict())
    return True, _("Model, optimizer and scaler come back: a resumed run continues exactly where it stopped.")


def _measure_autocast_dtypes() -> dict[str, str]:
    """Which of PREDICT_OPS autocast runs in low precision on the notebook's device, in its AMP dtype (fp16 where
    it computes, else bf16): the experiment of 04.autocast-dtypes, through ``train.autocast_op_dtypes``."""
    from labkit import device as dev_gate
    from labkit import train

    dev = dev_gate.pick_device()
    amp = torch.float16 if dev_gate.computes(torch.float16, dev) else torch.bfloat16
    got = train.autocast_op_dtypes(dev, amp)
    return {op: "fp32" if got[op][1] == torch.float32 else "low" for op in PREDICT_OPS}


EXERCISES = [
    Exercise(
        id="04.amp-step",
        prompt="Write amp_step(model, opt, scaler, x, y, dtype): one AMP step with clipping to 1.0.",
        grade=_grade_amp_step,
        hint="Section 2's three steps, plus clipping: where in the sequence do the gradients hold their true values?",
        method="Follow what the gradients hold through one step: after the scaled backward they are S times too "
               "big, and they stay so until one scaler call divides them back. The clip must measure true "
               "gradients; the optimizer step must go through the scaler (it skips a step with inf); the scale is "
               "adapted last.",
        solution="opt.zero_grad()\nwith torch.autocast(device_type=x.device.type, dtype=dtype):\n"
                 "    loss = models.lm_loss(model(x), y)\nscaler.scale(loss).backward()\nscaler.unscale_(opt)\n"
                 "torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)\nscaler.step(opt)\nscaler.update()",
        kind="implement", wrong_why=_CLIP_WHY,
        reference=reference_amp_step,
        wrong=_clip_before_unscale,
    ),
    Exercise(
        id="04.pick-dtype",
        prompt="Write pick_amp(caps) -> (dtype name, use_scaler) for a device's capabilities.",
        grade=_grade_pick_amp,
        hint="Which 16-bit format can fail by underflow, and which needs nothing extra?",
        method="Go in order of preference: the format with fp32's range first (no scaler), then the one with "
               "the narrow range (it needs a GradScaler), then no mixed precision at all.",
        solution="if caps['bf16']: return 'bf16', False\nif caps['fp16']: return 'fp16', True\nreturn 'fp32', False",
        kind="implement", wrong_why=_PICK_WHY,
        reference=reference_pick_amp,
        wrong=_fp16_first,
    ),
    Exercise(
        id="04.fp32-island",
        prompt="Write island_softmax(scores): a softmax that never overflows in half precision.",
        grade=_grade_island,
        hint="Do the fragile computation in a wider dtype, and hand the rest of the model what it gave you.",
        method="An island needs three things: autocast must leave the region alone (an op on autocast's "
               "low-precision list, a matmul say, would be cast back down), the fragile op must run on fp32 inputs, and what leaves the island must be what the rest "
               "of the model expects. Find the torch call for each.",
        solution="with torch.autocast(device_type=scores.device.type, enabled=False):\n"
                 "    return torch.softmax(scores.float(), dim=-1).to(scores.dtype)",
        kind="implement", wrong_why=_ISLAND_WHY,
        reference=reference_island_softmax,
        wrong=_island_no_cast_back,
    ),
    Exercise(
        id="04.autocast-dtypes",
        prompt="Predict, then run: under autocast on this device, which of PREDICT_OPS come out in low precision "
               "('low') and which in fp32 ('fp32')?",
        grade=_grade_autocast,
        hint="Autocast keeps lists of ops, and the lists are not the same on every device.",
        method="Matmuls are on the low-precision list everywhere; losses on the fp32 list everywhere. The ops in "
               "between (softmax, layer_norm, exp) are upcast by CUDA autocast. What does CPU autocast do with "
               "them? (The notebook's setup cell says which device this is.)",
        solution="prediction = {'linear': 'low', 'softmax': 'low', 'layer_norm': 'low', 'exp': 'low', "
                 "'cross_entropy': 'fp32'} on a CPU (torch 2.13); on CUDA softmax, layer_norm and exp are 'fp32'.",
        kind="predict", wrong_why=_AUTOCAST_WHY,
        reference=(dict(_CPU_TABLE), dict(_CPU_TABLE)),
        wrong=(dict(_CUDA_TABLE), dict(_CPU_TABLE)),
        measure=_measure_autocast_dtypes,
    ),
    Exercise(
        id="04.resume-scaler",
        prompt="Debug: a run resumed with save_checkpoint/load_checkpoint restarts its loss scale at 2^16. Write "
               "fixed save_checkpoint(path, model, opt, scaler) and load_checkpoint(path, model, opt, scaler).",
        grade=_grade_resume,
        hint="List everything whose state a training step changes. Is each of them in the checkpoint?",
        method="List the objects whose state a training step changes (there are three). A checkpoint that "
               "resumes the run exactly saves the state of each one, and the resume restores each one.",
        solution="save: torch.save({'model': model.state_dict(), 'opt': opt.state_dict(), "
                 "'scaler': scaler.state_dict()}, path)\nload: ckpt = torch.load(path, weights_only=True); then "
                 "model/opt/scaler.load_state_dict(ckpt[...]) for all three",
        kind="debug", wrong_why=_RESUME_WHY,
        reference=(_reference_save, _reference_load),
        wrong=(_broken_save, _broken_load),
    ),
]
