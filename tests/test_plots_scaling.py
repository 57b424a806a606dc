"""labkit.plots: the loss-scaling plots (gradient histogram over format ranges, scale history)."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np
import pytest
import torch

from labkit import plots


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def test_grad_histogram_counts_only_nonzero_finite_values() -> None:
    g = torch.tensor([2.0**-30, 2.0**-10, 0.0, float("inf"), -2.0**-20, float("nan")])
    ax = plots.grad_histogram(g, names=("fp16", "bf16"), bins=10)
    assert sum(p.get_height() for p in ax.containers[0]) == 3
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert any(t.startswith("fp16: subnormals -24..-14, normals ..16") for t in labels)
    assert any(t.startswith("bf16: subnormals -133..-126") for t in labels)
    # one dashed flush-to-zero line per format, at log2(smallest subnormal) - 1
    dashed = sorted(line.get_xdata()[0] for line in ax.get_lines() if line.get_linestyle() == "--")
    assert dashed == [-134.0, -25.0]


def test_grad_histogram_scale_shifts_the_histogram() -> None:
    g = np.array([2.0**-30, 2.0**-29])
    a = plots.grad_histogram(g, bins=1)
    b = plots.grad_histogram(g, scale=2.0**10, bins=1)
    assert b.containers[0][0].get_x() == pytest.approx(a.containers[0][0].get_x() + 10)


@pytest.mark.parametrize("kwargs", [{"scale": 0.0}, {"scale": float("inf")}, {"bins": 0}])
def test_grad_histogram_bad_input(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        plots.grad_histogram([1.0], **kwargs)


def test_grad_histogram_needs_values() -> None:
    with pytest.raises(ValueError, match="nonzero"):
        plots.grad_histogram([0.0, float("nan")])
    with pytest.raises(ValueError):
        plots.grad_histogram([1.0], names=("fp12",))


def test_scale_history_marks_skipped_steps() -> None:
    scales = [8.0, 4.0, 4.0, 8.0, 0.0]
    skipped = [True, False, False, False, True]
    ax = plots.scale_history(scales, skipped)
    line, marks = ax.get_lines()[:2]
    assert list(marks.get_xdata()) == [0, 4]
    assert np.isnan(line.get_ydata()[-1])  # a collapsed (0) scale is not drawn on the log axis
    assert ax.get_yscale() == "log"
    assert "skipped step (2)" in [t.get_text() for t in ax.get_legend().get_texts()]


@pytest.mark.parametrize("scales,skipped", [([1.0, 2.0], [True]), ([], []), ([1.0, -1.0], [False, False]),
                                            ([float("inf")], [False])])
def test_scale_history_bad_input(scales, skipped) -> None:
    with pytest.raises(ValueError):
        plots.scale_history(scales, skipped)
