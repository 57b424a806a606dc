"""The seed-coverage map: one row per section of the three source articles, each depth backed by the notebooks.

- every section of every article has exactly one row, in the articles' order (the list below is written from the
  articles, independently of docs/seed_coverage.toml);
- every "where" names a real heading of an available notebook; a place marked "run" has an ``assert`` in a code
  cell of that section, one marked "exercised" a ``check(...)`` or ``reveal(...)`` call;
- a "missing" row says why; every correction points at a "Common misconception" box that cites its seed and section,
  backed by an assertion where its evidence is "run"; every box in the notebooks is listed by a correction;
- the README block is current, and the glossary is linked from the README.

The map, and the README's generated blocks, are made by tools/readme.py (repository tooling, not labkit).
"""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

import pytest

from labkit import catalog

ROOT = Path(__file__).resolve().parents[1]

# Every section of the three articles, in their order (seed, section). "intro" is the text before section 1.
# Seed 002 has no section 4.1 (its section 4 starts at 4.2); its 5.1 and 8.1 are headings whose content did not
# survive, which the coverage file says.
SEED_SECTIONS = [
    *(("000", s) for s in ("intro", "1", "1.1", "1.2", "2", "2.1", "2.2", "2.3", "2.4", "3", "3.1", "3.2", "3.3",
                           "3.4", "4", "4.1", "4.2", "4.3", "4.4", "5", "5.1", "5.2", "5.3", "5.4", "6", "7")),
    *(("002", s) for s in ("1", "2.1", "2.2", "3.1", "3.2", "4.2", "4.3", "5.1", "5.2", "6.1", "6.2", "6.3", "7.1",
                           "7.2", "8.1", "8.2", "9")),
    *(("004", s) for s in ("intro", "1", "2", "2.1", "2.2", "2.3", "2.4", "3", "4.1", "4.2", "4.3", "5", "6.1",
                           "6.2", "6.3", "6.4", "7", "8", "9.1", "9.2", "9.3", "9.4", "9.5", "10")),
]
# The glossary must at least have these terms (issue 21), each with its English term beside it.
GLOSSARY_TERMS = ["混合精度", "损失缩放", "主权重", "次正规数", "算子融合", "梯度累积", "激活重计算", "流水线气泡",
                  "扩展效率", "登录节点", "计算节点"]

BOX_START = "> **Common misconception**"
CITE = re.compile(r"seed (\d{3}) §([\w.]+)")
ASSERT = re.compile(r"^\s*assert\b", re.MULTILINE)
CHECK = re.compile(r"\b(check|reveal)\(")


@pytest.fixture(scope="module")
def readme(load_tool):
    """tools/readme.py, loaded by tests/conftest.py (no sys.path edit)."""
    return load_tool("readme")


@pytest.fixture(scope="module")
def rows(readme):
    return readme.load_coverage()


def _markdown_lines(source: str) -> list[str]:
    """The lines of a Markdown cell outside fenced code blocks (a ``# comment`` in a fence is not a heading)."""
    out, fenced = [], False
    for line in source.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            out.append(line)
    return out


def sections(number: str) -> dict[str, dict]:
    """Notebook ``number``'s sections by heading: {"level", "code": [sources], "markdown": [sources]}.

    A section runs from its heading to the next heading of the same or a higher level (so it includes its
    subsections); text of the heading's own cell after the heading belongs to it.
    """
    (path,) = (ROOT / "notebooks").glob(f"{number}_*.ipynb")
    order: list[list] = []  # [level, heading, code, markdown]
    for cell in json.loads(path.read_text())["cells"]:
        src = "".join(cell["source"])
        if cell["cell_type"] == "markdown":
            for line in _markdown_lines(src):
                m = re.match(r"^(#{1,6})\s+(.*?)\s*$", line)
                if m:
                    order.append([len(m.group(1)), m.group(2), [], []])
                elif order:
                    order[-1][3].append(line)
        elif order:
            order[-1][2].append(src)
    out = {}
    for i, (level, heading, code, md) in enumerate(order):
        code, md = list(code), ["\n".join(md)]
        for later in order[i + 1:]:
            if later[0] <= level:
                break
            code += later[2]
            md.append("\n".join(later[3]))
        out.setdefault(heading, {"level": level, "code": code, "markdown": md})
    return out


@pytest.fixture(scope="module")
def notebook_sections():
    """Every notebook in notebooks/ (tests/test_repo.py checks that they are the catalog's available ones)."""
    return {p.name[:2]: sections(p.name[:2]) for p in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))}


def _boxes(markdown: list[str]) -> list[str]:
    """The misconception boxes (whole blockquotes) in a section's markdown."""
    found = []
    for text in markdown:
        lines = text.splitlines()
        for i, line in enumerate(lines):
            if line.startswith(BOX_START):
                block = [line]
                for nxt in lines[i + 1:]:
                    if not nxt.startswith(">"):
                        break
                    block.append(nxt)
                found.append("\n".join(block))
    return found


def test_one_row_per_seed_section_in_order(rows):
    assert [(r.seed, r.section) for r in rows] == SEED_SECTIONS


def test_every_seed_has_a_title(readme, rows):
    assert set(readme.load_seeds()) == {r.seed for r in rows} == {"000", "002", "004"}


ROW_IDS = [f"{s}-{n}" for s, n in SEED_SECTIONS]


@pytest.mark.parametrize("index", range(len(SEED_SECTIONS)), ids=ROW_IDS)
def test_where_points_at_real_headings_and_depths_are_backed(rows, notebook_sections, index):
    row = rows[index]
    assert row.depth != "missing" or row.note.strip(), f"{row.key}: say why it is missing"
    for w in row.where:
        assert w.notebook in notebook_sections, f"{row.key}: there is no notebook {w.notebook}"
        secs = notebook_sections[w.notebook]
        assert w.heading in secs, f"{row.key}: notebook {w.notebook} has no heading {w.heading!r}"
        code = secs[w.heading]["code"]
        if w.depth == "run":
            assert any(ASSERT.search(c) for c in code), f"{row.key}: {w.notebook} {w.heading!r} has no assert"
        if w.depth == "exercised":
            assert any(CHECK.search(c) for c in code), f"{row.key}: {w.notebook} {w.heading!r} has no check()/reveal()"
    assert len(set(row.where)) == len(row.where), f"{row.key}: a place is listed twice"


@pytest.mark.parametrize("index", [i for i, (s, n) in enumerate(SEED_SECTIONS)], ids=ROW_IDS)
def test_corrections_point_at_a_box_that_cites_them(rows, notebook_sections, index):
    row = rows[index]
    for c in row.corrections:
        number, heading = c.box
        assert number in notebook_sections and heading in notebook_sections[number], f"{row.key}: no section {c.box}"
        sec = notebook_sections[number][heading]
        cited = [b for b in _boxes(sec["markdown"]) if (row.seed, row.section) in CITE.findall(b.splitlines()[0])]
        assert cited, f"{row.key}: no '{BOX_START}' box citing seed {row.seed} §{row.section} in {number} {heading!r}"
        if c.evidence == "run":
            assert any(ASSERT.search(code) for code in sec["code"]), f"{row.key}: the box's section asserts nothing"


def test_every_box_is_well_formed_and_listed(rows, notebook_sections):
    listed = {(r.seed, r.section, c.box) for r in rows for c in r.corrections}
    boxes = 0
    for number, secs in notebook_sections.items():
        for heading, sec in secs.items():
            direct = sec["markdown"][0]  # only the heading's own text: a subsection's box is counted there
            for box in _boxes([direct]):
                boxes += 1
                first = box.splitlines()[0]
                cites = CITE.findall(first)
                assert cites, f"{number} {heading!r}: a box must cite 'seed NNN §x.y' on its first line: {first}"
                assert "**Why it is wrong:**" in box and "**What is true:**" in box, f"{number} {heading!r}: {first}"
                for seed, section in cites:
                    assert (seed, section, (number, heading)) in listed, \
                        f"{number} {heading!r} cites seed {seed} §{section}, but no correction row points here"
    assert boxes >= 10


def test_missing_rows_say_why_and_the_counts_add_up(readme, rows):
    for r in rows:
        if r.depth == "missing":
            assert not r.where and len(r.note) > 40
    summary = readme.coverage_summary(rows)
    assert summary.startswith(f"{len(rows)} sections: ")
    assert sum(int(n) for n in re.findall(r"(\d+) (?:exercised|run|explained|mentioned|missing)", summary)) == len(rows)
    assert sum(r.depth in ("run", "exercised") for r in rows) >= len(rows) // 2


def test_readme_block_is_current(readme, rows, tmp_path):
    text = (ROOT / "README.md").read_text()
    m = re.search(r"<!-- seed-coverage:start -->\n(.*?)\n<!-- seed-coverage:end -->", text, flags=re.DOTALL)
    assert m, "README.md has no seed-coverage block"
    assert m.group(1) == readme.coverage_table(), "run: python tools/readme.py"
    assert text.index("## Notebook map") < text.index("## Seed coverage") < m.start()
    table = [ln for ln in m.group(1).splitlines() if ln.startswith("| ") and not ln.startswith("| Seed")]
    assert [ln.split(" | ")[0].lstrip("| ") for ln in table] == [r.key for r in rows]
    for ln, r in zip(table, rows):
        assert f"| {r.depth} |" in ln and f"| {r.gpu} |" in ln
        if r.depth == "missing":
            assert "| missing | — |" in ln and r.note.split(".")[0] in ln
    copy = tmp_path / "README.md"
    shutil.copy(ROOT / "README.md", copy)
    assert not readme.update_readme(copy), "the README is already current, so nothing changes"
    copy.write_text(text.replace(m.group(1), "stale"))
    assert readme.update_readme(copy) and copy.read_text() == text


def test_glossary_is_linked_and_has_the_terms():
    text = (ROOT / "docs" / "glossary.md").read_text()
    assert "](docs/glossary.md)" in (ROOT / "README.md").read_text()
    rows = [ln for ln in text.splitlines() if ln.startswith("| ") and not ln.startswith("| English")]
    cells = [[c.strip() for c in ln.strip("|").split("|")] for ln in rows]
    assert len(cells) >= 60 and all(len(c) >= 3 and c[0] and c[1] for c in cells)
    chinese = {c[1] for c in cells}
    for term in GLOSSARY_TERMS:
        assert any(term in zh for zh in chinese), f"glossary: no row for {term}"
    assert all(re.search(r"[\u4e00-\u9fff]", zh) for zh in chinese), "every row has its Chinese term"
    english = [c[0] for c in cells]
    assert len(set(english)) == len(english), "an English term is listed twice"


def _write(path: Path, body: str) -> Path:
    path.write_text('[seeds.000]\ntitle = "A seed"\n\n' + body)
    return path


def test_load_coverage_rejects_bad_files(readme, tmp_path):
    bad = tmp_path / "c.toml"
    with pytest.raises(FileNotFoundError):
        readme.load_coverage(tmp_path / "missing.toml")
    ok_row = '[[section]]\nseed = "000"\nsection = "1"\ntitle = "t"\ndepth = "run"\ngpu = "no"\n'
    where = 'where = [{ notebook = "01", heading = "h", depth = "run" }]\n'
    (row,) = readme.load_coverage(_write(bad, ok_row + where))
    assert (row.key, row.depth, row.where[0].heading) == ("000 §1", "run", "h")
    cases = {
        "depth must be one of": ok_row.replace('"run"', '"deep"') + where,
        "gpu must be one of": ok_row.replace('gpu = "no"', 'gpu = "maybe"') + where,
        "not the deepest": ok_row.replace('"run"', '"exercised"') + where,
        "needs where entries": ok_row + "where = []\n",
        "needs a note": ok_row.replace('"run"', '"missing"') + "where = []\n",
        "lists no where": ok_row.replace('"run"', '"missing"') + where + 'note = "n"\n',
        "each where entry": ok_row + 'where = [{ notebook = "01" }]\n',
        "has no \\[seeds.002\\]": ok_row.replace('"000"', '"002"') + where,
        "listed twice": ok_row + where + "\n" + ok_row + where,
        "evidence must be one of": ok_row + where + '[[section.correction]]\nclaim = "c"\ntruth = "t"\n'
                                   'box = { notebook = "01", heading = "h" }\nevidence = "hearsay"\n',
        "lists no": "",
    }
    for message, body in cases.items():
        with pytest.raises(ValueError, match=message):
            readme.load_coverage(_write(bad, body))
    bad.write_text(ok_row + where)
    with pytest.raises(ValueError, match="seeds"):
        readme.load_coverage(bad)


def test_update_readme_requires_markers(readme, tmp_path):
    p = tmp_path / "R.md"
    p.write_text("no markers")
    with pytest.raises(ValueError, match="notebook-map"):
        readme.update_readme(p)
    p.write_text("a\n<!-- notebook-map:start -->\nold\n<!-- notebook-map:end -->\nb")
    assert readme.update_readme(p) and catalog.markdown_table() in p.read_text()
    assert not readme.update_readme(p)


def test_main_check_and_update(readme, tmp_path, capsys):
    copy = tmp_path / "README.md"
    shutil.copy(ROOT / "README.md", copy)
    assert readme.main(["--check", str(copy)]) == 0
    text = copy.read_text()
    stale = text.replace(catalog.markdown_table(), "stale")
    copy.write_text(stale)
    assert readme.main(["--check", str(copy)]) == 1 and copy.read_text() == stale, "--check changes nothing"
    assert "stale" in capsys.readouterr().err
    assert readme.main([str(copy)]) == 0 and copy.read_text() == text
    (tmp_path / "none.md").write_text("no markers")
    assert readme.main(["--check", str(tmp_path / "none.md")]) == 1


def test_the_tool_runs_as_a_script(tmp_path):
    """``python tools/readme.py --check`` from anywhere: the script finds labkit and docs/ on its own."""
    import subprocess

    out = subprocess.run([sys.executable, str(ROOT / "tools" / "readme.py"), "--check"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "is current" in out.stdout
