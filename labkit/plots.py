"""Plots shared by the notebooks: format ranges, relative spacing, value grids (and later more).

Each function draws on a given matplotlib Axes (or a new one) and returns the Axes, so notebooks stay
one line per figure. matplotlib is imported inside the functions: importing labkit.plots is cheap.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from labkit import formats as F
from labkit._validate import as_float, check_dense, safe_repr

__all__ = ["FORMAT_COLORS", "format_ranges", "grad_histogram", "loss_curves", "memory_bars", "relative_spacing",
           "scale_history", "value_grid"]

FORMAT_COLORS = {"fp64": "#6d6d6d", "fp32": "#1f77b4", "tf32": "#17becf", "fp16": "#d62728",
                 "bf16": "#2ca02c", "e4m3fn": "#9467bd", "e5m2": "#ff7f0e", "e8m0fnu": "#8c564b",
                 "e2m3fn": "#e377c2", "e3m2fn": "#bcbd22", "e2m1fn": "#393b79"}


def _axes(ax: Any, figsize: tuple[float, float]) -> Any:
    if ax is not None:
        from matplotlib.axes import Axes

        if not isinstance(ax, Axes):
            raise TypeError(f"ax must be a matplotlib Axes (or None for a new figure), got {type(ax).__name__}")
        return ax
    import matplotlib.pyplot as plt

    _, ax = plt.subplots(figsize=figsize)
    return ax


def _names(names: Any) -> list[str]:
    if isinstance(names, str) or not isinstance(names, (list, tuple)) or not names:
        raise TypeError(f"names must be a non-empty list or tuple of format names such as ('fp16', 'bf16'), "
                        f"got {safe_repr(names)}")
    for n in names:
        if not isinstance(n, str):
            raise TypeError(f"format names are str such as 'bf16', got {type(n).__name__}")
    return list(names)


def _array(values: Any, dtype: Any) -> np.ndarray:
    """``values`` as a numpy array of ``dtype``; a tensor is detached and moved to the CPU first.

    torch is imported here, not at the top: importing labkit.plots stays cheap.
    """
    import torch

    if isinstance(values, torch.Tensor):
        values = check_dense("values", values).detach().cpu()
        values = values.double() if values.is_floating_point() else values  # numpy has no bfloat16
    try:
        return np.asarray(values, dtype=dtype)
    except OverflowError:  # an int beyond float64 (10**400)
        raise ValueError(f"values must be numbers a float64 can hold, got {safe_repr(values)}") from None


def _title(title: Any) -> str | None:
    if title is not None and not isinstance(title, str):
        raise TypeError(f"title must be a str or None, got {type(title).__name__}")
    return title


def _real(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(as_float(name, value)):
        raise TypeError(f"{name} must be a finite number, got {safe_repr(value)}")
    return float(value)


def format_ranges(names: Sequence[str] = ("fp32", "tf32", "bf16", "fp16", "e5m2", "e4m3fn"), ax: Any = None) -> Any:
    """Draw each format's range on a log2 axis: subnormals pale, normals solid, eps written beside it.

    Introduced in notebook 01.
    """
    names = _names(names)
    ax = _axes(ax, (9, 0.55 * len(names) + 1.2))
    for i, name in enumerate(names):
        f = F.get_format(name)
        lo, mid, hi = math.log2(f.smallest_subnormal), math.log2(f.smallest_normal), math.log2(f.max)
        c = FORMAT_COLORS.get(f.name, "k")
        ax.barh(i, mid - lo, left=lo, color=c, alpha=0.3, height=0.6)
        ax.barh(i, hi - mid, left=mid, color=c, alpha=0.9, height=0.6)
        ax.text(hi + 2, i, f"max {f.max:.3g}, eps 2^{int(math.log2(f.eps))}", va="center", fontsize=8)
    ax.set_yticks(range(len(names)), [F.get_format(n).name for n in names])
    ax.invert_yaxis()
    ax.axvline(0, color="k", lw=0.5)
    ax.set_xlabel("log2 |x|   (pale: subnormals, solid: normals)")
    ax.set_title("Range of each format")
    ax.set_xlim(-160, 200)
    return ax


def relative_spacing(names: Sequence[str] = ("fp32", "bf16", "fp16"), lo: float = -30.0, hi: float = 20.0,
                     ax: Any = None) -> Any:
    """Plot ulp(x)/x against x for each format: the sawtooth of relative precision, and where it breaks.

    Introduced in notebook 01.
    """
    names = _names(names)
    if not _real("lo", lo) < _real("hi", hi):
        raise ValueError(f"need lo < hi (log2 bounds), got {lo} and {hi}")
    ax = _axes(ax, (8, 3.5))
    x = np.exp2(np.linspace(lo, hi, 1500))
    for name in names:
        f = F.get_format(name)
        xs = x[x <= f.max]
        r = F.round_array(xs, f)
        up = F.decode_array(F.encode_array(r, f).astype(np.int64) + 1, f)
        ax.loglog(xs, (up - r) / np.where(r > 0, r, np.nan), label=f.name, color=FORMAT_COLORS.get(f.name))
    ax.set_xlabel("x")
    ax.set_ylabel("ulp(x) / x")
    ax.set_title("Relative spacing: precision is the same in every binade, until the subnormals")
    ax.legend()
    return ax


def value_grid(name: str = "e4m3fn", ax: Any = None) -> Any:
    """Mark every positive finite value of a small format on a log axis, normals and subnormals apart.

    The positive patterns are those below the sign bit; E8M0, which has no sign bit, no zero and no
    subnormals, has 255 of them (0x00 = 2^-127 to 0xFE = 2^127), all drawn alike.
    Introduced in notebook 01.
    """
    f = F.get_format(name)
    if f.total_bits > 16:
        raise ValueError(f"value_grid draws formats of at most 16 bits; {f.name} has {f.total_bits}")
    ax = _axes(ax, (9, 1.6))
    patterns = np.arange(1, 1 << (f.total_bits - 1)) if f.signed else np.arange(1 << f.total_bits)
    v = F.decode_array(patterns, f)
    v = v[np.isfinite(v) & (v > 0)]
    sub = v < f.smallest_normal
    if f.has_subnormals:
        ax.vlines(v[sub], 0, 0.6, color="0.6", lw=0.8, label=f"subnormals ({int(sub.sum())})")
    ax.vlines(v[~sub], 0, 1, color=FORMAT_COLORS.get(f.name, "k"), lw=0.8,
              label=f"normals ({int((~sub).sum())})" if f.has_subnormals else f"values ({int((~sub).sum())})")
    ax.set_xscale("log", base=2)
    ax.set_yticks([])
    ax.set_title(f"Every positive {f.name} value")
    ax.legend(loc="upper left", fontsize=8)
    return ax


def grad_histogram(values: Any, names: Sequence[str] = ("fp16", "bf16", "e5m2"), scale: float = 1.0,
                   bins: int = 80, ax: Any = None) -> Any:
    """Histogram log2|g| of nonzero gradients (times ``scale``) over each format's shaded range.

    Each format gets a horizontal band: pale where it has only subnormals, solid where it has normals,
    with a dashed line where values flush to zero (half the smallest subnormal). Zeros and
    non-finite values are left out of the histogram. Introduced in notebook 03.
    """
    if isinstance(scale, bool) or not (isinstance(scale, (int, float)) and 0 < as_float("scale", scale) < math.inf):
        raise ValueError(f"scale must be a positive finite number, got {safe_repr(scale)}")
    names = _names(names)
    if isinstance(bins, bool) or not isinstance(bins, int) or bins < 1:
        raise ValueError(f"bins must be a positive int, got {safe_repr(bins)}")
    g = _array(values, np.float64)
    g = np.abs(g.reshape(-1)) * scale
    g = g[np.isfinite(g) & (g > 0)]
    if g.size == 0:
        raise ValueError("no nonzero finite values to plot")
    fmts = [F.get_format(n) for n in names]
    ax = _axes(ax, (9, 3.8))
    lg = np.log2(g)
    ax.hist(lg, bins=bins, color="0.35", alpha=0.85, zorder=3, label=f"log2|g × {scale:g}|")
    k = len(fmts)
    for i, f in enumerate(fmts):
        c = FORMAT_COLORS.get(f.name, "k")
        lo, mid, hi = math.log2(f.smallest_subnormal), math.log2(f.smallest_normal), math.log2(f.max)
        band = {"ymin": i / k, "ymax": (i + 1) / k, "zorder": 1}
        ax.axvspan(lo, mid, color=c, alpha=0.12, **band)
        ax.axvspan(mid, hi, color=c, alpha=0.28, label=f"{f.name}: subnormals {lo:.0f}..{mid:.0f}, normals ..{hi:.0f}",
                   **band)
        ax.axvline(lo - 1, ymin=i / k, ymax=(i + 1) / k, color=c, ls="--", lw=1.2, zorder=2)
    left = min(lg.min(), min(math.log2(f.smallest_subnormal) for f in fmts if f.smallest_subnormal > 2.0**-60) - 2)
    right = max(lg.max(), max(math.log2(f.max) for f in fmts if f.max < 2.0**64) + 2)
    ax.set_xlim(max(left - 1, -160), min(right + 1, 140))
    x0, x1 = ax.get_xlim()
    for i, f in enumerate(fmts):  # name each band where its normals start (or at the left edge)
        at = min(max(math.log2(f.smallest_normal), x0), x1)
        ax.text(at + 0.3, (i + 0.5) / k, f.name, transform=ax.get_xaxis_transform(), fontsize=8, va="center",
                color=FORMAT_COLORS.get(f.name, "k"), zorder=4)
    ax.set_xlabel("log2 |g|   (dashed: flush to zero below this; pale: subnormals; solid: normals)")
    ax.set_ylabel("count")
    ax.set_title("Gradient magnitudes against each format's range")
    ax.legend(loc="upper right", fontsize=7)
    return ax


def scale_history(scales: Sequence[float], skipped: Sequence[bool], ax: Any = None, title: str | None = None) -> Any:
    """Plot a loss scale over the steps on a log2 axis, with the skipped (inf/NaN) steps marked.

    ``scales[i]`` is the scale step ``i`` used and ``skipped[i]`` whether its optimizer step was skipped.
    Introduced in notebook 03.
    """
    s = _array(scales, np.float64)
    k = _array(skipped, bool)
    if s.ndim != 1 or s.size == 0 or s.shape != k.shape:
        raise ValueError(f"scales and skipped must be 1-D and of the same nonzero length, got {s.shape} and {k.shape}")
    if np.any(s < 0) or not np.all(np.isfinite(s)):
        raise ValueError("scales must be finite and >= 0")
    ax = _axes(ax, (9, 3.2))
    steps = np.arange(s.size)
    shown = np.where(s > 0, s, np.nan)  # a collapsed scale (0) has no log: the line stops there
    ax.step(steps, shown, where="post", color="#1f77b4", label="loss scale")
    ax.plot(steps[k], shown[k], "x", color="#d62728", ms=6, label=f"skipped step ({int(k.sum())})")
    ax.set_yscale("log", base=2)
    ax.set_xlabel("step")
    ax.set_ylabel("scale")
    ax.set_title(_title(title) or "Dynamic loss scale: back off on inf/NaN, grow after clean steps")
    ax.legend(loc="best", fontsize=8)
    return ax


MEMORY_COLORS = {"params": "#1f77b4", "grads": "#ff7f0e", "fp32_grads": "#ffbb78", "master": "#2ca02c",
                 "optimizer": "#d62728", "weight_copies": "#9467bd", "gathered": "#8c564b",
                 "activations": "#7f7f7f"}


def memory_bars(breakdowns: dict[str, dict[str, float]], unit: float = 1.0, ylabel: str = "bytes per parameter",
                ax: Any = None, title: str | None = None) -> Any:
    """Draw one stacked bar per setup: ``breakdowns[label][category]`` bytes, divided by ``unit``.

    Categories are those of :mod:`labkit.memory` (params, grads, fp32_grads, master, optimizer, ...), each
    with a fixed colour; the total is written on top of each bar. Introduced in notebook 06.
    """
    if not isinstance(breakdowns, dict) or not all(isinstance(d, dict) for d in breakdowns.values()):
        raise TypeError("breakdowns must be a dict of setup label -> {category: bytes}")
    if not breakdowns:
        raise ValueError("memory_bars needs at least one setup")
    if not _real("unit", unit) > 0:
        raise ValueError(f"unit must be > 0, got {unit}")
    ax = _axes(ax, (9, 4))
    cats = [c for c in MEMORY_COLORS if any(c in d for d in breakdowns.values())]
    unknown = {c for d in breakdowns.values() for c in d} - set(MEMORY_COLORS)
    if unknown:
        raise ValueError(f"unknown memory categories {sorted(unknown)}; expected some of {list(MEMORY_COLORS)}")
    labels = list(breakdowns)
    bottom = np.zeros(len(labels))
    for c in cats:
        vals = np.array([breakdowns[k].get(c, 0) / unit for k in labels], dtype=float)
        ax.bar(labels, vals, bottom=bottom, color=MEMORY_COLORS[c], label=c)
        bottom += vals
    for i, total in enumerate(bottom):
        ax.text(i, total, f"{total:g}", ha="center", va="bottom", fontsize=9)
    ax.set_ylabel(ylabel)
    ax.set_ylim(0, bottom.max() * 1.15)
    ax.tick_params(axis="x", labelrotation=30)
    ax.legend(fontsize=8, ncol=2)
    if _title(title):
        ax.set_title(title)
    return ax


def loss_curves(curves: dict[str, Sequence[float]], ax: Any = None, title: str | None = None, logy: bool = True,
                styles: dict[str, str] | None = None) -> Any:
    """Overlay loss curves, one per label; a curve that turns inf/NaN is cut there and marked with an x.

    ``curves[label]`` is the loss per step from step 0 (e.g. ``TrainResult.loss``) or a ``(steps, losses)``
    pair for a curve that starts later; ``styles[label]`` an optional matplotlib format string such as
    ``"--"``. Introduced in notebook 04.
    """
    if not isinstance(curves, dict) or not curves:
        raise ValueError("curves must be a non-empty dict of label -> sequence of losses")
    if not isinstance(logy, bool):
        raise TypeError(f"logy must be True or False, got {type(logy).__name__}")
    if styles is not None and not isinstance(styles, dict):
        raise TypeError(f"styles must be a dict of label -> matplotlib format string, or None, got {safe_repr(styles)}")
    ax = _axes(ax, (9, 3.6))
    for label, values in curves.items():
        if isinstance(values, tuple) and len(values) == 2:
            x, y = _array(values[0], np.float64), _array(values[1], np.float64)
        else:
            y = _array(values, np.float64)
            x = np.arange(y.size, dtype=np.float64)
        if y.ndim != 1 or y.size == 0 or x.shape != y.shape:
            raise ValueError(f"curve {safe_repr(label)} must be a non-empty 1-D sequence (or a (steps, losses) pair)")
        bad = np.flatnonzero(~np.isfinite(y))
        name = label if bad.size == 0 else f"{label} (non-finite from step {int(x[bad[0]])})"
        (line,) = ax.plot(x, np.where(np.isfinite(y), y, np.nan), (styles or {}).get(label, "-"), label=name, lw=1.5)
        if bad.size and bad[0] > 0:
            ax.plot([x[bad[0] - 1]], [y[bad[0] - 1]], "x", color=line.get_color(), ms=8)
    if logy:
        ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title(_title(title) or "Training loss")
    ax.legend(loc="best", fontsize=8)
    return ax
