"""FP8 with per-tensor scaling: E4M3 for the forward pass, E5M2 for gradients, scales from an amax history.

FP8 has so few bits that a tensor only fits after it is multiplied by a *scale* chosen from its largest
magnitude (``amax``): ``q = fp8(x * scale)``, and ``x ≈ q / scale``. The pieces, small and readable:

- :func:`compute_scale`: ``scale = fp8_max / amax / 2**margin``. The tensor's largest value lands at the
  format's maximum (less a safety margin of ``margin`` binades), so the small values keep as many of the
  format's binades as possible.
- :func:`quantize` / :func:`dequantize` / :func:`roundtrip`: the cast with an explicit overflow rule.
  ``"saturate"`` clamps to ±max (what Transformer Engine does, and what torch's plain cast does for
  E4M3FN); ``"nan"`` follows the OCP non-saturating rule and ml_dtypes (E4M3FN has no inf); ``"inf"``
  is torch's plain cast for E5M2. See ``labkit.formats`` for the same rules on single values.
- :class:`DelayedScaling`: the recipe of NVIDIA Transformer Engine. Each tensor keeps a history of its
  last ``history_len`` amaxes; the scale for *this* step comes from that history (``max`` of it, or the
  most recent), and the new amax is recorded afterwards. No extra pass over the tensor before the
  cast, at the price of saturating when a tensor suddenly grows.
- :func:`quant_stats`: relative error, fraction flushed to zero and fraction saturated of one cast.
- :class:`TensorTap`: hooks that capture the real inputs (activations) of a model's ``nn.Linear``
  layers and the gradients flowing back into their outputs: what an FP8 recipe casts.
- :func:`scaled_mm`: an FP8 matmul through ``torch._scaled_mm`` (which also runs on a CPU), with
  per-tensor scales; :func:`scaled_mm_reference` is the same computed from the dequantised inputs.
- :func:`time_fp8_matmul`: bf16 vs FP8 matmul timed in one run on a GPU with compute capability >= 8.9,
  through ``labkit.device``; ``None`` elsewhere.

Introduced in notebook 05.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Self

import torch
from torch import nn

from labkit import device as dev_gate
from labkit import formats as _formats
from labkit import precision
from labkit._validate import as_float, check_dense, safe_repr

__all__ = [
    "DTYPES",
    "MAX_HISTORY",
    "MAX_MARGIN",
    "DelayedScaling",
    "QuantStats",
    "ScaledTensor",
    "TensorTap",
    "amax",
    "compute_scale",
    "current_scaling",
    "dequantize",
    "fp8_max",
    "overflow_threshold",
    "quant_stats",
    "quantize",
    "roundtrip",
    "scaled_mm",
    "scaled_mm_reference",
    "time_fp8_matmul",
]

#: The two FP8 formats, by labkit.formats name.
DTYPES: dict[str, torch.dtype] = {n: precision.dtype(n) for n in ("e4m3fn", "e5m2")}
_OVERFLOW = ("saturate", "nan", "inf")


def _fmt(fmt: Any) -> str:
    if not isinstance(fmt, str):
        raise TypeError(f"fmt must be 'e4m3fn' or 'e5m2', got {type(fmt).__name__}")
    if fmt not in DTYPES:
        raise ValueError(f"fmt must be 'e4m3fn' (forward) or 'e5m2' (gradients), got {safe_repr(fmt)}")
    return fmt


def _tensor(x: Any, name: str = "x") -> torch.Tensor:
    check_dense(name, x)
    if not x.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got {x.dtype}")
    if x.numel() == 0:
        raise ValueError(f"{name} is empty")
    return x


def _scale(scale: Any) -> float:
    if isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise TypeError(f"scale must be a number, got {type(scale).__name__}")
    s = as_float("scale", scale)
    if not (0.0 < s < math.inf):
        raise ValueError(f"scale must be a positive finite number, got {safe_repr(scale)}")
    return s


def fp8_max(fmt: str) -> float:
    """Return the largest finite value of ``fmt``: 448 for E4M3FN, 57344 for E5M2. Introduced in notebook 05."""
    return float(_formats.get_format(_fmt(fmt)).max)


def overflow_threshold(fmt: str) -> tuple[float, bool]:
    """Return ``(t, inclusive)``: ``|v| > t`` (or ``>= t`` when inclusive) rounds beyond ``fmt``'s maximum.

    ``t`` is halfway between the maximum and the next value the exponent would give; at the tie, round
    to nearest even decides: E4M3FN's 448 (mantissa 110) is even, so 464 still rounds down; E5M2's 57344
    (mantissa 11) is odd, so 61440 rounds up. Introduced in notebook 05.
    """
    f = _formats.get_format(_fmt(fmt))
    half = f.max + 0.5 * _formats.ulp(f.max, f)
    odd = bool(_formats.fields(f.max, f).mantissa & 1)
    return half, odd


def amax(x: torch.Tensor) -> float:
    """Return the largest magnitude in ``x`` (NaN if ``x`` holds a NaN). Introduced in notebook 05."""
    return float(_tensor(x).detach().abs().amax().float())


#: The largest ``margin`` (binades of headroom) the scaling functions take: 64. FP8's whole range spans about 40
#: binades (E5M2), so a larger margin only pushes every value into the subnormals; 2.0**(2**64) would overflow.
MAX_MARGIN = 64
#: The longest amax history :class:`DelayedScaling` keeps: 65,536 steps (Transformer Engine's default is 1,024).
MAX_HISTORY = 2**16


def compute_scale(amax: float, fmt: str = "e4m3fn", margin: int = 0, previous: float = 1.0) -> float:
    """Return the per-tensor scale ``fp8_max(fmt) / amax / 2**margin`` that maps ``amax`` near the top of ``fmt``.

    An ``amax`` of 0, inf or NaN says nothing about the next tensor, so ``previous`` is returned
    unchanged (as Transformer Engine does). Introduced in notebook 05.
    """
    if isinstance(amax, bool) or not isinstance(amax, (int, float)):
        raise TypeError(f"amax must be a number, got {type(amax).__name__}")
    if isinstance(margin, bool) or not isinstance(margin, int) or not 0 <= margin <= MAX_MARGIN:
        raise ValueError(f"margin must be an int from 0 to {MAX_MARGIN} (binades of headroom), got {safe_repr(margin)}")
    previous = _scale(previous)
    a = as_float("amax", amax)
    if a < 0:
        raise ValueError(f"amax is a magnitude, got {safe_repr(amax)}")
    if a == 0.0 or not math.isfinite(a):
        return previous
    s = fp8_max(fmt) / a / 2.0**margin
    return s if math.isfinite(s) and s > 0 else previous


def quantize(x: torch.Tensor, fmt: str = "e4m3fn", scale: float = 1.0, overflow: str = "saturate") -> torch.Tensor:
    """Return ``fp8(x * scale)`` as a float8 tensor; ``overflow`` says what values beyond the maximum become.

    ``"saturate"``: ±max. ``"nan"``: NaN (E4M3FN without saturation, as ml_dtypes). ``"inf"``: ±inf
    (E5M2 only: E4M3FN has no inf). The product is formed in fp32, then cast once (round to nearest even).
    Introduced in notebook 05.
    """
    fmt = _fmt(fmt)
    x = _tensor(x)
    s = _scale(scale)
    if overflow not in _OVERFLOW:
        raise ValueError(f"overflow must be one of {_OVERFLOW}, got {safe_repr(overflow)}")
    if overflow == "inf" and fmt == "e4m3fn":
        raise ValueError("e4m3fn has no inf: use overflow='saturate' or 'nan'")
    v = x.detach().float() * s
    m = fp8_max(fmt)
    if overflow == "saturate":
        return v.clamp(-m, m).to(DTYPES[fmt])  # clamp keeps NaN as NaN
    t, inclusive = overflow_threshold(fmt)
    mag = v.abs()
    over = (mag >= t) if inclusive else (mag > t)
    q = v.clamp(-m, m).to(DTYPES[fmt])
    special = torch.full_like(v, math.nan) if overflow == "nan" else torch.copysign(torch.full_like(v, math.inf), v)
    return torch.where(over, special.to(DTYPES[fmt]), q)


def dequantize(q: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    """Return ``q / scale`` in float32: the value an FP8 tensor with that scale stands for. Introduced in notebook 05."""
    if not isinstance(q, torch.Tensor):
        raise TypeError(f"q must be a torch.Tensor, got {type(q).__name__}")
    return q.float() / _scale(scale)


def roundtrip(x: torch.Tensor, fmt: str = "e4m3fn", scale: float = 1.0, overflow: str = "saturate") -> torch.Tensor:
    """Return ``dequantize(quantize(x, fmt, scale, overflow), scale)``: ``x`` as FP8 sees it. Introduced in notebook 05."""
    return dequantize(quantize(x, fmt, scale, overflow), scale)


@dataclass(frozen=True)
class QuantStats:
    """One FP8 cast measured: ``rel_error`` (Frobenius, vs the input), ``underflow`` (fraction of nonzero
    values that became 0), ``saturated`` (fraction beyond the format's maximum), and the ``scale`` used.

    Introduced in notebook 05.
    """

    fmt: str
    scale: float
    rel_error: float
    underflow: float
    saturated: float


def quant_stats(x: torch.Tensor, fmt: str = "e4m3fn", scale: float = 1.0) -> QuantStats:
    """Cast ``x`` to ``fmt`` with ``scale`` (saturating) and measure what was lost; see :class:`QuantStats`.

    Introduced in notebook 05.
    """
    x = _tensor(x).detach().double()
    s = _scale(scale)
    back = roundtrip(x, fmt, s).double()
    nonzero = x != 0
    n = max(int(nonzero.sum()), 1)
    t, inclusive = overflow_threshold(fmt)
    mag = (x * s).abs()
    over = (mag >= t) if inclusive else (mag > t)
    norm = float(torch.linalg.vector_norm(x))
    err = float(torch.linalg.vector_norm(back - x)) / norm if norm > 0 else 0.0
    return QuantStats(fmt, s, err, float(((back == 0) & nonzero).sum()) / n, float(over.sum()) / x.numel())


@dataclass(frozen=True)
class ScaledTensor:
    """An FP8 tensor and the scale it was cast with: ``data`` (float8) stands for ``data / scale``.

    Introduced in notebook 05.
    """

    data: torch.Tensor
    scale: float
    fmt: str

    def dequantize(self) -> torch.Tensor:
        """Return the float32 values this FP8 tensor stands for. Introduced in notebook 05."""
        return dequantize(self.data, self.scale)


def current_scaling(x: torch.Tensor, fmt: str = "e4m3fn", margin: int = 0) -> ScaledTensor:
    """Cast ``x`` with a scale from its own amax ("current" or just-in-time scaling). Introduced in notebook 05."""
    s = compute_scale(amax(x), fmt, margin)
    return ScaledTensor(quantize(x, fmt, s), s, _fmt(fmt))


class DelayedScaling:
    """Per-tensor FP8 scaling from an amax history, as in NVIDIA Transformer Engine's delayed scaling.

    ``quantize(x)`` casts ``x`` with the current ``scale`` (computed from earlier amaxes), then records
    ``amax(x)`` in ``history`` (the last ``history_len`` values) and recomputes ``scale`` from
    ``max(history)`` (``algo="max"``) or the newest amax (``algo="most_recent"``), less ``margin``
    binades. The scale starts at ``init_scale`` (1.0, as in Transformer Engine).

    Introduced in notebook 05.
    """

    def __init__(self, fmt: str = "e4m3fn", history_len: int = 16, margin: int = 0, algo: str = "max",
                 init_scale: float = 1.0) -> None:
        self.fmt = _fmt(fmt)
        if isinstance(history_len, bool) or not isinstance(history_len, int) or not 1 <= history_len <= MAX_HISTORY:
            raise ValueError(f"history_len must be an int from 1 to {MAX_HISTORY:,}, got {safe_repr(history_len)}")
        if isinstance(margin, bool) or not isinstance(margin, int) or not 0 <= margin <= MAX_MARGIN:
            raise ValueError(f"margin must be an int from 0 to {MAX_MARGIN}, got {safe_repr(margin)}")
        if algo not in ("max", "most_recent"):
            raise ValueError(f"algo must be 'max' or 'most_recent', got {safe_repr(algo)}")
        self.margin = margin
        self.algo = algo
        self.history: deque[float] = deque(maxlen=history_len)
        self.scale = _scale(init_scale)

    def update(self, new_amax: float) -> float:
        """Record ``new_amax`` and recompute the scale for the next cast; return it. Introduced in notebook 05."""
        self.history.append(float(new_amax))
        finite = [a for a in self.history if math.isfinite(a)]
        if finite:
            a = max(finite) if self.algo == "max" else self.history[-1]
            self.scale = compute_scale(a, self.fmt, self.margin, previous=self.scale)
        return self.scale

    def quantize(self, x: torch.Tensor) -> ScaledTensor:
        """Cast ``x`` with the scale from the history so far, then update the history with ``amax(x)``.

        Introduced in notebook 05.
        """
        out = ScaledTensor(quantize(x, self.fmt, self.scale), self.scale, self.fmt)
        self.update(amax(x))
        return out

    def __repr__(self) -> str:
        return (f"DelayedScaling(fmt={self.fmt!r}, history_len={self.history.maxlen}, margin={self.margin}, "
                f"algo={self.algo!r}, scale={self.scale:.6g}, history={len(self.history)} amaxes)")


class TensorTap:
    """Capture the inputs of a model's ``nn.Linear`` layers and the gradients of their outputs.

    Those are the tensors an FP8 linear layer casts: the input (an activation) and the weight to E4M3 in
    the forward pass, the output gradient to E5M2 in the backward pass. ``activations[name]`` and
    ``gradients[name]`` are lists with one detached fp32 copy per call (only the latest unless
    ``keep_all``). Use as a context manager, or call ``close()`` to remove the hooks.

    Introduced in notebook 05.
    """

    def __init__(self, model: nn.Module, layers: Sequence[str] | None = None, keep_all: bool = False) -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
        if not isinstance(keep_all, bool):
            raise TypeError(f"keep_all must be True or False, got {type(keep_all).__name__}")
        if layers is not None and (isinstance(layers, str) or not isinstance(layers, (list, tuple))
                                   or not all(isinstance(n, str) for n in layers)):
            raise TypeError(f"layers must be None or a list of nn.Linear module names, got {safe_repr(layers)}")
        linears = {n: m for n, m in model.named_modules() if isinstance(m, nn.Linear)}
        if layers is None:
            layers = list(linears)
        unknown = [n for n in layers if n not in linears]
        if unknown:
            raise ValueError(f"not nn.Linear layers of this model: {unknown}; choose from {list(linears)}")
        if not layers:
            raise ValueError("the model has no nn.Linear layer to tap")
        self.keep_all = bool(keep_all)
        self.activations: dict[str, list[torch.Tensor]] = {n: [] for n in layers}
        self.gradients: dict[str, list[torch.Tensor]] = {n: [] for n in layers}
        self._handles = [linears[n].register_forward_hook(self._hook(n)) for n in layers]

    def _store(self, store: list[torch.Tensor], t: torch.Tensor) -> None:
        if not self.keep_all:
            store.clear()
        store.append(t.detach().float().clone())

    def _hook(self, name: str) -> Any:
        def hook(module: nn.Module, inputs: tuple[torch.Tensor, ...], output: torch.Tensor) -> None:
            self._store(self.activations[name], inputs[0])
            if output.requires_grad:
                output.register_hook(lambda g: self._store(self.gradients[name], g))
        return hook

    def close(self) -> None:
        """Remove the hooks (the captured tensors stay). Introduced in notebook 05."""
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _matrix(x: Any, name: str) -> torch.Tensor:
    x = _tensor(x, name)
    if x.dim() != 2:
        raise ValueError(f"{name} must be a matrix, got shape {tuple(x.shape)}")
    return x


def _operands(a: torch.Tensor, b: torch.Tensor, fmt_a: str, fmt_b: str, scale_a: float | None,
              scale_b: float | None) -> tuple[ScaledTensor, ScaledTensor]:
    a, b = _matrix(a, "a"), _matrix(b, "b")
    if a.shape[1] != b.shape[0]:
        raise ValueError(f"a {tuple(a.shape)} and b {tuple(b.shape)} do not multiply")
    sa = compute_scale(amax(a), fmt_a) if scale_a is None else _scale(scale_a)
    sb = compute_scale(amax(b), fmt_b) if scale_b is None else _scale(scale_b)
    qa = ScaledTensor(quantize(a, fmt_a, sa), sa, fmt_a)
    # _scaled_mm wants its second operand column-major: cast b^T (row-major), then transpose the view.
    qb = ScaledTensor(quantize(b.t().contiguous(), fmt_b, sb).t(), sb, fmt_b)
    return qa, qb


def scaled_mm(a: torch.Tensor, b: torch.Tensor, fmt_a: str = "e4m3fn", fmt_b: str = "e4m3fn",
              scale_a: float | None = None, scale_b: float | None = None,
              out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Multiply ``a @ b`` in FP8 with ``torch._scaled_mm``: per-tensor scales (from each amax unless given).

    ``_scaled_mm`` takes the *inverse* scales (``1/scale``) and applies them to the fp32 accumulator.
    It runs on a CPU (torch 2.13) and on CUDA GPUs with compute capability >= 8.9 (there every dimension
    must be a multiple of 16). Introduced in notebook 05.
    """
    qa, qb = _operands(a, b, _fmt(fmt_a), _fmt(fmt_b), scale_a, scale_b)
    dev = a.device
    inv_a = torch.tensor(1.0 / qa.scale, dtype=torch.float32, device=dev)
    inv_b = torch.tensor(1.0 / qb.scale, dtype=torch.float32, device=dev)
    return torch._scaled_mm(qa.data, qb.data, scale_a=inv_a, scale_b=inv_b, out_dtype=out_dtype)


def scaled_mm_reference(a: torch.Tensor, b: torch.Tensor, fmt_a: str = "e4m3fn", fmt_b: str = "e4m3fn",
                        scale_a: float | None = None, scale_b: float | None = None) -> torch.Tensor:
    """Return what :func:`scaled_mm` should give: the dequantised FP8 inputs multiplied in fp64.

    Introduced in notebook 05.
    """
    qa, qb = _operands(a, b, _fmt(fmt_a), _fmt(fmt_b), scale_a, scale_b)
    return qa.dequantize().double() @ qb.dequantize().double()


def time_fp8_matmul(n: int = 4096, device: torch.device | str | None = None, warmup: int = 3,
                    repeats: int = 10) -> Any:
    """Time bf16 vs FP8 (E4M3, per-tensor scales, bf16 out) n x n matmuls in one run; ``None`` without FP8 hardware.

    Only where ``labkit.device.capabilities(device).fp8_matmul`` (CUDA, compute capability >= 8.9). Returns a
    ``labkit.bench.Comparison`` with bf16 as the baseline. Introduced in notebook 05.
    """
    from labkit import bench

    if isinstance(n, bool) or not isinstance(n, int) or n < 16 or n % 16:
        raise ValueError(f"n must be a positive multiple of 16 (an FP8 GEMM requirement), got {safe_repr(n)}")
    dev = dev_gate.resolve(device)
    if not dev_gate.capabilities(dev).fp8_matmul:
        return None
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(n, n, generator=g).to(dev), torch.randn(n, n, generator=g).to(dev)
    a16, b16 = a.bfloat16(), b.bfloat16()
    qa, qb = _operands(a, b, "e4m3fn", "e4m3fn", None, None)
    inv_a = torch.tensor(1.0 / qa.scale, device=dev)
    inv_b = torch.tensor(1.0 / qb.scale, device=dev)
    cmp = bench.compare(
        {"bf16": lambda: a16 @ b16,
         "fp8 e4m3": lambda: torch._scaled_mm(qa.data, qb.data, scale_a=inv_a, scale_b=inv_b, out_dtype=torch.bfloat16)},
        baseline="bf16", warmup=warmup, repeats=repeats, device=dev)
    cmp.extra["n"] = n
    cmp.extra["flops"] = 2 * n**3
    return cmp
