"""Precision in one place: dtype names, the precision policies, and the AMP step.

- :func:`dtype` is the one map from a name ("bf16", "bfloat16", "fp16", "half", "e4m3fn" …) to a
  ``torch.dtype``; the names and aliases are :mod:`labkit.formats`'. :func:`dtype_name` goes back.
- :data:`POLICIES` is the one table of precision policies. Each name means one thing everywhere: notebook 04
  trains these policies with :mod:`labkit.train`, notebook 06 counts their bytes with :mod:`labkit.memory`.

  ======================  ========  ======  ===========  ============  ==========  ======  ============================
  name                    autocast  params  fp32 master  grads         fp32 grads  states  scaler
  ======================  ========  ======  ===========  ============  ==========  ======  ============================
  fp32                    -         fp32    no           fp32          no          fp32    no
  fp16                    fp16      fp32    no           fp32          no          fp32    yes (the AMP recipe)
  fp16-noscale            fp16      fp32    no           fp32          no          fp32    no
  bf16                    bf16      fp32    no           fp32          no          fp32    no
  fp16-pure               -         fp16    no           fp16          no          fp16    no
  bf16-pure               -         bf16    no           bf16          no          bf16    no
  bf16-master             -         bf16    yes          bf16          no          fp32    no (ZeRO paper: 16 B/param)
  bf16-master-fp32-grads  -         bf16    yes          -             yes         fp32    no (Hugging Face: 18)
  bf16-master-fp32-accum  -         bf16    yes          bf16          yes         fp32    no (DeepSpeed: 20)
  ======================  ========  ======  ===========  ============  ==========  ======  ============================

  "fp16"/"bf16" are autocast over fp32 weights (``torch.amp``); the ``-master`` policies keep 16-bit weights and an
  fp32 master copy that the optimizer updates (Megatron/DeepSpeed style). Aliases with one meaning each:
  ``"mixed"``/``"zero"`` = bf16-master, ``"hf"`` = bf16-master-fp32-grads, ``"deepspeed"`` = bf16-master-fp32-accum,
  ``"amp"``/``"autocast"`` = bf16.
- :func:`backward` and :func:`update` are the AMP step, in the order notebook 04 teaches: scaled backward, then
  unscale, clip, step (skipped on inf/NaN), update the scale. Every training loop in labkit calls them.

Introduced in notebook 04.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import torch

from labkit import formats
from labkit._validate import as_float, check_dense, safe_repr
from labkit.i18n import N_

__all__ = [
    "POLICIES",
    "POLICY_ALIASES",
    "Policy",
    "StepInfo",
    "autocast",
    "backward",
    "dtype",
    "dtype_name",
    "get_policy",
    "grad_norm",
    "update",
]


def dtype(name: str | torch.dtype) -> torch.dtype:
    """Return the ``torch.dtype`` for a format name or alias ("bf16", "bfloat16", "half", "e4m3fn" …).

    A ``torch.dtype`` passes through. TF32 has no dtype of its own (it is fp32 in memory) and raises
    ``ValueError``, as does an unknown name. Introduced in notebook 04.
    """
    if isinstance(name, torch.dtype):
        return name
    if not isinstance(name, str):
        raise TypeError(f"expected a dtype name such as 'bf16' or a torch.dtype, got {type(name).__name__}")
    fmt = formats.get_format(name)
    if fmt.torch_dtype is None:
        why = ("a math mode on fp32 tensors" if fmt.name == "tf32" else
               "a sub-byte format that torch stores only packed; labkit.formats and ml_dtypes emulate it")
        raise ValueError(f"{fmt.name} has no torch dtype ({why})")
    return getattr(torch, fmt.torch_dtype)


def dtype_name(dt: torch.dtype | str) -> str:
    """Return the short format name of a ``torch.dtype`` (``torch.bfloat16`` -> ``"bf16"``); names normalise.

    Introduced in notebook 04.
    """
    if isinstance(dt, str):
        return formats.get_format(dt).name
    if not isinstance(dt, torch.dtype):
        raise TypeError(f"expected a torch.dtype or a name, got {type(dt).__name__}")
    torch_name = str(dt).replace("torch.", "")
    for f in formats.FORMATS.values():
        if f.torch_dtype == torch_name:
            return f.name
    raise ValueError(f"{dt} is not a floating-point format labkit knows ({', '.join(formats.FORMATS)})")


def _nbytes(name: str | None) -> int:
    return 0 if name is None else formats.get_format(name).total_bits // 8


@dataclass(frozen=True)
class Policy:
    """A precision policy: what a training step computes in and what it stores, with one meaning per name.

    ``autocast``: the autocast dtype name (``None``: no autocast). ``params``: the dtype the model's weights are
    stored in. ``master``: the optimizer updates an fp32 master copy of 16-bit weights. ``grads``: the dtype of
    the gradients the working weights keep (``None``: freed once copied). ``fp32_grads``: an fp32 gradient copy
    persists too. ``optim_state``: the dtype of the optimizer's moments. ``scaler``: a dynamic loss scaler.
    ``description``: whose convention it is, in English (marked for translation: show it as
    ``labkit.i18n.gettext(policy.description)``; compare the name, never the description).
    The byte properties are what :mod:`labkit.memory` counts. Introduced in notebook 04.
    """

    name: str
    autocast: str | None
    params: str
    master: bool
    grads: str | None
    fp32_grads: bool
    optim_state: str
    scaler: bool
    description: str

    @property
    def autocast_dtype(self) -> torch.dtype | None:
        """The autocast dtype, or ``None`` without autocast."""
        return None if self.autocast is None else dtype(self.autocast)

    @property
    def param_dtype(self) -> torch.dtype:
        """The dtype the model's weights are stored in."""
        return dtype(self.params)

    @property
    def compute_dtype(self) -> torch.dtype:
        """The dtype the matmuls run in: the autocast dtype, else the stored dtype."""
        return self.autocast_dtype if self.autocast_dtype is not None else self.param_dtype

    @property
    def param_bytes(self) -> int:
        """Bytes per parameter of the working weights."""
        return _nbytes(self.params)

    @property
    def grad_bytes(self) -> int:
        """Bytes per parameter of the gradients the working weights keep (0 if freed)."""
        return _nbytes(self.grads)

    @property
    def fp32_grad_bytes(self) -> int:
        """Bytes per parameter of a persistent fp32 gradient copy (0 if none)."""
        return 4 if self.fp32_grads else 0

    @property
    def master_bytes(self) -> int:
        """Bytes per parameter of the fp32 master copy (0 if the working weights are the master)."""
        return 4 if self.master else 0

    @property
    def state_bytes(self) -> int:
        """Width of one optimizer-state element."""
        return _nbytes(self.optim_state)

    @property
    def autocast_copy_bytes(self) -> int:
        """Bytes per parameter of the 16-bit weight copies autocast makes and autograd keeps for backward."""
        return _nbytes(self.autocast) if self.autocast is not None and self.param_bytes > _nbytes(self.autocast) \
            else 0


#: Every precision policy, by name (see the module docstring's table).
POLICIES: dict[str, Policy] = {
    p.name: p
    for p in (
        Policy("fp32", None, "fp32", False, "fp32", False, "fp32", False, N_("fp32 everywhere: the reference")),
        Policy("fp16", "fp16", "fp32", False, "fp32", False, "fp32", True,
               N_("fp16 autocast + GradScaler, fp32 weights (torch.amp)")),
        Policy("fp16-noscale", "fp16", "fp32", False, "fp32", False, "fp32", False,
               N_("fp16 autocast without loss scaling")),
        Policy("bf16", "bf16", "fp32", False, "fp32", False, "fp32", False,
               N_("bf16 autocast, fp32 weights, no scaler (torch.amp)")),
        Policy("fp16-pure", None, "fp16", False, "fp16", False, "fp16", False,
               N_("model and optimizer state in fp16, no master copy")),
        Policy("bf16-pure", None, "bf16", False, "bf16", False, "bf16", False,
               N_("model and optimizer state in bf16, no master copy")),
        Policy("bf16-master", None, "bf16", True, "bf16", False, "fp32", False,
               N_("ZeRO paper (2+2+K)Ψ: bf16 params and grads, fp32 master + states (K)")),
        Policy("bf16-master-fp32-grads", None, "bf16", True, None, True, "fp32", False,
               N_("HF 'model memory anatomy': bf16 params, fp32 grads, fp32 master + states")),
        Policy("bf16-master-fp32-accum", None, "bf16", True, "bf16", True, "fp32", False,
               N_("DeepSpeed's estimators: bf16 params and grads, plus fp32 grads, master + states")),
    )
}

#: Other names for policies, each with exactly one meaning.
POLICY_ALIASES: dict[str, str] = {
    "mixed": "bf16-master", "zero": "bf16-master", "hf": "bf16-master-fp32-grads",
    "deepspeed": "bf16-master-fp32-accum", "amp": "bf16", "autocast": "bf16",
}


def get_policy(policy: str | Policy) -> Policy:
    """Return the :class:`Policy` for a name or alias (a Policy passes through); ``ValueError`` if unknown.

    Introduced in notebook 04.
    """
    if isinstance(policy, Policy):
        return policy
    if not isinstance(policy, str):
        raise TypeError(f"policy must be a str such as 'bf16' or a Policy, got {type(policy).__name__}")
    name = POLICY_ALIASES.get(policy.strip().lower(), policy.strip().lower())
    if name not in POLICIES:
        raise ValueError(f"unknown precision policy {safe_repr(policy)}; choose one of {list(POLICIES)} "
                         f"(aliases: {sorted(POLICY_ALIASES)})")
    return POLICIES[name]


def autocast(policy: str | Policy, device_type: str) -> torch.autocast:
    """Return the ``torch.autocast`` context for ``policy`` on ``device_type`` (disabled without autocast).

    Introduced in notebook 04.
    """
    pol = get_policy(policy)
    if not isinstance(device_type, str):
        raise TypeError(f"device_type must be a str such as 'cpu' or 'cuda', got {type(device_type).__name__}")
    try:
        return torch.autocast(device_type=device_type, dtype=pol.autocast_dtype or torch.float32,
                              enabled=pol.autocast_dtype is not None)
    except RuntimeError as exc:
        raise ValueError(f"device_type must be a device type such as 'cpu' or 'cuda', got {safe_repr(device_type)}") from exc


def grad_norm(params: Iterable[torch.Tensor]) -> float:
    """Return the global L2 norm of the gradients of ``params``, accumulated in fp32 (inf/NaN pass through).

    Introduced in notebook 04.
    """
    plist = _tensors(params, "params")
    norms = [torch.linalg.vector_norm(p.grad.detach().float()) for p in plist if p.grad is not None]
    if not norms:
        return 0.0
    return float(torch.linalg.vector_norm(torch.stack(norms)))


def _tensors(params: object, name: str) -> list[torch.Tensor]:
    if isinstance(params, torch.Tensor):
        return [params]
    if isinstance(params, (str, bytes)) or not isinstance(params, Iterable):
        raise TypeError(f"{name} must be an iterable of tensors (e.g. model.parameters()), got {type(params).__name__}")
    out = list(params)
    bad = [type(p).__name__ for p in out if not isinstance(p, torch.Tensor)]
    if bad:
        raise TypeError(f"{name} must hold tensors, got {bad[0]}")
    return out


def _check_scaler(scaler: object) -> None:
    needed = ("scale", "unscale_", "step", "update", "get_scale")
    if scaler is not None and not all(callable(getattr(scaler, m, None)) for m in needed):
        raise TypeError(f"scaler must be a torch.amp.GradScaler (or have its methods) or None, got "
                        f"{type(scaler).__name__}")


@dataclass(frozen=True)
class StepInfo:
    """What :func:`update` did: the true gradient norm (before clipping), whether the step was skipped, and
    the loss scale the step was taken with (1.0 without a scaler). Introduced in notebook 04."""

    grad_norm: float
    skipped: bool
    scale: float


def backward(loss: torch.Tensor, scaler: torch.amp.GradScaler | None = None, weight: float = 1.0) -> None:
    """Step 1 of the AMP step: back-propagate ``loss * weight``, multiplied by the loss scale if there is a scaler.

    Introduced in notebook 04.
    """
    if not isinstance(loss, torch.Tensor):
        raise TypeError(f"loss must be a tensor, got {type(loss).__name__}")
    check_dense("loss", loss)
    if loss.numel() != 1:
        raise ValueError(f"loss must hold one number to back-propagate, got shape {tuple(loss.shape)}; reduce it "
                         "first (.mean() or .sum())")
    if not loss.requires_grad:
        raise ValueError("loss does not require grad: compute it from the model's parameters, outside torch.no_grad()")
    _check_scaler(scaler)
    if (isinstance(weight, bool) or not isinstance(weight, (int, float))
            or not math.isfinite(as_float("weight", weight)) or weight <= 0):
        raise ValueError(f"weight must be a positive finite number, got {safe_repr(weight)}")
    weighted = loss * weight if weight != 1.0 else loss
    (scaler.scale(weighted) if scaler is not None else weighted).backward()


def update(optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler | None = None,
           params: Iterable[torch.Tensor] | None = None, clip_grad_norm: float | None = None) -> StepInfo:
    """Step 2 of the AMP step: unscale, measure and clip the true gradients, step (skipped on inf/NaN), update.

    ``scaler`` is a ``torch.amp.GradScaler``, anything with its methods (such as
    :class:`labkit.scaling.DynamicLossScaler`) or ``None``. ``params`` (default: the optimizer's) are the tensors
    whose gradient norm is measured and clipped. The order is the one notebook 04 teaches: ``scaler.unscale_``
    before clipping, so that ``clip_grad_norm`` applies to the true gradients; ``scaler.step`` skips the step if
    they hold inf/NaN; ``scaler.update`` adapts the scale. Introduced in notebook 04.
    """
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
    _check_scaler(scaler)
    if clip_grad_norm is not None and (isinstance(clip_grad_norm, bool) or not isinstance(clip_grad_norm, (int, float))
                                       or not clip_grad_norm > 0):
        raise ValueError(f"clip_grad_norm must be a positive number or None, got {safe_repr(clip_grad_norm)}")
    if clip_grad_norm is not None:
        clip_grad_norm = as_float("clip_grad_norm", clip_grad_norm)
    plist = (_tensors(params, "params") if params is not None
             else [p for g in optimizer.param_groups for p in g["params"]])
    scale = float(scaler.get_scale()) if scaler is not None else 1.0
    if scaler is not None:
        scaler.unscale_(optimizer)  # true gradients from here on
    norm = grad_norm(plist)
    if clip_grad_norm is not None:
        torch.nn.utils.clip_grad_norm_(plist, clip_grad_norm)
    if scaler is not None:
        scaler.step(optimizer)  # skipped if unscale_ found inf/NaN
        scaler.update()
        skipped = float(scaler.get_scale()) < scale
    else:
        optimizer.step()
        skipped = False
    return StepInfo(norm, skipped, scale)
