"""The Chinese edition cannot drift from the English one (issue 37): one source per notebook, code cells shared,
each English prose cell followed by its Chinese partner, which records the hash of the English it translates.

The repository checks run on every source with Chinese cells; the unit tests show that each kind of drift is caught:
one English sentence changed, a Chinese cell deleted or misplaced, a code cell edited in one stored edition only."""

from __future__ import annotations

import json
import re
import sys
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


# --- terms: where an English cell uses a glossary term, its Chinese partner uses the glossary's Chinese term --------

GLOSSARY = ROOT / "docs" / "glossary.md"
#: Where a glossary word is used in another sense (notebook, English term, why): no Chinese term is expected there.
OTHER_SENSE = {
    ("02", "exponent"): "the argument of exp in the stable softmax, not a float's exponent field",
    ("08", "job"): "'the compiler's job', not a Slurm job",
    ("15", "rank"): "'nearest rank', a percentile method, not a process",
}


def glossary_terms(text: str) -> list[tuple[str, list[str], list[str]]]:
    """(the row's English, its English forms, its Chinese forms) per glossary row.

    English forms: the term without its parentheses, each ' / ' alternative, and parenthesised names with a capital
    or a digit (FTZ, MTBF); Chinese forms: the Chinese column split at its separators (/, （）, 、, ，)."""
    rows = []
    for line in text.splitlines():
        if not line.startswith("| ") or line.startswith(("| English", "|---")):
            continue
        en, zh = [c.strip() for c in line.strip("|").split("|")][:2]
        forms = [b.strip() for b in re.sub(r"\s*\([^)]*\)", "", en).split(" / ") if b.strip()]
        for inner in re.findall(r"\(([^)]*)\)", en):
            forms += [p.strip() for p in re.split(r"[,;]", inner) if re.search(r"[A-Z0-9]", p)]
        chinese = [z.strip() for z in re.split(r"[（）()/，,、；;]", zh) if z.strip()]
        rows.append((en, forms, chinese))
    return rows


def _prose(text: str) -> str:
    """Markdown without code: no fenced blocks, no `inline code`, no link targets."""
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    return re.sub(r"\]\([^)]*\)", "]", re.sub(r"`[^`]*`", "", text))


def term_misses(pairs: list[tuple[str, str]], rows) -> list[tuple[int, str, str]]:
    """(pair index, glossary row, English form found) where the Chinese partner has none of the row's Chinese forms.

    A form with a capital or a digit (a name: ZeRO, FP8, MTBF) may also stay as it is in the Chinese."""
    misses = []
    for i, (en, zh) in enumerate(pairs):
        prose = _prose(en)
        for row, forms, chinese in rows:
            for form in forms:
                named = bool(re.search(r"[A-Z]", form))
                if not re.search(r"(?<![\w-])" + re.escape(form) + r"(?![\w-])", prose, 0 if named else re.I):
                    continue
                if not ((re.search(r"[A-Z0-9]", form) and form in zh) or any(z in zh for z in chinese)):
                    misses.append((i, row, form))
                break
    return misses


def _pairs(nbbuild, src: Path) -> list[tuple[str, str]]:
    cells = nbbuild._cells(src.read_text())
    return [(cells[i - 1].source, re.sub(r"\s+", " ", nbbuild.join_cjk_lines(c.source))) for i, c in enumerate(cells)
            if c.cell_type == "markdown" and c.metadata.get("lang") == "zh"]


def test_the_chinese_uses_the_glossary_terms(nbbuild):
    rows = glossary_terms(GLOSSARY.read_text())
    assert len(rows) > 100
    found = []
    for src in _translated(nbbuild):
        for i, row, form in term_misses(_pairs(nbbuild, src), rows):
            if (src.name[:2], form) not in OTHER_SENSE:
                found.append(f"{src.name} Chinese cell {i}: {form!r} without {row!r}'s Chinese term")
    assert not found, "\n".join(found) + "\n(use docs/glossary.md's term, or fix the glossary entry first)"


def test_the_term_check_catches_a_wrong_term_and_accepts_the_glossarys():
    rows = glossary_terms("| English | 中文 |\n|---|---|\n| loss scaling | 损失缩放 |\n| underflow | 下溢 |\n"
                          "| ZeRO (Zero Redundancy Optimizer) | ZeRO（零冗余优化器） |\n"
                          "| mean time between failures (MTBF) | 平均故障间隔时间 |\n")
    assert [f for _, f, _ in rows] == [["loss scaling"], ["underflow"], ["ZeRO", "Zero Redundancy Optimizer"],
                                       ["mean time between failures", "MTBF"]]
    good = [("Loss scaling stops an underflow.", "损失缩放可以防止下溢。"),
            ("ZeRO shards it; the MTBF is a day.", "ZeRO 把它分片；MTBF 为一天。"),
            ("`loss scaling` in code is not prose.", "代码里的不算。")]
    assert term_misses(good, rows) == []
    bad = [("Loss scaling stops an underflow.", "缩放损失可以防止下溢。"),  # not the glossary's term
           ("Zero is a number.", "零是一个数。"),  # no match: ZeRO is matched with its capitals
           ("The mean time between failures.", "平均无故障时间。")]
    assert term_misses(bad, rows) == [(0, "loss scaling", "loss scaling"),
                                      (2, "mean time between failures (MTBF)", "mean time between failures")]


# --- the Chinese README and instructor guide --------------------------------------------------------------------

def _links(text: str) -> list[str]:
    return [t for t in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text) if not re.match(r"[a-z]+://", t)]


def test_the_chinese_readme_maps_every_chinese_notebook_and_its_links_resolve():
    readme = (ROOT / "README.zh-CN.md").read_text()
    assert "](README.zh-CN.md)" in (ROOT / "README.md").read_text().split("\n## ")[0], "README links it at the top"
    assert "](README.md)" in readme.split("\n## ")[0]
    for nb in sorted(ZH_DIR.glob("[0-9][0-9]_*.ipynb")):
        assert f"](notebooks/zh/{nb.name})" in readme, f"README.zh-CN.md's notebook map lacks {nb.name}"
    assert "make lab LAB_LANG=zh" in readme
    for target in _links(readme):
        assert (ROOT / target).exists(), f"README.zh-CN.md links {target}, which does not exist"


def test_the_chinese_readme_tables_are_generated_and_link_chinese_headings():
    """The notebook map and the seed-coverage map of README.zh-CN.md are tools/readme.py's, from the same data as
    the English ones, in Chinese; each section link lands on a heading of the Chinese notebook."""
    sys.path.insert(0, str(ROOT / "tools"))
    import readme as R

    text = (ROOT / "README.zh-CN.md").read_text()
    assert R.lang_of(ROOT / "README.zh-CN.md") == "zh" and R.render(text, "zh") == text, \
        "README.zh-CN.md's tables are stale: run python tools/readme.py"
    block = text.split("<!-- seed-coverage:start -->")[1].split("<!-- seed-coverage:end -->")[0]
    rows = R.load_coverage()
    assert block.count("\n| ") == len(rows) + 1 and "共 " in block and re.search(r"练习 \d+ 个", block)
    headings: dict[str, set[str]] = {}
    for nb in ZH_DIR.glob("[0-9][0-9]_*.ipynb"):
        md = "\n".join("".join(c["source"]) for c in json.loads(nb.read_text())["cells"] if c["cell_type"] == "markdown")
        headings[nb.name] = {R._anchor(h) for h in re.findall(r"^#+ (.+)$", md, flags=re.MULTILINE)}
    links = re.findall(r"\]\(notebooks/zh/([^)#]+)#([^)]+)\)", block)
    assert len(links) >= len(rows), "the coverage map links the sections where each row is taught"
    for name, anchor in links:
        assert anchor in headings[name], f"README.zh-CN.md links {name}#{anchor}: no such heading in the Chinese edition"
    for w in {w for r in rows for w in r.where}:
        assert w.heading in R.edition_headings(w.notebook, "zh"), f"no Chinese partner for {w.notebook} {w.heading!r}"


def test_the_chinese_instructor_guide_has_the_english_timetable():
    def timetable(text: str) -> list[tuple[str, str, str]]:
        return re.findall(r"^\| [^|]* \| (\d\d) \| [^|]+ \| (\d+) \| (\d+) \|$", text, re.M)

    en = timetable((ROOT / "docs" / "instructor.md").read_text())
    zh_text = (ROOT / "docs" / "instructor.zh-CN.md").read_text()
    assert len(en) == 18 and timetable(zh_text) == en, "the Chinese timetable must carry the English numbers"
    total = re.search(r"\*\*(\d+)\*\* \| \*\*(\d+)\*\* \|", zh_text)
    assert total and (int(total[1]), int(total[2])) == (sum(int(m) for _, m, _ in en), sum(int(x) for _, _, x in en))
    for target in _links(zh_text):
        assert (ROOT / "docs" / target).resolve().exists(), f"docs/instructor.zh-CN.md links {target}"
