"""labkit.catalog and the notebook-01 plots (the README tooling is tested in tests/test_coverage.py)."""

from __future__ import annotations

import matplotlib
import pytest

from labkit import catalog, plots

matplotlib.use("Agg")  # before pyplot is imported (in the test; labkit.plots imports no pyplot)


def test_markdown_table_rows():
    table = catalog.markdown_table()
    assert table.count("\n") == 1 + len(catalog.available())
    assert "| 00 | [Environment check](notebooks/00_environment.ipynb)" in table


def test_plots_draw_what_they_say():
    import matplotlib.pyplot as plt

    ax = plots.format_ranges(["fp16", "bf16"])
    assert len(ax.patches) == 4 and [t.get_text() for t in ax.get_yticklabels()] == ["fp16", "bf16"]
    ax = plots.relative_spacing(["fp16"], lo=-26, hi=10)
    assert len(ax.lines) == 1
    ax = plots.value_grid("e4m3fn")
    assert " ".join(t.get_text() for t in ax.get_legend().get_texts()) == "subnormals (7) normals (119)"
    with pytest.raises(ValueError):
        plots.value_grid("fp32")
    with pytest.raises(ValueError):
        plots.relative_spacing(lo=3, hi=1)
    plt.close("all")
