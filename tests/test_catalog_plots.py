"""labkit.catalog and the notebook-01 plots."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from labkit import catalog, plots  # noqa: E402


def test_markdown_table_rows():
    table = catalog.markdown_table()
    assert table.count("\n") == 1 + len(catalog.available())
    assert "| 00 | [Environment check](notebooks/00_environment.ipynb)" in table


def test_update_readme_requires_markers(tmp_path):
    p = tmp_path / "R.md"
    p.write_text("no markers")
    with pytest.raises(ValueError):
        catalog.update_readme(p)
    p.write_text("a\n<!-- notebook-map:start -->\nold\n<!-- notebook-map:end -->\nb")
    assert catalog.update_readme(p) and catalog.markdown_table() in p.read_text()
    assert not catalog.update_readme(p)


def test_plots_draw_what_they_say():
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
