"""The Chinese edition cannot drift from the English one (issue 37): one source per notebook, code cells shared,
each English prose cell followed by its Chinese partner, which records the hash of the English it translates.

The repository checks run on every source with Chinese cells; the unit tests show that each kind of drift is caught:
one English sentence changed, a Chinese cell deleted or misplaced, a code cell edited in one stored edition only."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCES = sorted((ROOT / "tools" / "nbsrc").glob("[0-9][0-9]_*.py"))
ZH_DIR = ROOT / "notebooks" / "zh"


@pytest.fixture(scope="module")
def nbbuild(load_tool):
    return load_tool("nbbuild")


def _translated(nbbuild):
    return [s for s in SOURCES if nbbuild.has_edition(s, "zh")]


def _stored(path: Path) -> list[tuple[str, str]]:
    return [(c["cell_type"], "".join(c["source"])) for c in json.loads(path.read_text())["cells"]]


def _fresh(nbbuild, src: Path, lang: str) -> list[tuple[str, str]]:
    return [(c["cell_type"], c["source"]) for c in nbbuild.parse(src.read_text(), lang)]


STALE_HELP = "python tools/nbbuild.py --stale zh lists them; translate, then python tools/nbbuild.py --stamp zh NN"


def test_every_translated_source_is_complete_and_current(nbbuild):
    problems = [f"{s.name}: {p}" for s in SOURCES for p in nbbuild.drift(s.read_text(), "zh")]
    assert not problems, "the Chinese edition has drifted:\n" + "\n".join(problems) + f"\n({STALE_HELP})"


def test_each_edition_is_stored_as_a_fresh_build_with_the_same_code(nbbuild):
    translated = _translated(nbbuild)
    stored = sorted(ZH_DIR.glob("[0-9][0-9]_*.ipynb")) if ZH_DIR.is_dir() else []
    assert [p.stem for p in stored] == [s.stem for s in translated], \
        "notebooks/zh/ must hold exactly the translated notebooks: python tools/nbbuild.py --lang zh"
    for src in translated:
        zh = ZH_DIR / (src.stem + ".ipynb")
        assert _stored(zh) == _fresh(nbbuild, src, "zh"), f"{zh.name} differs from its source: rebuild it"
        en_code = [c for c in _fresh(nbbuild, src, "en") if c[0] == "code"]
        assert [c for c in _stored(zh) if c[0] == "code"] == en_code, f"{zh.name}: code differs from the English"
        assert json.loads(zh.read_text())["metadata"].get("labkit") == {"lang": "zh"}


def test_the_chinese_skeleton_and_estimated_time_follow_the_english(nbbuild):
    for src in _translated(nbbuild):
        en = "\n".join(t for k, t in _fresh(nbbuild, src, "en") if k == "markdown")
        zh = "\n".join(t for k, t in _fresh(nbbuild, src, "zh") if k == "markdown")
        for needle in ("**学习目标**", "**前置知识：**", "**预计用时：**", "## 小结"):
            assert needle in zh, f"{src.name}: the Chinese edition lacks {needle}"
        minutes = re.search(r"\*\*Estimated time:\*\* (\d+) min", en).group(1)
        assert re.search(rf"\*\*预计用时：\*\* {minutes} 分钟", zh), f"{src.name}: 预计用时 is not {minutes} 分钟"
        assert re.search(r"[\u4e00-\u9fff]", zh)


# --- each kind of drift is caught --------------------------------------------------------------------------------

SAMPLE = '''# %% [markdown]
# # Title
# One English sentence.

# %% [markdown] lang="zh"
# # 标题
# 一句中文。

# %%
x = 1

# %% [markdown]
# ## Summary
# Done.

# %% [markdown] lang="zh"
# ## 小结
# 完成。
'''


def test_stamp_then_current_then_each_drift_is_reported(nbbuild):
    text = nbbuild.stamp(SAMPLE)
    assert text.count(' en="') == 2 and nbbuild.drift(text) == []
    assert nbbuild.stamp(text) == text  # stamping again changes nothing
    # one English sentence changes: its partner is stale, and stamping does not hide it
    edited = text.replace("One English sentence.", "One English sentence, changed.")
    problems = nbbuild.drift(edited)
    assert len(problems) == 1 and "stale" in problems[0] and "Title" in problems[0]
    assert nbbuild.stamp(edited) == edited
    # a Chinese cell deleted: its English cell has no partner
    deleted = re.sub(r'# %% \[markdown\] lang="zh" en="\w+"\n# ## 小结\n# 完成。\n', "", text)
    assert any("no zh partner" in p and "Summary" in p for p in nbbuild.drift(deleted))
    # a Chinese cell moved after a code cell: out of place, and its English has no partner
    moved = text.replace("x = 1\n", "x = 1\n\n" + text.split("\n\n")[1] + "\n")
    assert any("no English prose cell before it" in p for p in nbbuild.drift(moved))
    # a source with no Chinese cell has no Chinese edition: nothing to drift
    assert nbbuild.drift("# %% [markdown]\n# # T\n\n# %%\nx = 1\n") == []


def test_the_editions_share_code_and_swap_prose(nbbuild):
    text = nbbuild.stamp(SAMPLE)
    en, zh = nbbuild.parse(text, "en"), nbbuild.parse(text, "zh")
    assert [c.cell_type for c in en] == [c.cell_type for c in zh] == ["markdown", "code", "markdown"]
    assert en[1].source == zh[1].source == "x = 1"
    assert "English" in en[0].source and "中文" in zh[0].source
    assert [c["id"] for c in en] == [c["id"] for c in zh]
    with pytest.raises(ValueError):
        nbbuild.parse(text, "fr")


def test_a_code_cell_edited_in_one_stored_edition_is_caught(nbbuild, tmp_path):
    text = nbbuild.stamp(SAMPLE)
    nb = nbbuild.new_notebook(nbbuild.parse(text, "zh"), "zh")
    nb.cells[1].source = "x = 2  # edited in the Chinese notebook only"
    stored = [(c.cell_type, c.source) for c in nb.cells]
    fresh = [(c.cell_type, c.source) for c in nbbuild.parse(text, "zh")]
    assert stored != fresh  # what test_each_edition_is_stored_as_a_fresh_build_with_the_same_code compares


def test_stale_lists_and_exits_1(nbbuild, tmp_path, monkeypatch, capsys):
    src = tmp_path / "nbsrc"
    src.mkdir()
    (src / "98_sample.py").write_text(nbbuild.stamp(SAMPLE).replace("One English sentence.", "Changed."))
    monkeypatch.setattr(nbbuild, "SRC", src)
    monkeypatch.setattr(nbbuild, "ROOT", tmp_path)
    assert nbbuild.main(["--stale", "zh"]) == 1
    out = capsys.readouterr().out
    assert "98_sample.py: cell 1: stale" in out and "1 zh cell(s)" in out
