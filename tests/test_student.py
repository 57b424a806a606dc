"""The student build strips every solution, keeps everything else, and the student notebooks still run."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from labkit.exercises import all_exercises
from labkit.student import build_student, solution_blocks, strip_solutions

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
CHECK = re.compile(r"""check\(\s*["']([^"']+)["']""")


def cells(path: Path) -> list[dict]:
    return [{**c, "source": "".join(c["source"])} for c in json.loads(path.read_text())["cells"]]


def test_strip_solutions_unit():
    src = "answer = ...\n### BEGIN SOLUTION\nanswer = 42\n### END SOLUTION\ncheck('x', answer)"
    assert strip_solutions(src) == ("answer = ...\ncheck('x', answer)", 1)
    assert solution_blocks(src) == [["answer = 42"]]
    md = "Q\n<!-- BEGIN SOLUTION -->\nA\n<!-- END SOLUTION -->"
    assert strip_solutions(md, "markdown") == ("Q", 1)
    for bad in ["### BEGIN SOLUTION\nx", "### END SOLUTION", "### BEGIN SOLUTION\n### BEGIN SOLUTION"]:
        with pytest.raises(ValueError):
            strip_solutions(bad)


def test_build_refuses_to_overwrite_sources(tmp_path):
    with pytest.raises(ValueError):
        build_student(ROOT / "notebooks", ROOT / "notebooks")
    with pytest.raises(ValueError):
        build_student(ROOT / "notebooks", ROOT)
    with pytest.raises(ValueError, match="no notebooks"):
        build_student(tmp_path, tmp_path / "out")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_notebook_has_three_checked_exercises(path):
    registry = all_exercises()
    ids = []
    for c in cells(path):
        if c["cell_type"] != "code" or "check(" not in c["source"]:
            continue
        blocks = solution_blocks(c["source"])
        found = CHECK.findall(c["source"])
        if blocks:
            assert "..." in strip_solutions(c["source"])[0], f"{path.name}: exercise cell without a `...` for the learner"
            ids += found
    assert len(set(ids)) >= 3, f"{path.name}: {len(set(ids))} auto-checked exercises with solutions, want >= 3"
    unknown = [i for i in ids if i not in registry]
    assert not unknown, f"{path.name}: check ids not registered: {unknown}"
    assert all(i.startswith(path.name[:2] + ".") for i in ids)


@pytest.fixture(scope="module")
def student_dir(tmp_path_factory):
    # as docs/instructor.md says: the student notebooks go into a checkout (notebook 10 reads slurm/)
    checkout = tmp_path_factory.mktemp("student")
    shutil.copytree(ROOT / "slurm", checkout / "slurm")
    out = checkout / "notebooks"
    rep = build_student(ROOT / "notebooks", out)
    assert set(rep.removed) == {p.name for p in NOTEBOOKS}
    return out


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_student_copy_has_no_solution(student_dir, path):
    mine, theirs = cells(path), cells(student_dir / path.name)
    assert len(mine) == len(theirs)
    for a, b in zip(mine, theirs):
        assert "BEGIN SOLUTION" not in b["source"] and "END SOLUTION" not in b["source"]
        blocks = solution_blocks(a["source"], a["cell_type"])
        if not blocks:
            assert a == b, "cells without solutions are kept intact, outputs included"
            continue
        prompt = strip_solutions(a["source"], a["cell_type"])[0]
        assert b["source"] == prompt
        secret = {ln for blk in blocks for ln in blk if ln.strip()} - set(prompt.splitlines())
        leaked = secret & set(b["source"].splitlines())
        assert not leaked, f"solution lines leaked: {leaked}"
        if b["cell_type"] == "code":
            assert b["outputs"] == [] and b["execution_count"] is None


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_student_copy_runs_top_to_bottom(student_dir, path):
    nb = nbformat.read(student_dir / path.name, as_version=4)
    NotebookClient(nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(student_dir)}}).execute()
    printed = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
                      if o.get("output_type") == "stream")
    n_checks = len({i for c in cells(path) if c["cell_type"] == "code" and solution_blocks(c["source"])
                    for i in CHECK.findall(c["source"])})
    assert printed.count("not attempted yet") >= n_checks
