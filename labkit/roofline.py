"""The roofline model: arithmetic intensity of common ops, attainable FLOP/s, and where measured ops sit.

An op that does ``F`` floating-point operations and moves ``B`` bytes between memory and the chip has
*arithmetic intensity* ``I = F / B`` (FLOP per byte). A device with peak compute ``P`` (FLOP/s) and
memory bandwidth ``W`` (bytes/s) can at best run it at ``min(P, I * W)``: below the *ridge point*
``P / W`` the op is **memory-bound** (fusion and fewer bytes help), above it **compute-bound** (only
faster arithmetic, e.g. a lower precision on tensor cores or AMX, helps).

Byte counts here are the *minimum* traffic: every input read once and every output written once,
as if caches were perfect. Real kernels move at least this much, so a measured point's FLOP/s is an
upper-bound-honest position on the plot. FLOP counting conventions: a multiply-add is 2 FLOPs, and a
transcendental (``exp``, ``tanh``) counts as 1.

Example::

    from labkit import roofline as R
    mm = R.matmul_cost(1024, 1024, 1024, "fp32")          # 2*n^3 FLOPs, 3*n^2*4 bytes
    R.bound(mm.intensity, peak_flops=2e12, bandwidth=20e9)  # 'compute'

Introduced in notebook 07.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from labkit import formats as _formats
from labkit._validate import as_float, safe_repr

__all__ = [
    "DTYPE_BYTES",
    "OpCost",
    "RooflinePoint",
    "attainable",
    "bound",
    "dtype_bytes",
    "elementwise_chain_cost",
    "elementwise_cost",
    "layernorm_cost",
    "matmul_cost",
    "place",
    "plot",
    "ridge_point",
    "softmax_cost",
    "table",
]

#: Bytes per element of the dtypes the workbook uses, by short name.
DTYPE_BYTES: dict[str, int] = {
    # whole-byte formats only: tf32 is a math mode on fp32 storage (4 bytes); FP6/FP4 pack below a byte (left out)
    **{name: (4 if f.torch_dtype is None else f.total_bits // 8) for name, f in _formats.FORMATS.items()
       if name == "tf32" or (f.torch_dtype is not None and f.total_bits % 8 == 0)},
    "int8": 1, "bool": 1,
}


def dtype_bytes(dtype: Any) -> int:
    """Return the bytes per element of ``dtype``: a torch.dtype, a name ("fp32", "bfloat16") or an int.

    Introduced in notebook 07.
    """
    if isinstance(dtype, bool):
        raise TypeError("dtype must be a torch.dtype, a dtype name or a positive int of bytes, not a bool")
    if isinstance(dtype, int):
        if not 1 <= dtype <= _MAX_ELEMENT_BYTES:
            raise ValueError(f"bytes per element must be between 1 and {_MAX_ELEMENT_BYTES}, got {safe_repr(dtype)}")
        return dtype
    if isinstance(dtype, str):
        name = dtype.replace("torch.", "")
        try:
            name = _formats.get_format(name).name  # labkit.formats' names and aliases ("bfloat16", "half" …)
        except ValueError:
            pass
        if name in DTYPE_BYTES:
            return DTYPE_BYTES[name]
        raise ValueError(f"unknown dtype {safe_repr(dtype)}; use one of {sorted(DTYPE_BYTES)} or a torch.dtype")
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency
        torch = None
    if torch is not None and isinstance(dtype, torch.dtype):
        return torch.empty((), dtype=dtype).element_size()
    raise TypeError(f"dtype must be a torch.dtype, a dtype name or an int of bytes, got {type(dtype).__name__}")


def _positive_int(name: str, v: object) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= _MAX_SIZE:
        raise ValueError(f"{name} must be a positive int, at most 2**63 - 1 (tensor sizes are int64), got "
                         f"{safe_repr(v)}")
    return v


#: The largest size a cost function takes (torch's sizes are int64) and the most bytes an element may have
#: (complex128 has 16): the costs then stay within a float's range.
_MAX_SIZE = 2**63 - 1
_MAX_ELEMENT_BYTES = 64


def _nonneg_number(name: str, v: object) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise TypeError(f"{name} must be a number, got {type(v).__name__}")
    if not (math.isfinite(as_float(name, v)) and v >= 0):
        raise ValueError(f"{name} must be a finite number >= 0, got {safe_repr(v)}")
    return float(v)


def _flag(name: str, v: object) -> bool:
    if not isinstance(v, bool):
        raise TypeError(f"{name} must be True or False, got {type(v).__name__}")
    return v


def _positive_number(name: str, v: object) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise TypeError(f"{name} must be a number, got {type(v).__name__}")
    if not (math.isfinite(as_float(name, v)) and v > 0):
        raise ValueError(f"{name} must be a positive finite number, got {safe_repr(v)}")
    return float(v)


@dataclass(frozen=True)
class OpCost:
    """An op's work: ``flops`` floating-point operations and ``bytes`` of minimum memory traffic.

    Introduced in notebook 07.
    """

    name: str
    flops: float
    bytes: float

    def __post_init__(self) -> None:
        if not isinstance(self.name, str):
            raise TypeError(f"name must be a str, got {type(self.name).__name__}")
        for field_name, v in (("flops", self.flops), ("bytes", self.bytes)):
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise TypeError(f"{self.name}: {field_name} must be a number, got {type(v).__name__}")
            if not math.isfinite(as_float(f"{self.name}: {field_name}", v)):
                raise ValueError(f"{self.name}: {field_name} must be finite, got {safe_repr(v)}")
        if self.flops < 0 or self.bytes <= 0:
            raise ValueError(f"{self.name}: flops must be >= 0 and bytes > 0, got {self.flops}, {self.bytes}")

    @property
    def intensity(self) -> float:
        """Arithmetic intensity in FLOP per byte."""
        return self.flops / self.bytes


def matmul_cost(m: int, n: int, k: int, dtype: Any = "fp32") -> OpCost:
    """Return the cost of ``(m, k) @ (k, n)``: ``2*m*n*k`` FLOPs; reads A and B, writes C once each.

    The intensity ``2mnk / ((mk + kn + mn) * bytes)`` grows with the size: ``n/6`` FLOP/byte in fp32
    for a square n x n matmul, so large matmuls are compute-bound and thin ones memory-bound.
    Introduced in notebook 07.
    """
    m, n, k = (_positive_int(s, v) for s, v in (("m", m), ("n", n), ("k", k)))
    b = dtype_bytes(dtype)
    return OpCost(f"matmul {m}x{k} @ {k}x{n}", 2.0 * m * n * k, float((m * k + k * n + m * n) * b))


def elementwise_cost(numel: int, dtype: Any = "fp32", n_inputs: int = 1, n_outputs: int = 1,
                     flops_per_element: float = 1.0, name: str = "elementwise") -> OpCost:
    """Return the cost of an elementwise op over ``numel`` elements: reads each input, writes each output once.

    ``x + y`` is ``n_inputs=2, flops_per_element=1``: 1 FLOP per 12 bytes in fp32, deeply memory-bound.
    Introduced in notebook 07.
    """
    numel = _positive_int("numel", numel)
    n_inputs, n_outputs = _positive_int("n_inputs", n_inputs), _positive_int("n_outputs", n_outputs)
    flops_per_element = _nonneg_number("flops_per_element", flops_per_element)
    b = dtype_bytes(dtype)
    return OpCost(name, flops_per_element * numel, float((n_inputs + n_outputs) * numel * b))


def elementwise_chain_cost(numel: int, n_ops: int, dtype: Any = "fp32", fused: bool = False,
                           flops_per_element: float = 1.0, extra_input_bytes: float = 0.0,
                           name: str | None = None) -> OpCost:
    """Return the cost of a chain of ``n_ops`` unary elementwise ops, run one by one or fused into one pass.

    Unfused, every op reads its input from memory and writes its output back: ``2 * n_ops * numel *
    bytes``. Fused, the intermediates stay in registers/cache: ``2 * numel * bytes``. The FLOPs are
    the same (``flops_per_element`` per element per op), so fusion multiplies the intensity by
    ``n_ops``. ``extra_input_bytes`` adds inputs read once either way (a bias, a dropout mask).
    Introduced in notebook 07.
    """
    numel, n_ops = _positive_int("numel", numel), _positive_int("n_ops", n_ops)
    _flag("fused", fused)
    _nonneg_number("flops_per_element", flops_per_element)
    _nonneg_number("extra_input_bytes", extra_input_bytes)
    if name is not None and not isinstance(name, str):
        raise TypeError(f"name must be a str or None, got {type(name).__name__}")
    b = dtype_bytes(dtype)
    passes = 1 if fused else n_ops
    label = name or f"{n_ops}-op chain ({'fused' if fused else 'unfused'})"
    return OpCost(label, float(flops_per_element) * n_ops * numel,
                  float(2 * passes * numel * b + extra_input_bytes))


def layernorm_cost(rows: int, cols: int, dtype: Any = "fp32", affine: bool = True) -> OpCost:
    """Return the cost of LayerNorm over the last dim of a ``(rows, cols)`` tensor, in one pass.

    FLOPs per element: mean 1, variance 3 (subtract, square, add), normalise 2 (subtract, multiply by
    1/std), affine 2 (scale, shift): 8 with ``affine``, 6 without. Bytes: read x, write y, plus the
    ``2*cols`` weight and bias if ``affine``. About 1 FLOP/byte in fp32: memory-bound everywhere.
    Introduced in notebook 07.
    """
    rows, cols = _positive_int("rows", rows), _positive_int("cols", cols)
    _flag("affine", affine)
    b = dtype_bytes(dtype)
    per = 8 if affine else 6
    nbytes = 2 * rows * cols * b + (2 * cols * b if affine else 0)
    return OpCost(f"layernorm {rows}x{cols}", float(per * rows * cols), float(nbytes))


def softmax_cost(rows: int, cols: int, dtype: Any = "fp32") -> OpCost:
    """Return the cost of a (stable) softmax over the last dim of ``(rows, cols)``, in one pass.

    FLOPs per element: max 1, subtract 1, exp 1, sum 1, divide 1 = 5. Bytes: read x, write y.
    Introduced in notebook 07.
    """
    rows, cols = _positive_int("rows", rows), _positive_int("cols", cols)
    b = dtype_bytes(dtype)
    return OpCost(f"softmax {rows}x{cols}", 5.0 * rows * cols, float(2 * rows * cols * b))


def ridge_point(peak_flops: float, bandwidth: float) -> float:
    """Return the intensity (FLOP/byte) where the roof turns: ``peak_flops / bandwidth``.

    Introduced in notebook 07.
    """
    return _positive_number("peak_flops", peak_flops) / _positive_number("bandwidth", bandwidth)


def attainable(intensity: float, peak_flops: float, bandwidth: float) -> float:
    """Return the roofline's attainable FLOP/s at ``intensity``: ``min(peak_flops, intensity * bandwidth)``.

    Introduced in notebook 07.
    """
    intensity = _positive_number("intensity", intensity)
    return min(_positive_number("peak_flops", peak_flops), intensity * _positive_number("bandwidth", bandwidth))


def bound(intensity: float, peak_flops: float, bandwidth: float) -> str:
    """Say which roof limits an op of this intensity: "memory" below the ridge point, else "compute".

    Introduced in notebook 07.
    """
    return "memory" if _positive_number("intensity", intensity) < ridge_point(peak_flops, bandwidth) else "compute"


@dataclass(frozen=True)
class RooflinePoint:
    """A measured op placed on a roofline: its intensity, achieved FLOP/s, bound and share of the ceiling.

    ``fraction`` is achieved / attainable at that intensity (1.0 = on the roof).
    Introduced in notebook 07.
    """

    name: str
    intensity: float
    achieved_flops: float
    seconds: float
    bound: str
    ceiling_flops: float

    @property
    def fraction(self) -> float:
        """Achieved FLOP/s as a fraction of the roof at this op's intensity."""
        return self.achieved_flops / self.ceiling_flops

    @property
    def achieved_bandwidth(self) -> float:
        """Bytes per second the op moved (its minimum traffic / time)."""
        return self.achieved_flops / self.intensity


def place(cost: OpCost, seconds: float, peak_flops: float, bandwidth: float, name: str | None = None) -> RooflinePoint:
    """Place an op that took ``seconds`` on the roofline of (``peak_flops``, ``bandwidth``), labelled ``name``.

    Introduced in notebook 07.
    """
    if not isinstance(cost, OpCost):
        raise TypeError(f"cost must be an OpCost (from matmul_cost, softmax_cost ...), got {type(cost).__name__}")
    seconds = _positive_number("seconds", seconds)
    if cost.flops == 0:
        raise ValueError(f"{cost.name} does no FLOPs, so it has no place on a roofline")
    return RooflinePoint(cost.name if name is None else str(name), cost.intensity, cost.flops / seconds, seconds,
                         bound(cost.intensity, peak_flops, bandwidth), attainable(cost.intensity, peak_flops, bandwidth))


def _points(points: object) -> list[RooflinePoint]:
    try:
        out = [] if isinstance(points, (str, bytes)) else list(points)  # type: ignore[call-overload]
    except TypeError:
        out = None
    if out is None or (isinstance(points, (str, bytes))) or not all(isinstance(p, RooflinePoint) for p in out):
        raise TypeError(f"points must be a sequence of RooflinePoint (from place()), got {type(points).__name__}")
    return out


def table(points: Sequence[RooflinePoint]) -> str:
    """Return a text table of placed ops: intensity, achieved GFLOP/s and GB/s, bound, % of the ceiling.

    Introduced in notebook 07.
    """
    points = _points(points)
    head = f"{'op':<28} {'FLOP/B':>8} {'GFLOP/s':>9} {'GB/s':>7} {'bound':>8} {'% of roof':>9}"
    rows = [head, "-" * len(head)]
    for p in points:
        rows.append(f"{p.name[:28]:<28} {p.intensity:>8.2f} {p.achieved_flops / 1e9:>9.2f} "
                    f"{p.achieved_bandwidth / 1e9:>7.2f} {p.bound:>8} {100 * p.fraction:>8.1f}%")
    return "\n".join(rows)


def plot(peaks: dict[str, float], bandwidth: float, points: Sequence[RooflinePoint] = (), ax: Any = None,
         title: str | None = None, intensity_range: tuple[float, float] | None = None) -> Any:
    """Draw a log-log roofline: one flat roof per entry of ``peaks`` (label -> FLOP/s), the bandwidth slope, points.

    The ceilings are whatever you measured (``labkit.bench.peak_matmul_flops``,
    ``labkit.bench.memory_bandwidth``); the points come from :func:`place`. Returns the Axes.
    Introduced in notebook 07.
    """
    if not isinstance(peaks, dict) or not peaks:
        raise ValueError("peaks must be a non-empty dict of label -> FLOP/s")
    for k, v in peaks.items():
        _positive_number(f"peaks[{k!r}]", v)
    bw = _positive_number("bandwidth", bandwidth)
    points = _points(points)
    if title is not None and not isinstance(title, str):
        raise TypeError(f"title must be a str or None, got {type(title).__name__}")
    if intensity_range is not None:
        if not isinstance(intensity_range, (tuple, list)) or len(intensity_range) != 2:
            raise TypeError(f"intensity_range must be a (low, high) pair of FLOP/byte, got {safe_repr(intensity_range)}")
        lo, hi = (_positive_number("intensity_range", v) for v in intensity_range)
        if not lo < hi:
            raise ValueError(f"intensity_range must have low < high, got {safe_repr(intensity_range)}")
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.axes import Axes

    if ax is None:
        _, ax = plt.subplots(figsize=(7.5, 4.8))
    elif not isinstance(ax, Axes):
        raise TypeError(f"ax must be a matplotlib Axes (or None for a new figure), got {type(ax).__name__}")
    ridges = [p / bw for p in peaks.values()]
    lo_i = min([min(ridges) / 100, *[p.intensity / 3 for p in points]])
    hi_i = max([max(ridges) * 100, *[p.intensity * 3 for p in points]])
    if intensity_range is not None:
        lo_i, hi_i = intensity_range
    xs = np.logspace(math.log10(lo_i), math.log10(hi_i), 200)
    top = max(peaks.values())
    slope = xs[xs * bw <= top * 1.5]
    ax.plot(slope, slope * bw, color="k", lw=1.0, ls=":", label=f"memory {bw / 1e9:.1f} GB/s")
    for i, (label, peak) in enumerate(sorted(peaks.items(), key=lambda kv: kv[1])):
        c = f"C{i}"
        ax.plot(xs, np.minimum(xs * bw, peak), color=c, lw=2, label=f"{label} {peak / 1e9:.0f} GFLOP/s")
        ax.axvline(peak / bw, color=c, lw=0.6, ls="--", alpha=0.6)
    offsets = ((6, 6), (6, -13), (6, 18), (6, -26))  # staggered so that neighbouring labels do not collide
    for i, p in enumerate(sorted(points, key=lambda q: q.intensity)):
        ax.plot(p.intensity, p.achieved_flops, "o", ms=7, mec="k", mfc="none" if p.bound == "memory" else "k")
        dx, dy = offsets[i % len(offsets)]
        ax.annotate(p.name, (p.intensity, p.achieved_flops), textcoords="offset points", xytext=(dx, dy),
                    fontsize=8, ha="left" if dx > 0 else "right")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP/byte)")
    ax.set_ylabel("FLOP/s")
    ax.set_title(title or "Roofline (measured ceilings, measured ops)")
    ax.legend(fontsize=8, loc="upper left")
    ax.grid(True, which="both", alpha=0.2)
    return ax
