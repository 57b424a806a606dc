"""A fused op with its own backward: bias + GELU (tanh form) as a ``torch.autograd.Function``.

A fused kernel is opaque to autograd: it computes ``gelu(x + bias)`` in one pass, so autograd sees one op it cannot
look inside, and the kernel's author writes the backward by hand. That hand-written backward is where fusion breaks
training silently ("the gradient vanished after fusion"): the forward is right, the loss curve looks almost right,
and a term of the derivative is missing. ``torch.autograd.gradcheck`` finds it: it compares the backward with
finite differences of the forward, in float64.

Example::

    import torch
    from labkit import fusion
    x = torch.randn(4, 6, dtype=torch.float64, requires_grad=True)
    b = torch.randn(6, dtype=torch.float64, requires_grad=True)
    torch.autograd.gradcheck(fusion.fused_bias_gelu, (x, b))                       # True
    torch.autograd.gradcheck(lambda x, b: fusion.fused_bias_gelu(x, b, backward="tanh-held-constant"),
                             (x, b), raise_exception=False)                         # False: the bug

Introduced in notebook 07.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from labkit._validate import safe_repr

__all__ = ["BACKWARDS", "fused_bias_gelu", "gelu_tanh_derivative"]

_C = math.sqrt(2.0 / math.pi)
_A = 0.044715

#: The backward passes :func:`fused_bias_gelu` offers: the exact derivative, and a typical hand-written mistake
#: that treats the tanh factor as a constant (it drops the second term of the product rule).
BACKWARDS = ("exact", "tanh-held-constant")


def _check_tensor(name: str, t: object) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.layout != torch.strided or t.is_meta:
        raise TypeError(f"{name} must be a dense tensor with values, got layout {t.layout}, device {t.device}")
    if not t.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got {t.dtype}")
    return t


def gelu_tanh_derivative(h: torch.Tensor) -> torch.Tensor:
    """Return d/dh of ``gelu_tanh(h) = 0.5 * h * (1 + tanh(u))``, ``u = sqrt(2/pi) * (h + 0.044715 h^3)``.

    By the product rule: ``0.5 * (1 + tanh(u)) + 0.5 * h * (1 - tanh(u)^2) * sqrt(2/pi) * (1 + 3 * 0.044715 h^2)``.
    Introduced in notebook 07.
    """
    h = _check_tensor("h", h)
    t = torch.tanh(_C * (h + _A * h**3))
    return 0.5 * (1.0 + t) + 0.5 * h * (1.0 - t * t) * _C * (1.0 + 3.0 * _A * h * h)


def _rows_sum(g: torch.Tensor) -> torch.Tensor:
    """The bias gradient: the bias was broadcast over every row of ``x``, so its gradient sums them."""
    return g.reshape(-1, g.shape[-1]).sum(0)


class _BiasGelu(torch.autograd.Function):
    """Forward: ``gelu_tanh(x + bias)`` in one pass; backward: the derivative, by hand, from the saved ``x + bias``."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        h = x + bias
        ctx.save_for_backward(h)
        return 0.5 * h * (1.0 + torch.tanh(_C * (h + _A * h**3)))

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        (h,) = ctx.saved_tensors
        gx = grad * gelu_tanh_derivative(h)
        return gx, _rows_sum(gx)


class _BiasGeluTanhHeldConstant(_BiasGelu):
    """The same forward, with the typical hand-written bug in the backward."""

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        (h,) = ctx.saved_tensors
        gx = grad * 0.5 * (1.0 + torch.tanh(_C * (h + _A * h**3)))  # the bug: the tanh factor's own derivative is dropped
        return gx, _rows_sum(gx)


def fused_bias_gelu(x: torch.Tensor, bias: torch.Tensor, backward: str = "exact") -> torch.Tensor:
    """Compute ``gelu(x + bias, approximate="tanh")`` as one autograd op whose backward is written by hand.

    ``bias`` has the size of ``x``'s last dimension. ``backward="exact"`` is the correct derivative;
    ``"tanh-held-constant"`` is the typical mistake of a hand-written backward (same forward, wrong gradient), for
    ``torch.autograd.gradcheck`` to catch. Introduced in notebook 07.
    """
    x, bias = _check_tensor("x", x), _check_tensor("bias", bias)
    if x.dim() < 1 or x.shape[-1] < 1 or bias.shape != (x.shape[-1],):
        raise ValueError(f"bias must have shape (x.shape[-1],), got x {tuple(x.shape)} and bias {tuple(bias.shape)}")
    if x.dtype != bias.dtype or x.device != bias.device:
        raise TypeError(f"x and bias must share dtype and device, got {x.dtype}/{x.device} and {bias.dtype}/{bias.device}")
    if not isinstance(backward, str):
        raise TypeError(f"backward must be a str, one of {BACKWARDS}, got {type(backward).__name__}")
    if backward not in BACKWARDS:
        raise ValueError(f"backward must be one of {BACKWARDS}, got {safe_repr(backward)}")
    fn = _BiasGelu if backward == "exact" else _BiasGeluTanhHeldConstant
    return fn.apply(x, bias)
