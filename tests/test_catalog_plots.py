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
    # notebook 00's map links the notebooks next to it; the Chinese map links the Chinese edition, in Chinese
    assert "| 00 | [Environment check](00_environment.ipynb)" in catalog.markdown_table(folder="", lang="en")
    zh = catalog.markdown_table(lang="zh")
    assert "](notebooks/zh/00_environment.ipynb)" in zh and "| 内容 |" in zh.splitlines()[0]
    assert "](x/00_environment.ipynb)" in catalog.markdown_table(folder="x", lang="en")


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


@pytest.mark.parametrize(("name", "dtype", "legend"), [
    ("e8m0fnu", "float8_e8m0fnu", "values (255)"),  # no sign, no zero, no subnormals: 2^-127 .. 2^127
    ("e2m3fn", "float6_e2m3fn", "subnormals (7) normals (24)"),
    ("e3m2fn", "float6_e3m2fn", "subnormals (3) normals (28)"),
    ("e2m1fn", "float4_e2m1fn", "subnormals (1) normals (6)"),
])
def test_value_grid_draws_every_positive_value_of_the_microscaling_formats(name, dtype, legend):
    """The values drawn are ml_dtypes' positive finite values of the format, no more and no fewer."""
    import matplotlib.pyplot as plt
    import ml_dtypes
    import numpy as np

    ax = plots.value_grid(name)
    assert " ".join(t.get_text() for t in ax.get_legend().get_texts()) == legend
    drawn = sorted(float(seg[0][0]) for c in ax.collections for seg in c.get_segments())
    every = np.arange(256 if name == "e8m0fnu" else 1 << (ml_dtypes.finfo(getattr(ml_dtypes, dtype)).bits - 1))
    ml = np.array(every, np.uint8).view(getattr(ml_dtypes, dtype)).astype(np.float64)
    assert drawn == sorted(ml[np.isfinite(ml) & (ml > 0)].tolist())
    if name == "e2m1fn":
        assert drawn == [0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
    plt.close("all")
