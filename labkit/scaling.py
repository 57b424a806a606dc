"""Loss scaling: a readable dynamic loss scaler, underflow/overflow fractions, static scales, DeepSpeed's knobs.

- :class:`DynamicLossScaler` re-implements the rule of ``torch.amp.GradScaler`` in plain Python, with
  the same methods (``scale``, ``unscale_``, ``step``, ``update``, ``get_scale``, ``state_dict``) and the
  same scale arithmetic (the scale is a float32 number), plus a ``history`` of every step for plotting.
  ``tests/test_scaling.py`` checks that it produces the same scales and skips the same steps as
  ``torch.amp.GradScaler("cpu")``.
- :func:`simulate_scales` runs that rule on a list of "this step overflowed" flags;
  :func:`deepspeed_scale_sequence` does the same for DeepSpeed's rule (hysteresis, min scale, its
  window), which is checked against ``deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler``.
- :func:`underflow_fraction` / :func:`overflow_fraction` measure how many values (real gradients)
  flush to zero or overflow when scaled by ``scale`` and cast to a low-precision format;
  :func:`safe_scale_powers` / :func:`choose_scale_power` find the static scales ``2**k`` that avoid both.
- :func:`deepspeed_fp16_config` / :func:`scaler_kwargs_from_deepspeed` translate between GradScaler's
  arguments and DeepSpeed's ``fp16`` config block; :data:`DEEPSPEED_KNOBS` lists the correspondences.

Introduced in notebook 03.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from labkit import precision
from labkit._validate import as_float, check_dense, safe_repr
from labkit.i18n import N_
from labkit.i18n import gettext as _

__all__ = [
    "LossScaleAtMinimumError",
    "DEEPSPEED_KNOBS",
    "DTYPES",
    "DynamicLossScaler",
    "ScaleEvent",
    "choose_scale_power",
    "deepspeed_fp16_config",
    "deepspeed_knobs_markdown",
    "deepspeed_scale_sequence",
    "grad_values",
    "overflow_fraction",
    "safe_scale_powers",
    "scaler_kwargs_from_deepspeed",
    "simulate_scales",
    "train_with_scaler",
    "underflow_fraction",
]

#: The low-precision formats the fraction helpers accept, by labkit's format names.
DTYPES: dict[str, torch.dtype] = {n: precision.dtype(n) for n in ("fp32", "fp16", "bf16", "e5m2", "e4m3fn")}


def _fp32(x: float) -> float:
    """Round a Python float to the nearest float32 (inf beyond float32's range), as a Python float."""
    with np.errstate(over="ignore"):
        return float(np.float32(x))


def _check_number(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    return as_float(name, value)


def _check_int(name: str, value: Any, minimum: int, maximum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {safe_repr(value)}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{name} must be at most {maximum}, got {safe_repr(value)}")
    return int(value)


#: The largest initial_scale_power taken: 2**127 is the largest power of two an fp32 loss scale can be.
_MAX_SCALE_POWER = 127


# --------------------------------------------------------------------------------------------------
# The dynamic loss scaler
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ScaleEvent:
    """One optimizer step seen by a :class:`DynamicLossScaler`: the scale it used and what happened.

    ``skipped`` is True when the gradients held inf/NaN, so the optimizer step was not taken and the
    scale backed off. ``new_scale`` is the scale after ``update()``.

    Introduced in notebook 03.
    """

    step: int
    scale: float
    skipped: bool
    new_scale: float


class DynamicLossScaler:
    """Scale the loss up so small gradients survive fp16, and adapt the scale like ``torch.amp.GradScaler``.

    The rule, applied by :meth:`update` once per optimizer step:

    - the step's gradients hold an inf or NaN  ->  skip the optimizer step, ``scale *= backoff_factor``
      (but never below ``min_scale``), and restart the count of clean steps;
    - otherwise count one clean step; after ``growth_interval`` clean steps in a row,
      ``scale *= growth_factor`` (unless that would overflow float32) and restart the count.

    As in GradScaler the scale is a float32 number, so a long run of overflows walks it down through
    float32's subnormals to 0 unless ``min_scale`` stops it (GradScaler has no ``min_scale``; the default
    0 reproduces it exactly). Usage, the same as GradScaler's::

        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)          # optional: only needed to clip or inspect gradients
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(optimizer)              # skipped if any gradient is inf/NaN; returns True if it stepped
        scaler.update()

    Introduced in notebook 03.
    """

    def __init__(
        self,
        init_scale: float = 2.0**16,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        growth_interval: int = 2000,
        min_scale: float = 0.0,
    ) -> None:
        init_scale = _check_number("init_scale", init_scale)
        growth_factor = _check_number("growth_factor", growth_factor)
        backoff_factor = _check_number("backoff_factor", backoff_factor)
        min_scale = _check_number("min_scale", min_scale)
        if not (0.0 < init_scale < math.inf):
            raise ValueError(f"init_scale must be a positive finite number, got {init_scale}")
        if not (1.0 < growth_factor < math.inf):
            raise ValueError(f"growth_factor must be > 1.0, got {growth_factor}")
        if not (0.0 < backoff_factor < 1.0):
            raise ValueError(f"backoff_factor must be in (0, 1), got {backoff_factor}")
        self.growth_interval = _check_int("growth_interval", growth_interval, 1)
        if not (0.0 <= min_scale <= init_scale):
            raise ValueError(f"min_scale must be in [0, init_scale={init_scale}], got {min_scale}")
        self.growth_factor = growth_factor
        self.backoff_factor = backoff_factor
        self.min_scale = _fp32(min_scale)
        self._scale = _fp32(init_scale)
        self._growth_tracker = 0  # clean steps in a row since the last growth or backoff
        self._found_inf: bool | None = None  # this step's verdict, once unscale_/step has looked
        self._unscaled: set[int] = set()  # ids of optimizers already unscaled this step
        self.history: list[ScaleEvent] = []

    # ---- what GradScaler exposes ---------------------------------------------------------------
    def get_scale(self) -> float:
        """Return the current scale (a float32 value, as a Python float). Introduced in notebook 03."""
        return self._scale

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        """Return ``loss * scale`` (multiply before ``backward()``, so every gradient is scaled too).

        Introduced in notebook 03.
        """
        if not isinstance(loss, torch.Tensor):
            raise TypeError(f"scale() takes the loss tensor, got {type(loss).__name__}")
        return loss * torch.tensor(self._scale, dtype=torch.float32, device=loss.device)

    def unscale_(self, optimizer: torch.optim.Optimizer) -> bool:
        """Divide the optimizer's gradients by the scale in place; return True if any was inf or NaN.

        Call it before clipping or inspecting gradients. Like GradScaler it refuses fp16 gradients
        (keep fp32 master weights) and a second call for the same optimizer before :meth:`update`.
        Introduced in notebook 03.
        """
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"unscale_() takes a torch.optim.Optimizer, got {type(optimizer).__name__}")
        if id(optimizer) in self._unscaled:
            raise RuntimeError("unscale_() has already been called on this optimizer since the last update().")
        grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        found = self._unscale_grads(grads)
        self._unscaled.add(id(optimizer))
        self._found_inf = bool(self._found_inf) or found
        return found

    def _unscale_grads(self, grads: list[torch.Tensor]) -> bool:
        if any(g.dtype == torch.float16 for g in grads):
            raise ValueError("Attempting to unscale FP16 gradients: keep the parameters (master weights) in fp32.")
        # GradScaler computes 1/scale in float64 and rounds it to float32 once.
        inv_scale = _fp32(1.0 / self._scale) if self._scale != 0.0 else math.inf
        found = False
        with torch.no_grad():
            for g in grads:
                if not bool(torch.isfinite(g).all()):
                    found = True
                g.mul_(inv_scale)
        return found

    def step(self, optimizer: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> bool:
        """Unscale (if not done yet), then take the optimizer step unless a gradient is inf/NaN.

        Returns True if the step was taken, False if it was skipped (GradScaler returns the
        optimizer's own return value instead). Introduced in notebook 03.
        """
        if id(optimizer) not in self._unscaled:
            self.unscale_(optimizer)
        if self._found_inf:
            return False
        optimizer.step(*args, **kwargs)
        return True

    def update(self, found_inf: bool | None = None) -> float:
        """Apply the growth/backoff rule once and return the new scale.

        ``found_inf`` defaults to what :meth:`unscale_`/:meth:`step` saw this step; pass it explicitly
        to drive the rule by hand (``scaler.update(found_inf=True)``). Introduced in notebook 03.
        """
        if found_inf is None:
            if self._found_inf is None:
                raise RuntimeError("update() needs unscale_()/step() first, or an explicit found_inf=True/False.")
            found_inf = self._found_inf
        if not isinstance(found_inf, (bool, np.bool_)):
            raise TypeError(f"found_inf must be a bool, got {type(found_inf).__name__}")
        old = self._scale
        self.grow_or_back_off(bool(found_inf))
        self.history.append(ScaleEvent(len(self.history), old, bool(found_inf), self._scale))
        self._found_inf = None
        self._unscaled.clear()
        return self._scale

    def grow_or_back_off(self, found_inf: bool) -> None:
        """The dynamic loss-scaling rule, applied once (what :meth:`update` does after its checks).

        Introduced in notebook 03.
        """
        if found_inf:  # skip the step: halve the scale, start counting clean steps again
            self._scale = max(_fp32(self._scale * self.backoff_factor), self.min_scale)
            self._growth_tracker = 0
        else:  # a clean step: after growth_interval of them in a row, double the scale
            self._growth_tracker += 1
            if self._growth_tracker == self.growth_interval:
                grown = _fp32(self._scale * self.growth_factor)
                if math.isfinite(grown):  # never grow past float32's range to inf
                    self._scale = grown
                self._growth_tracker = 0

    # ---- checkpointing -------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Return the scaler's state with GradScaler's keys (plus ``min_scale``), for a checkpoint.

        ``torch.amp.GradScaler.load_state_dict`` accepts it, and :meth:`load_state_dict` accepts
        GradScaler's. Introduced in notebook 03.
        """
        return {
            "scale": self._scale,
            "growth_factor": self.growth_factor,
            "backoff_factor": self.backoff_factor,
            "growth_interval": self.growth_interval,
            "_growth_tracker": self._growth_tracker,
            "min_scale": self.min_scale,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the state saved by :meth:`state_dict` (or by ``GradScaler.state_dict()``).

        Introduced in notebook 03.
        """
        if not isinstance(state, dict):
            raise TypeError(f"state must be a dict, got {type(state).__name__}")
        missing = {"scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker"} - set(state)
        if missing:
            raise ValueError(f"not a loss-scaler state: missing keys {sorted(missing)}")
        # GradScaler accepts any finite scale >= 0, and so must we: update() can halve a scale down to 0 (a
        # collapsed scale), and a checkpoint written then must load in both directions.
        scale = _check_number("scale", state["scale"])
        if not (0.0 <= scale < math.inf):
            raise ValueError(f"scale must be a finite number >= 0, got {scale}")
        fresh = DynamicLossScaler(
            init_scale=1.0, growth_factor=float(state["growth_factor"]),
            backoff_factor=float(state["backoff_factor"]), growth_interval=int(state["growth_interval"]),
            min_scale=0.0,
        )
        self.__dict__.update({k: v for k, v in fresh.__dict__.items() if k != "history"})
        self._scale = _fp32(scale)
        min_scale = _check_number("min_scale", state.get("min_scale", 0.0))
        if not min_scale >= 0.0:
            raise ValueError(f"min_scale must be >= 0, got {min_scale}")
        self.min_scale = _fp32(min(min_scale, scale))
        self._growth_tracker = _check_int("_growth_tracker", state["_growth_tracker"], 0)

    def __repr__(self) -> str:
        return (f"DynamicLossScaler(scale={self._scale:g}, growth_factor={self.growth_factor:g}, "
                f"backoff_factor={self.backoff_factor:g}, growth_interval={self.growth_interval}, "
                f"min_scale={self.min_scale:g})")


def simulate_scales(found_infs: Iterable[bool], **scaler_kwargs: Any) -> list[float]:
    """Return the scale before each step and after the last one, for a pattern of overflow flags.

    ``simulate_scales([False, True, False], init_scale=8.0, growth_interval=2)`` gives
    ``[8.0, 8.0, 4.0, 4.0]``: element ``i`` is the scale step ``i`` used, the last element the scale
    after the final update. Keyword arguments go to :class:`DynamicLossScaler`.
    Introduced in notebook 03.
    """
    flags = _flags(found_infs, "found_infs")
    scaler = DynamicLossScaler(**scaler_kwargs)
    scales = [scaler.get_scale()]
    for f in flags:
        scales.append(scaler.update(found_inf=f))
    return scales


# --------------------------------------------------------------------------------------------------
# Which values underflow / overflow in a format, and which static scales avoid both
# --------------------------------------------------------------------------------------------------


def _dtype(fmt: str | torch.dtype) -> torch.dtype:
    if isinstance(fmt, torch.dtype):
        if fmt not in DTYPES.values():
            raise ValueError(f"unsupported dtype {fmt}; choose one of {sorted(DTYPES)}")
        return fmt
    if not isinstance(fmt, str):
        raise TypeError(f"format must be a name such as 'fp16' or a torch.dtype, got {type(fmt).__name__}")
    try:
        name = precision.dtype_name(fmt)  # labkit.formats' names and aliases ("half", "bfloat16" …)
    except ValueError:
        name = fmt
    if name not in DTYPES:
        raise ValueError(f"unknown format {safe_repr(fmt)}; choose one of {sorted(DTYPES)}")
    return DTYPES[name]


class LossScaleAtMinimumError(RuntimeError, ValueError):
    """DeepSpeed's stop: an overflow with the loss scale already at ``min_loss_scale`` (the flags given cannot be
    trained through). A RuntimeError, as DeepSpeed raises, and a ValueError, since the input decided it.

    Introduced in notebook 03.
    """


def _flags(values: object, name: str) -> list[bool]:
    if isinstance(values, (str, bytes, torch.Tensor, np.ndarray)) or not isinstance(values, Iterable):
        raise TypeError(f"{name} must be a list of bools (one per step), got {type(values).__name__}")
    out = list(values)
    if not all(isinstance(v, (bool, np.bool_)) for v in out):
        raise TypeError(f"{name} must hold bools (True: that step overflowed)")
    return [bool(v) for v in out]


def grad_values(params: Iterable[torch.Tensor] | torch.nn.Module) -> torch.Tensor:
    """Return every gradient of a model (or of an iterable of parameters) as one flat float32 tensor.

    Parameters without a gradient are left out. Introduced in notebook 03.
    """
    if isinstance(params, torch.nn.Module):
        params = params.parameters()
    if isinstance(params, (str, bytes, torch.Tensor)) or not isinstance(params, Iterable):
        raise TypeError(f"params must be a model or an iterable of tensors, got {type(params).__name__}")
    params = list(params)
    if not all(isinstance(p, torch.Tensor) for p in params):
        raise TypeError("params must hold tensors (e.g. model.parameters())")
    grads = [p.grad.detach().reshape(-1).float() for p in params if p.grad is not None]
    if not grads:
        raise ValueError("no parameter has a gradient yet: run backward() first")
    return torch.cat(grads)


def _values(values: Any) -> torch.Tensor:
    if isinstance(values, torch.Tensor):
        t = check_dense("values", values).detach()
    elif isinstance(values, np.ndarray):
        t = torch.from_numpy(np.asarray(values, dtype=np.float64))
    elif isinstance(values, (list, tuple)) and values and all(isinstance(v, torch.Tensor) for v in values):
        t = torch.cat([check_dense("values", v).detach().reshape(-1).double() for v in values])
    else:
        try:
            t = torch.as_tensor(np.asarray(values, dtype=np.float64))
        except (TypeError, ValueError, OverflowError) as exc:
            raise TypeError(f"values must be a tensor, an array or a list of numbers, got {type(values).__name__}") from exc
    if not (t.is_floating_point() or t.dtype in (torch.int32, torch.int64)):
        raise TypeError(f"values must be real numbers, got dtype {t.dtype}")
    return t.reshape(-1).double().cpu()


def _scaled_cast(values: Any, fmt: str | torch.dtype, scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.dtype]:
    scale = _check_number("scale", scale)
    if not (0.0 < scale < math.inf):
        raise ValueError(f"scale must be a positive finite number, got {scale}")
    dtype = _dtype(fmt)
    v = _values(values)
    v = v[torch.isfinite(v)]
    # Gradients live in fp32: scale there, then cast once to the target format.
    scaled = (v * scale).float()
    return v, scaled, dtype


def underflow_fraction(values: Any, fmt: str | torch.dtype = "fp16", scale: float = 1.0, to: str = "zero") -> float:
    """Return the fraction of the nonzero finite ``values`` that underflow when ``values * scale`` is cast to ``fmt``.

    ``to="zero"`` counts values that flush to zero (the gradient is lost); ``to="subnormal"`` counts
    values that land below the smallest normal number, where precision is already lost. Zeros in
    ``values`` and non-finite values are not counted. Returns 0.0 when there is nothing to count.
    Introduced in notebook 03.
    """
    if to not in ("zero", "subnormal"):
        raise ValueError(f"to must be 'zero' or 'subnormal', got {safe_repr(to)}")
    v, scaled, dtype = _scaled_cast(values, fmt, scale)
    nonzero = v != 0
    n = int(nonzero.sum())
    if n == 0:
        return 0.0
    q = scaled.to(dtype).float().abs()
    if to == "zero":
        lost = q == 0
    else:
        lost = q < torch.finfo(dtype).smallest_normal
    return float((lost & nonzero).sum()) / n


def overflow_fraction(values: Any, fmt: str | torch.dtype = "fp16", scale: float = 1.0) -> float:
    """Return the fraction of the finite ``values`` whose ``values * scale`` is out of ``fmt``'s range.

    For formats with inf (fp16, bf16, e5m2, fp32) that is "becomes inf when cast"; e4m3fn has no inf
    (torch saturates to 448, ml_dtypes gives NaN), so there it is "rounds above 448".
    Introduced in notebook 03.
    """
    v, scaled, dtype = _scaled_cast(values, fmt, scale)
    if v.numel() == 0:
        return 0.0
    if dtype == torch.float8_e4m3fn:
        # 464 is halfway between 448 and 480 (not a value), and rounds to 448 (even mantissa).
        out = scaled.abs() > 464.0
    else:
        out = torch.isinf(scaled.to(dtype))
    return float(out.sum()) / v.numel()


def safe_scale_powers(values: Any, fmt: str | torch.dtype = "fp16", to: str = "zero") -> tuple[int, int] | None:
    """Return the range ``(k_lo, k_hi)`` of powers such that ``2**k`` makes no value underflow or overflow.

    "Underflow" is in the sense of :func:`underflow_fraction` (``to``); every ``k`` with
    ``k_lo <= k <= k_hi`` gives both fractions 0. Returns None when no such power exists: the values
    span more binades than the format has. Introduced in notebook 03.
    """
    v = _values(values)
    v = v[torch.isfinite(v) & (v != 0)].abs()
    if v.numel() == 0:
        raise ValueError("values hold no nonzero finite number, so any scale is safe")
    lo_v, hi_v = float(v.min()), float(v.max())
    dtype = _dtype(fmt)
    fi = torch.finfo(dtype)
    # Start from log2 estimates, then step until the real cast agrees (the boundaries depend on rounding).
    tiny = fi.smallest_normal * (fi.eps if to == "zero" else 1.0)
    k_lo = math.floor(math.log2(tiny / lo_v)) - 2
    while underflow_fraction([lo_v], dtype, 2.0**k_lo, to) > 0:
        k_lo += 1
    k_hi = math.floor(math.log2(fi.max / hi_v)) + 2
    while overflow_fraction([hi_v], dtype, 2.0**k_hi) > 0:
        k_hi -= 1
    return (k_lo, k_hi) if k_lo <= k_hi else None


def choose_scale_power(values: Any, fmt: str | torch.dtype = "fp16", to: str = "zero") -> int:
    """Return a static scale power ``k``: the middle of :func:`safe_scale_powers`, for headroom both ways.

    Raises ``ValueError`` when no power of two is safe. Introduced in notebook 03.
    """
    rng = safe_scale_powers(values, fmt, to)
    if rng is None:
        raise ValueError(f"no scale 2**k keeps these values inside {fmt}'s range: their span is too wide")
    return (rng[0] + rng[1]) // 2


# --------------------------------------------------------------------------------------------------
# A training loop that records what the scaler did
# --------------------------------------------------------------------------------------------------


def train_with_scaler(
    model: torch.nn.Module,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    batches: Callable[[int], tuple[torch.Tensor, torch.Tensor]],
    optimizer: torch.optim.Optimizer,
    scaler: Any,
    steps: int,
    *,
    dtype: torch.dtype = torch.float16,
    emulate: bool = False,
    max_norm: float | None = None,
) -> dict[str, list]:
    """Train ``steps`` steps with autocast to ``dtype`` and a loss scaler; return what happened per step.

    ``scaler`` is a ``torch.amp.GradScaler`` or a :class:`DynamicLossScaler`. Each step: autocast
    forward, ``scaler.scale(loss).backward()``, ``unscale_``, optional clipping to ``max_norm``,
    ``scaler.step``, ``scaler.update``, on the model's device (batches are moved there). With ``emulate=True`` (for CPUs without fp16 compute) the
    forward runs in fp32 and each scaled gradient is rounded through fp16 instead, so values beyond
    65504 become inf exactly as fp16 gradients would. Returns lists ``scale`` (the scale each step
    used), ``skipped`` (bool) and ``loss`` (unscaled, float).
    Introduced in notebook 03.
    """
    steps = _check_int("steps", steps, 1)
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
    device = next(model.parameters()).device
    taken: list[int] = []
    handle = optimizer.register_step_post_hook(lambda opt, args, kwargs: taken.append(1))
    out: dict[str, list] = {"scale": [], "skipped": [], "loss": []}
    try:
        for step in range(steps):
            x, y = (t.to(device) for t in batches(step))
            optimizer.zero_grad(set_to_none=True)
            with torch.autocast(device_type=device.type, dtype=dtype, enabled=not emulate):
                loss = loss_fn(model(x), y)
            precision.backward(loss, scaler)
            if emulate:  # what fp16 gradients would hold: round each scaled gradient through fp16
                with torch.no_grad():
                    for p in model.parameters():
                        if p.grad is not None:
                            p.grad.copy_(p.grad.to(dtype).float())
            before = len(taken)
            scale = precision.update(optimizer, scaler, model.parameters(), clip_grad_norm=max_norm).scale
            out["scale"].append(scale)
            out["skipped"].append(len(taken) == before)
            out["loss"].append(float(loss.detach().float()))
    finally:
        handle.remove()
    return out


# --------------------------------------------------------------------------------------------------
# DeepSpeed's fp16 block
# --------------------------------------------------------------------------------------------------

#: DeepSpeed ``fp16`` config keys, their GradScaler counterpart, both defaults, and how they differ.
DEEPSPEED_KNOBS: list[dict[str, str]] = [
    {"deepspeed": "loss_scale", "gradscaler": "(enabled)", "ds_default": "0", "torch_default": "-",
     "note": N_("0 = dynamic scaling; any other value is a fixed (static) scale")},
    {"deepspeed": "initial_scale_power", "gradscaler": "init_scale", "ds_default": "16 (2**16)",
     "torch_default": "65536.0", "note": N_("DeepSpeed takes the power k, the scale starts at 2**k")},
    {"deepspeed": "loss_scale_window", "gradscaler": "growth_interval", "ds_default": "1000",
     "torch_default": "2000", "note": N_("clean steps per growth; after an overflow or at the start DeepSpeed needs window+1")},
    {"deepspeed": "hysteresis", "gradscaler": "-", "ds_default": "2", "torch_default": "(1)",
     "note": N_("every overflow skips its step; the first h-1 keep the scale, the h-th halves it; GradScaler halves at the first")},
    {"deepspeed": "consecutive_hysteresis", "gradscaler": "-", "ds_default": "false", "torch_default": "-",
     "note": N_("refill the hysteresis after every clean step instead of at growth")},
    {"deepspeed": "min_loss_scale", "gradscaler": "-", "ds_default": "1", "torch_default": "(0)",
     "note": N_("floor for the scale; DeepSpeed stops the run on an overflow at the floor")},
    {"deepspeed": "(fixed 2.0)", "gradscaler": "growth_factor", "ds_default": "2", "torch_default": "2.0",
     "note": N_("DeepSpeed always doubles")},
    {"deepspeed": "(fixed 2.0)", "gradscaler": "backoff_factor", "ds_default": "1/2", "torch_default": "0.5",
     "note": N_("DeepSpeed always halves")},
]


def deepspeed_knobs_markdown() -> str:
    """:data:`DEEPSPEED_KNOBS` as a Markdown table (DeepSpeed's ``fp16`` key, the GradScaler argument, both
    defaults, the difference), in the notebook's language. Introduced in notebook 03."""
    rows = [_("| DeepSpeed `fp16` key | GradScaler | DeepSpeed default | GradScaler default | difference |"),
            "|---|---|---|---|---|"]
    rows += [f"| `{r['deepspeed']}` | `{r['gradscaler']}` | {r['ds_default']} | {r['torch_default']} | {_(r['note'])} |"
             for r in DEEPSPEED_KNOBS]
    return "\n".join(rows)


def deepspeed_fp16_config(scaler: Any = None, *, hysteresis: int = 1, min_loss_scale: float = 1.0) -> dict[str, Any]:
    """Return DeepSpeed's ``fp16`` config block closest to a GradScaler / :class:`DynamicLossScaler`.

    ``scaler`` defaults to GradScaler's defaults. DeepSpeed only doubles and halves, and takes the
    initial scale as a power of two, so other factors or scales raise ``ValueError``. ``hysteresis=1``
    makes DeepSpeed back off at the first overflow, as GradScaler does; a scaler's ``min_scale`` (if
    above 0) becomes ``min_loss_scale``. Introduced in notebook 03.
    """
    if scaler is None:
        state = {"scale": 2.0**16, "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 2000}
    elif isinstance(scaler, (torch.amp.GradScaler, DynamicLossScaler)):
        state = scaler.state_dict()
        if not state:
            raise ValueError("this scaler is disabled (empty state_dict): use DeepSpeed's bf16 or fp32 instead")
    else:
        raise TypeError(f"scaler must be a GradScaler or DynamicLossScaler, got {type(scaler).__name__}")
    if state["growth_factor"] != 2.0 or state["backoff_factor"] != 0.5:
        raise ValueError("DeepSpeed's dynamic loss scale always uses growth_factor=2.0 and backoff_factor=0.5, "
                         f"got {state['growth_factor']} and {state['backoff_factor']}")
    mant, exp = math.frexp(float(state["scale"]))
    if mant != 0.5:
        raise ValueError(f"DeepSpeed's initial scale is 2**initial_scale_power; {state['scale']} is not a power of two")
    _check_int("hysteresis", hysteresis, 1)
    floor = float(state.get("min_scale", 0.0)) or _check_number("min_loss_scale", min_loss_scale)
    if floor <= 0:
        raise ValueError(f"min_loss_scale must be > 0 for DeepSpeed, got {floor}")
    return {
        "enabled": True,
        "loss_scale": 0,
        "initial_scale_power": exp - 1,
        "loss_scale_window": int(state["growth_interval"]),
        "hysteresis": hysteresis,
        "consecutive_hysteresis": False,
        "min_loss_scale": floor,
    }


def scaler_kwargs_from_deepspeed(fp16: dict[str, Any]) -> dict[str, Any]:
    """Return :class:`DynamicLossScaler` / GradScaler keyword arguments for a DeepSpeed ``fp16`` block.

    Missing keys take DeepSpeed's defaults. A static ``loss_scale`` (not 0) or ``hysteresis`` other than
    1 has no GradScaler equivalent and raises ``ValueError``. ``min_scale`` is included (drop it for
    GradScaler, which has no floor). Introduced in notebook 03.
    """
    if not isinstance(fp16, dict):
        raise TypeError(f"fp16 must be a dict (DeepSpeed's 'fp16' block), got {type(fp16).__name__}")
    unknown = set(fp16) - {"enabled", "auto_cast", "loss_scale", "initial_scale_power", "loss_scale_window",
                           "hysteresis", "consecutive_hysteresis", "min_loss_scale"}
    if unknown:
        raise ValueError(f"unknown fp16 keys {sorted(unknown)}")
    if fp16.get("loss_scale", 0) != 0:
        raise ValueError(f"loss_scale={fp16['loss_scale']} is a static scale: no dynamic scaler needed")
    if fp16.get("hysteresis", 2) != 1:
        raise ValueError("GradScaler has no hysteresis: it backs off at the first overflow (set hysteresis to 1)")
    return {
        "init_scale": 2.0 ** _check_int("initial_scale_power", fp16.get("initial_scale_power", 16), -126,
                                        _MAX_SCALE_POWER),
        "growth_factor": 2.0,
        "backoff_factor": 0.5,
        "growth_interval": _check_int("loss_scale_window", fp16.get("loss_scale_window", 1000), 1),
        "min_scale": float(fp16.get("min_loss_scale", 1)),
    }


def deepspeed_scale_sequence(
    overflows: Sequence[bool],
    *,
    initial_scale_power: int = 16,
    loss_scale_window: int = 1000,
    hysteresis: int = 2,
    consecutive_hysteresis: bool = False,
    min_loss_scale: float = 1.0,
) -> list[float]:
    """Return the scale DeepSpeed's dynamic loss scaler uses at each step, and after the last one.

    The rule (DeepSpeed 0.19's ``DynamicLossScaler.update_scale``): on an overflow, use up one unit of
    hysteresis; when none is left, halve the scale (not below ``min_loss_scale``; an overflow at the
    floor raises ``RuntimeError``, which stops a DeepSpeed run). Without overflow, grow by 2 when the
    number of clean steps since the last overflow, not counting this one, is a positive multiple of
    ``loss_scale_window``, and then refill the hysteresis. Introduced in notebook 03.
    """
    _check_int("loss_scale_window", loss_scale_window, 1)
    _check_int("hysteresis", hysteresis, 1)
    scale = 2.0 ** _check_int("initial_scale_power", initial_scale_power, -126, _MAX_SCALE_POWER)
    cur_hyst, last_overflow = hysteresis, -1
    scales = [scale]
    for it, overflow in enumerate(_flags(overflows, "overflows")):
        if overflow:
            if hysteresis == 1 or cur_hyst == 1:
                if scale == min_loss_scale:
                    raise LossScaleAtMinimumError(
                        _("step {step}: overflow with the loss scale already at min_loss_scale={min_loss_scale}; "
                          "DeepSpeed stops here").format(step=it, min_loss_scale=min_loss_scale))
                scale = max(scale / 2.0, min_loss_scale)
            else:
                cur_hyst -= 1
            last_overflow = it
        else:
            if consecutive_hysteresis:
                cur_hyst = hysteresis
            stable = it - last_overflow - 1
            if stable > 0 and stable % loss_scale_window == 0:
                if not consecutive_hysteresis:
                    cur_hyst = hysteresis
                scale *= 2.0
        scales.append(scale)
    return scales
