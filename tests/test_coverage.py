"""The seed-coverage map: one row per section of the three source articles, each depth backed by the notebooks.

- every section of every article has exactly one row, in the articles' order (the list below is written from the
  articles, independently of docs/seed_coverage.toml);
- every "where" names a real heading of an available notebook; a place marked "run" or "exercised" names its
  proof, and every proof sits in a code cell of that section that ran in the stored notebook (executed, no error,
  not skipped by nbval): an exercise id is registered and called there by check/reveal/predict, an
  ``"assert: <fragment>"`` is part of an ``assert`` statement there; an "exercised" place names an exercise;
- a "missing" row says why; every correction points at a "Common misconception" box that cites its seed and section,
  backed by the assertion its ``shown_by`` names where its evidence is "run"; every box in the notebooks is listed by a correction;
- the README block is current, and the glossary is linked from the README.

The map, and the README's generated blocks, are made by tools/readme.py (repository tooling, not labkit).
"""

from __future__ import annotations

import ast
import json
import re
import shutil
import sys
from pathlib import Path

import pytest

from labkit import catalog
from labkit.exercises import all_exercises

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
CALL = re.compile(r"\b(?:check|reveal|predict)\(\s*[\"'](\d\d\.[a-z0-9-]+)[\"']")


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
    order: list[list] = []  # [level, heading, code cells, markdown]
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
            order[-1][2].append(dict(cell, source=src))
    out = {}
    for i, (level, heading, cells, md) in enumerate(order):
        cells, md = list(cells), ["\n".join(md)]
        for later in order[i + 1:]:
            if later[0] <= level:
                break
            cells += later[2]
            md.append("\n".join(later[3]))
        out.setdefault(heading, {"level": level, "code": [c["source"] for c in cells], "cells": cells,
                                 "markdown": md})
    return out


def _squash(text: str) -> str:
    return " ".join(text.split())


#: Statements whose body may not run (a function that may never be called, a loop that may stop at once, a try):
#: an assert there proves nothing.
_MAYBE = (ast.While, ast.Try, ast.Match, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)
#: The environment gates of the notebooks, and which branch the machine that stores and checks them takes: a CPU
#: with gcc and DeepSpeed, no GPU, no Slurm cluster, Triton in its interpreter. An assert under any other ``if``
#: counts as never run.
GATES = {
    "GCC": True, "builds is not None": True, "builds is None": False, 'importlib.util.find_spec("deepspeed")': True,
    "device.is_cuda(DEV)": False, "MODE.interpreted": True, '"fp16-noscale" in final': True,
    "SLURM": False, "in_job": False,
}


def _assert_statements(source: str) -> list[str]:
    """The ``assert`` statements of a code cell that run whenever the cell runs on the machine that checks the
    notebooks (in an ``if`` branch only when :data:`GATES` says that machine takes it; never under a ``try``,
    ``while`` or ``def``), whitespace squashed; IPython magics and shell lines are dropped."""
    lines = ["" if ln.lstrip().startswith(("%", "!")) else ln for ln in source.splitlines()]
    code = "\n".join(lines)
    found: list[str] = []

    def visit(nodes: list[ast.AST]) -> None:
        for node in nodes:
            if isinstance(node, ast.Assert):
                found.append(_squash(ast.get_source_segment(code, node) or ""))
            elif isinstance(node, ast.If):
                taken = GATES.get(ast.get_source_segment(code, node.test) or "")
                if taken is not None:
                    visit(node.body if taken else node.orelse)
            elif not isinstance(node, _MAYBE):
                visit(list(ast.iter_child_nodes(node)))

    visit(ast.parse(code).body)
    return found


def _ran(cell: dict) -> str:
    """Why a stored code cell does not count as run ("" when it ran): unexecuted, an error output, skipped by nbval."""
    if cell.get("execution_count") is None:
        return "is stored unexecuted"
    if any(o.get("output_type") == "error" for o in cell.get("outputs", [])):
        return "stored an error"
    first = cell["source"].lstrip().splitlines()[:1]
    tags = set(cell.get("metadata", {}).get("tags", []))
    if (first and first[0].strip() in ("# NBVAL_SKIP", "# NBVAL_RAISES_EXCEPTION")) or tags & {"nbval-skip",
                                                                                              "raises-exception"}:
        return "is skipped by nbval"
    return ""


def proof_problems(proof: tuple[str, ...], section: dict, exercise_ids: set[str]) -> list[str]:
    """What is wrong with a place's proof in ``section`` (from :func:`sections`): [] when every item is there."""
    problems = []
    for item in proof:
        if item.startswith("assert: "):
            fragment = _squash(item[len("assert: "):])
            homes = [c for c in section["cells"] if any(fragment in a for a in _assert_statements(c["source"]))]
            what = f"no assert statement of the section contains {fragment!r}"
        else:
            homes = [c for c in section["cells"] if item in CALL.findall(c["source"])]
            what = f"no check/reveal/predict({item!r}) in a code cell of the section"
            if item not in exercise_ids:
                problems.append(f"{item!r} is not a registered exercise")
        if not homes:
            problems.append(what)
        elif all(_ran(c) for c in homes):
            problems.append(f"{item!r}: its cell {_ran(homes[0])}")
    return problems


@pytest.fixture(scope="module")
def exercise_ids() -> set[str]:
    return set(all_exercises())


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
def test_where_points_at_real_headings_and_depths_are_backed(rows, notebook_sections, exercise_ids, index):
    row = rows[index]
    assert row.depth != "missing" or row.note.strip(), f"{row.key}: say why it is missing"
    for w in row.where:
        assert w.notebook in notebook_sections, f"{row.key}: there is no notebook {w.notebook}"
        secs = notebook_sections[w.notebook]
        assert w.heading in secs, f"{row.key}: notebook {w.notebook} has no heading {w.heading!r}"
        problems = proof_problems(w.proof, secs[w.heading], exercise_ids)
        assert not problems, f"{row.key}: {w.notebook} {w.heading!r}: " + "; ".join(problems)
        assert bool(w.proof) == (w.depth in ("run", "exercised")), f"{row.key}: {w.notebook} {w.heading!r}"
    assert len({(w.notebook, w.heading) for w in row.where}) == len(row.where), f"{row.key}: a place is listed twice"


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
            problems = proof_problems((f"assert: {c.shown_by}",), sec, set())
            assert not problems, f"{row.key}: the box's shown_by: " + "; ".join(problems)


def _homes(item: str, section: dict) -> list[dict]:
    return [c for c in section["cells"] if not proof_problems((item,), dict(section, cells=[c]), {item})]


def test_a_proof_fails_when_its_evidence_is_removed_moved_or_not_run(rows, notebook_sections, exercise_ids):
    """The binding can fail: every place's proof, taken out of its section, left unexecuted or erroring, is caught."""
    proved = [(r.key, w, notebook_sections[w.notebook][w.heading]) for r in rows for w in r.where if w.proof]
    assert len(proved) >= 60
    for key, w, sec in proved:
        for item in w.proof:
            homes = _homes(item, sec)
            assert homes, f"{key}: {item!r}"
            ids = homes[0]["source"]
            moved = dict(sec, cells=[c for c in sec["cells"] if c not in homes])
            assert proof_problems((item,), moved, exercise_ids), f"{key}: {item!r} outside its section still counts"
            for broken in ({"execution_count": None}, {"outputs": [{"output_type": "error"}]},
                           {"source": "# NBVAL_SKIP\n" + ids}):
                cells = [dict(c, **broken) if c in homes else c for c in sec["cells"]]
                assert proof_problems((item,), dict(sec, cells=cells), exercise_ids), f"{key}: {item!r} {broken}"


def test_a_proof_is_an_assert_or_a_registered_exercise_call():
    cell = {"execution_count": 1, "outputs": [], "metadata": {},
            "source": '%time x = 1\nprint("x == 1")  # assert x == 1\nassert  x >  0, "positive"\ncheck("01.fp16-max", x)'}
    sec = {"cells": [cell]}
    assert not proof_problems(("assert: x > 0", "01.fp16-max"), sec, {"01.fp16-max"})
    assert proof_problems(("assert: x == 1",), sec, set()), "a comment or a print is not an assertion"
    gated = dict(cell, source="if SLURM:\n    assert x > 0\ntry:\n    assert y\nexcept E:\n    pass\nfor v in s:\n    assert v\n"
                               "if device.is_cuda(DEV):\n    assert gpu\nelse:\n    assert cpu\nif ok:\n    assert z")
    assert proof_problems(("assert: x > 0",), {"cells": [gated]}, set()), "a branch CI never takes proves nothing"
    assert proof_problems(("assert: gpu",), {"cells": [gated]}, set()), "... nor the GPU branch"
    assert not proof_problems(("assert: cpu",), {"cells": [gated]}, set()), "the CPU branch runs"
    assert proof_problems(("assert: z",), {"cells": [gated]}, set()), "an unknown gate counts as not taken"
    assert proof_problems(("assert: y",), {"cells": [gated]}, set()), "... nor one in a try"
    assert not proof_problems(("assert: v",), {"cells": [gated]}, set()), "a loop's body runs"
    assert proof_problems(("01.fp16-max",), sec, set()) == ["'01.fp16-max' is not a registered exercise"]
    assert proof_problems(("01.bf16-eps",), sec, {"01.bf16-eps"}), "an exercise that is not called there"


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
    where = 'where = [{ notebook = "01", heading = "h", depth = "run", proof = ["assert: x > 0"] }]\n'
    (row,) = readme.load_coverage(_write(bad, ok_row + where))
    assert (row.key, row.depth, row.where[0].heading, row.where[0].proof) == ("000 §1", "run", "h", ("assert: x > 0",))
    fix = '[[section.correction]]\nclaim = "c"\ntruth = "t"\nbox = { notebook = "01", heading = "h" }\n'
    (row,) = readme.load_coverage(_write(bad, ok_row + where + fix + 'evidence = "run"\nshown_by = "x > 0"\n'))
    assert row.corrections[0].shown_by == "x > 0"
    cases = {
        "depth must be one of": ok_row.replace('"run"', '"deep"') + where,
        "gpu must be one of": ok_row.replace('gpu = "no"', 'gpu = "maybe"') + where,
        "not the deepest": ok_row.replace('"run"', '"exercised"') + where,
        "names its proof": ok_row + where.replace(', proof = ["assert: x > 0"]', ""),
        "names the exercise ids": ok_row.replace('"run"', '"exercised"') + where.replace('"run"', '"exercised"'),
        "has nothing to prove": ok_row.replace('"run"', '"explained"') + where.replace('"run"', '"explained"'),
        "a proof is an exercise id": ok_row + where.replace("assert: x > 0", "x > 0"),
        "a proof is listed twice": ok_row + where.replace('"assert: x > 0"', '"09.busbw", "09.busbw"'),
        "names what shows it": ok_row + where + fix + 'evidence = "run"\n',
        "evidence 'docs' has no shown_by": ok_row + where + fix + 'evidence = "docs"\nshown_by = "x"\n',
        "needs where entries": ok_row + "where = []\n",
        "needs a note": ok_row.replace('"run"', '"missing"') + "where = []\n",
        "lists no where": ok_row.replace('"run"', '"missing"') + where + 'note = "n"\n',
        "each where entry": ok_row + 'where = [{ notebook = "01" }]\n',
        "has no \\[seeds.002\\]": ok_row.replace('"000"', '"002"') + where,
        "listed twice$": ok_row + where + "\n" + ok_row + where,
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
