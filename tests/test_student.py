"""The student build strips every solution, keeps everything else, and the student notebooks still run.

It never deletes a user's file (a marker and manifest identify its own builds; anything else is refused
or, with --force, moved aside), and ``--tree`` writes a whole student copy of the workbook that holds no
solution and no reference answer.
"""

from __future__ import annotations

import inspect
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from lab_env import blocker_env
from solution_text import (
    NOTEBOOKS,
    cells,
    file_text,
    public_text,
    reference_lines,
    solution_lines,
    solution_source_blocks,
    strings,
    trivial,
)

import labkit.student as student
from labkit.exercises import all_exercises
from labkit.student import (
    CLEAR_TAG,
    MARKER,
    build_student,
    build_student_tree,
    predict_spans,
    shows_a_verdict,
    solution_blocks,
    strip_solutions,
)

ROOT = Path(__file__).resolve().parents[1]
CHECK = re.compile(r"""check\(\s*["']([^"']+)["']""")


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file below ``folder``, by relative path, with its bytes."""
    return {p.relative_to(folder).as_posix(): p.read_bytes()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def src(tmp_path) -> Path:
    """Two small instructor notebooks, each with one solution block."""
    folder = tmp_path / "workbook" / "notebooks"
    folder.mkdir(parents=True)
    for name in ("00_a.ipynb", "01_b.ipynb"):
        nb = nbformat.v4.new_notebook()
        exercise = "answer = ...\n### BEGIN SOLUTION\nanswer = 42\n### END SOLUTION"
        nb.cells = [nbformat.v4.new_markdown_cell(f"# {name}"), nbformat.v4.new_code_cell(exercise)]
        nbformat.write(nb, folder / name)
    return folder


# --- stripping ------------------------------------------------------------------------------------------


def test_strip_solutions_unit():
    src = "answer = ...\n### BEGIN SOLUTION\nanswer = 42\n### END SOLUTION\ncheck('x', answer)"
    assert strip_solutions(src) == ("answer = ...\ncheck('x', answer)", 1)
    assert solution_blocks(src) == [["answer = 42"]]
    md = "Q\n<!-- BEGIN SOLUTION -->\nA\n<!-- END SOLUTION -->"
    assert strip_solutions(md, "markdown") == ("Q", 1)
    for bad in ["### BEGIN SOLUTION\nx", "### END SOLUTION", "### BEGIN SOLUTION\n### BEGIN SOLUTION"]:
        with pytest.raises(ValueError):
            strip_solutions(bad)


# --- where a build may go: never over a user's files -----------------------------------------------------


def test_build_refuses_to_overwrite_sources(tmp_path):
    with pytest.raises(ValueError, match="source notebooks folder"):
        build_student(ROOT / "notebooks", ROOT / "notebooks")
    with pytest.raises(ValueError, match="folder above it"):
        build_student(ROOT / "notebooks", ROOT)
    with pytest.raises(ValueError, match="no notebooks"):
        build_student(tmp_path, tmp_path / "out")
    with pytest.raises(TypeError, match="path"):
        build_student(ROOT / "notebooks", 42)


def test_out_inside_the_notebooks_folder_is_refused(src):
    for out in (src / "sub", src / "sub" / "deeper"):
        with pytest.raises(ValueError, match="inside the source notebooks folder"):
            build_student(src, out, force=True)
        assert not (src / "sub").exists()
    with pytest.raises(ValueError, match=r"inside the checkout's notebooks/ folder"):
        build_student_tree(ROOT, ROOT / "notebooks" / "student", force=True)
    assert not (ROOT / "notebooks" / "student").exists()


def test_home_and_the_folders_above_the_sources_are_refused_even_with_force(src, tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    (home / "thesis.tex").write_text("years of work")
    monkeypatch.setenv("HOME", str(home))
    for out, why in [(home, "your home folder"), (Path("~"), "your home folder"),
                     (tmp_path, "folder above it"), (src.parent, "folder above it")]:
        for force in (False, True):
            with pytest.raises(ValueError, match=why):
                build_student(src, out, force=force)
    assert (home / "thesis.tex").read_text() == "years of work"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["home", "workbook"]


def test_a_folder_with_a_user_file_is_refused_and_the_file_survives(src, tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.md").write_text("mine")
    with pytest.raises(ValueError, match=r"not an earlier student build.*notes\.md.*--force"):
        build_student(src, out)
    assert snapshot(out) == {"notes.md": b"mine"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine", "workbook"], "no temporary folder left"


def test_an_existing_file_is_refused(src, tmp_path):
    out = tmp_path / "student"
    out.write_text("not a folder")
    for force in (False, True):
        with pytest.raises(ValueError, match="existing file"):
            build_student(src, out, force=force)
    assert out.read_text() == "not a folder"


def test_a_symbolic_link_is_refused(src, tmp_path):
    target = tmp_path / "target"
    target.mkdir()
    (tmp_path / "link").symlink_to(target)
    with pytest.raises(ValueError, match="symbolic link"):
        build_student(src, tmp_path / "link", force=True)
    assert (tmp_path / "link").is_symlink() and list(target.iterdir()) == []


def test_new_and_empty_folders_are_built_with_a_marker_and_manifest(src, tmp_path):
    (tmp_path / "empty").mkdir()
    for out in (tmp_path / "new" / "student", tmp_path / "empty"):
        rep = build_student(src, out)
        assert rep.out_dir == out and rep.removed == {"00_a.ipynb": 1, "01_b.ipynb": 1}
        marker = json.loads((out / MARKER).read_text())
        assert marker["format"] == 1 and marker["kind"] == "notebooks" and "student-build" in marker["about"]
        assert set(marker["files"]) == set(rep.files) == {"00_a.ipynb", "01_b.ipynb"}
        assert "answer = 42" not in (out / "00_a.ipynb").read_text()


def test_a_second_build_replaces_an_earlier_one(src, tmp_path):
    out = tmp_path / "student"
    build_student(src, out)
    (src / "01_b.ipynb").unlink()
    nb = nbformat.read(src / "00_a.ipynb", as_version=4)
    nb.cells.append(nbformat.v4.new_markdown_cell("new section"))
    nbformat.write(nb, src / "00_a.ipynb")
    rep = build_student(src, out)
    assert rep.files == ("00_a.ipynb",) and rep.moved_aside is None
    assert set(snapshot(out)) == {"00_a.ipynb", MARKER}, "the earlier build's own files are gone"
    assert "new section" in (out / "00_a.ipynb").read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["student", "workbook"], "no temporary folder left"


def test_an_earlier_build_with_added_or_changed_files_is_refused(src, tmp_path):
    out = tmp_path / "student"
    build_student(src, out)
    (out / "sub").mkdir()
    (out / "sub" / "my_answers.py").write_text("answer = 42")
    (out / "00_a.ipynb").write_text((out / "00_a.ipynb").read_text().replace("...", "41"))
    before = snapshot(out)
    with pytest.raises(ValueError, match=r"00_a\.ipynb \(changed\).*sub/my_answers\.py \(added\).*--force"):
        build_student(src, out)
    assert snapshot(out) == before


def test_force_moves_the_folder_aside_and_deletes_nothing(src, tmp_path):
    out = tmp_path / "student"
    out.mkdir()
    (out / "notes.md").write_text("mine")
    rep = build_student(src, out, force=True)
    assert rep.moved_aside is not None and rep.moved_aside.parent == tmp_path
    assert rep.moved_aside.name.startswith("student.replaced-")
    assert snapshot(rep.moved_aside) == {"notes.md": b"mine"}
    assert set(snapshot(out)) == {"00_a.ipynb", "01_b.ipynb", MARKER}
    (out / "extra.txt").write_text("added later")  # an earlier build with a user's file: moved aside whole
    rep2 = build_student(src, out, force=True)
    assert rep2.moved_aside is not None and rep2.moved_aside != rep.moved_aside
    assert snapshot(rep2.moved_aside)["extra.txt"] == b"added later"


def test_an_interrupted_build_leaves_the_previous_build_intact(src, tmp_path, monkeypatch):
    out = tmp_path / "student"
    build_student(src, out)
    before = snapshot(out)
    real, calls = student._write, []

    def failing_write(*args, **kwargs):
        calls.append(args[1])
        if len(calls) == 2:
            raise KeyboardInterrupt("interrupted mid-build")
        return real(*args, **kwargs)

    monkeypatch.setattr(student, "_write", failing_write)
    (src / "00_a.ipynb").write_text((src / "00_a.ipynb").read_text().replace("# 00_a", "# changed"))
    with pytest.raises(KeyboardInterrupt):
        build_student(src, out)
    assert calls == ["00_a.ipynb", "01_b.ipynb"]
    assert snapshot(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["student", "workbook"], "the half build is removed"


def test_a_marker_naming_files_outside_the_folder_is_not_trusted(src, tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    out = tmp_path / "student"
    out.mkdir()
    digest = student._sha256(victim)
    (out / MARKER).write_text(json.dumps({"format": 1, "files": {"../victim.txt": digest}}))
    with pytest.raises(ValueError, match="not an earlier student build"):
        build_student(src, out)
    assert victim.read_text() == "keep me" and (out / MARKER).exists()


def test_removing_an_earlier_build_spares_what_changed_since_the_check(tmp_path):
    """The last guard: a file edited between the check and the removal stays, and so does its folder."""
    old = tmp_path / "old"
    (old / "notebooks").mkdir(parents=True)
    (old / "notebooks" / "a.ipynb").write_text("built")
    (old / "b.txt").write_text("built")
    manifest = {rel: student._sha256(old / rel) for rel in ("notebooks/a.ipynb", "b.txt")}
    (old / MARKER).write_text("{}")
    (old / "notebooks" / "a.ipynb").write_text("edited by the student")
    assert student._remove_build(old, manifest) is False
    assert snapshot(old) == {"notebooks/a.ipynb": b"edited by the student"}


def test_tree_needs_a_workbook_checkout(tmp_path):
    with pytest.raises(ValueError, match="does not look like the workbook"):
        build_student_tree(tmp_path, tmp_path / "out")
    with pytest.raises(ValueError, match=r"inside the checkout's tools/ folder"):
        build_student_tree(ROOT, ROOT / "tools" / "student")
    assert not (tmp_path / "out").exists() and not (ROOT / "tools" / "student").exists()


@pytest.fixture
def fake_checkout(tmp_path) -> Path:
    """A workbook checkout in miniature: its own folders, each holding a file, and two notebooks."""
    co = tmp_path / "co"
    (co / "notebooks").mkdir(parents=True)
    for name in ("00_a.ipynb", "01_b.ipynb"):
        nb = nbformat.v4.new_notebook()
        nb.cells = [nbformat.v4.new_code_cell("answer = ...\n### BEGIN SOLUTION\nanswer = 42\n### END SOLUTION")]
        nbformat.write(nb, co / "notebooks" / name)
    for rel, text in [("labkit/__init__.py", ""), ("tools/nbsrc/00_a.py", "# source"), ("tests/test_x.py", ""),
                      ("docs/glossary.md", "# words"), ("docs/img/x.png", "png"), ("slurm/jupyter.sbatch", "#!"),
                      ("README.md", "# workbook"), ("docs/student/README.md", "# yours"), (".git/HEAD", "ref: main")]:
        (co / rel).parent.mkdir(parents=True, exist_ok=True)
        (co / rel).write_text(text)
    return co


def test_out_inside_the_source_tree_is_refused_even_with_force(fake_checkout, tmp_path):
    co = fake_checkout
    before = snapshot(co)
    for rel in ("labkit", "tools/nbsrc", "tools", "tests", "docs", "slurm", ".git", "labkit/student"):
        for build, src in ((build_student, co / "notebooks"), (build_student_tree, co)):
            with pytest.raises(ValueError, match=r"inside the checkout's [\w.]+/ folder"):
                build(src, co / rel, force=True)
    assert snapshot(co) == before and sorted(p.name for p in tmp_path.iterdir()) == ["co"], "nothing moved"
    assert build_student(co / "notebooks", co / "dist" / "student").files == ("00_a.ipynb", "01_b.ipynb")
    assert ROOT in student._checkouts(tmp_path), "labkit's own checkout is always out of bounds"


def test_cli_refuses_an_out_inside_the_source_tree_in_one_line(fake_checkout, tmp_path):
    before = snapshot(fake_checkout)
    for rel in ("labkit", "tools/nbsrc"):
        r = cli("--src", str(fake_checkout / "notebooks"), "--out", str(fake_checkout / rel), "--force",
                cwd=tmp_path)
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr
        assert f"inside the checkout's {rel.split('/')[0]}/ folder" in r.stderr
    assert snapshot(fake_checkout) == before and sorted(p.name for p in tmp_path.iterdir()) == ["co"]


def test_a_build_that_loses_a_race_leaves_no_temporary_folder(src, tmp_path, monkeypatch):
    """Another build finishes first and takes the new out_dir: this one says so, and removes only its own
    temporary folder; the other build's folder stays as it is."""
    out = tmp_path / "student"
    real = student._write

    def other_build_first(root, rel, *args, **kwargs):
        if not out.exists():
            out.mkdir()
            (out / "theirs.ipynb").write_text("the other build's")
        return real(root, rel, *args, **kwargs)

    monkeypatch.setattr(student, "_write", other_build_first)
    with pytest.raises(ValueError, match="appeared while this build ran"):
        build_student(src, out)
    assert snapshot(out) == {"theirs.ipynb": b"the other build's"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["student", "workbook"], "no .student.building-* left"


# --- the command line ----------------------------------------------------------------------------------


def cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "labkit", "student-build", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=120)


def test_cli_refusals_are_one_line_with_exit_status_2(src, tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.md").write_text("mine")
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    cases = [(["--src", str(src), "--out", str(mine)], "notes.md"),
             (["--src", str(src), "--out", str(a_file)], "existing file"),
             (["--src", str(src), "--out", str(src / "sub")], "inside the source notebooks folder"),
             (["--out", "notebooks/sub"], "inside the source notebooks folder"),
             (["--tree", "--out", "notebooks/sub"], "inside the checkout's notebooks/ folder"),
             (["--tree", "--out", "."], "the workbook checkout")]
    for args, why in cases:
        r = cli(*args)
        assert r.returncode == 2, (args, r.stdout, r.stderr)
        assert r.stderr.count("\n") == 1 and why in r.stderr and "Traceback" not in r.stderr, r.stderr
        assert r.stderr.startswith("python -m labkit student-build: error: ")
    assert not (ROOT / "notebooks" / "sub").exists()
    assert snapshot(mine) == {"notes.md": b"mine"} and a_file.read_text() == "x"
    assert cli("--tree", "--src", str(src), "--out", str(tmp_path / "x")).returncode == 2


def _cell(**fields) -> dict:
    return {"cell_type": "code", "metadata": {}, "source": "x = 1", "outputs": [], "execution_count": None, **fields}


def _nb(**fields) -> dict:
    return {"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": [_cell()], **fields}


# (what the file holds, what the one line says): the file is src/bad.ipynb
MALFORMED = {
    "not-json": (b"{this is not json", "not JSON"),
    "a-json-list": (b"[1, 2, 3]", "its JSON is a list, not an object"),
    "no-cells": (json.dumps({"nbformat": 4, "metadata": {}}).encode(), "no 'cells' list"),
    "cells-a-dict": (json.dumps(_nb(cells={"a": 1})).encode(), "no 'cells' list"),
    "cell-not-a-dict": (json.dumps(_nb(cells=[_cell(), "x = 1"])).encode(), "cell 1 is a string, not a cell"),
    "source-a-number": (json.dumps(_nb(cells=[_cell(source=42)])).encode(), "cell 0 has a 'source' that is a number"),
    "source-lines-not-text": (json.dumps(_nb(cells=[_cell(source=["a", 1])])).encode(), "'source' list holding a number"),
    "nbformat-3": (json.dumps({"nbformat": 3, "nbformat_minor": 0, "metadata": {}, "worksheets": []}).encode(),
                   "nbformat 3; the student build reads nbformat 4"),
    "no-nbformat": (json.dumps({"cells": []}).encode(), "no nbformat"),
    "empty-file": (b"", "the file is empty"),
    "binary-garbage": (bytes(range(256)) * 4, "not UTF-8 text"),
    "unknown-cell-type": (json.dumps(_nb(cells=[_cell(cell_type="widget")])).encode(), "cell_type 'widget'"),
    "cell-type-missing": (json.dumps(_nb(cells=[{"source": "x"}])).encode(), "cell_type missing"),
    "tags-not-a-list": (json.dumps(_nb(cells=[_cell(metadata={"tags": 3})])).encode(), "list of 'tags'"),
    "outputs-not-a-list": (json.dumps(_nb(cells=[_cell(outputs=7)])).encode(), "'outputs' that are a number"),
    "metadata-not-an-object": (json.dumps(_nb(metadata=[])).encode(), "'metadata' is not an object"),
    "deeply-nested": (b"[" * 100_000 + b"]" * 100_000, "not a notebook"),
    "unbalanced-solution": (json.dumps(_nb(cells=[_cell(source="### BEGIN SOLUTION\nx")])).encode(),
                            "cell 0: BEGIN SOLUTION without END SOLUTION"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_a_malformed_notebook_is_one_line_naming_it_and_nothing_is_written(case, src, tmp_path, capsys):
    """student-build given a file that is not a notebook: one line on stderr naming the file and what is wrong,
    exit status 2, and no output folder (not even its parent)."""
    from labkit.__main__ import main

    data, why = MALFORMED[case]
    (src / "bad.ipynb").write_bytes(data)
    out = tmp_path / "dist" / "student"
    assert main(["student-build", "--src", str(src), "--out", str(out)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1, captured.err
    assert captured.err.startswith("python -m labkit student-build: error: ")
    assert str(src / "bad.ipynb") in captured.err and why in captured.err, captured.err
    assert len(captured.err) < 400, captured.err
    assert not (tmp_path / "dist").exists()


def test_odd_outputs_are_kept_as_they_are(src, tmp_path):
    """An output whose text is not strings is not a notebook error: the build keeps it (it used to raise TypeError)."""
    assert shows_a_verdict({"outputs": [{"text": [1, None]}, 3]}) is False
    (src / "odd.ipynb").write_text(json.dumps(_nb(cells=[_cell(outputs=[{"output_type": "stream", "text": [1]}])])))
    rep = build_student(src, tmp_path / "out")
    assert rep.removed["odd.ipynb"] == 0
    assert json.loads((tmp_path / "out" / "odd.ipynb").read_text())["cells"][0]["outputs"][0]["text"] == [1]


def test_a_notebook_over_the_size_limit_is_refused_unread(src, tmp_path, capsys):
    from labkit.__main__ import main

    with open(src / "huge.ipynb", "wb") as f:
        f.truncate(student.MAX_NOTEBOOK_BYTES + 1)  # sparse: no disk used, and never read
    assert main(["student-build", "--src", str(src), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "huge.ipynb: 67,108,865 bytes, more than the 67,108,864" in err, err
    assert not (tmp_path / "out").exists()


def test_a_malformed_notebook_from_the_command_line(src, tmp_path):
    """What a user sees: the same one line from ``python -m labkit student-build``, exit status 2."""
    (src / "bad.ipynb").write_bytes(b"[1, 2, 3]")
    r = cli("--src", str(src), "--out", str(tmp_path / "out"))
    assert r.returncode == 2 and r.stdout == "" and "Traceback" not in r.stderr, r.stderr
    assert r.stderr == (f"python -m labkit student-build: error: {src / 'bad.ipynb'}: not a notebook: its JSON is a "
                        "list, not an object\n")
    assert not (tmp_path / "out").exists()


def test_cli_builds_rebuilds_and_forces(src, tmp_path):
    out = tmp_path / "student"
    first = cli("--src", str(src), "--out", str(out))
    assert first.returncode == 0 and "wrote 2 notebooks" in first.stdout, first.stderr
    assert cli("--src", str(src), "--out", str(out)).returncode == 0
    (out / "notes.md").write_text("mine")
    assert cli("--src", str(src), "--out", str(out)).returncode == 2
    forced = cli("--src", str(src), "--out", str(out), "--force")
    assert forced.returncode == 0 and "nothing deleted" in forced.stdout, forced.stderr
    (aside,) = tmp_path.glob("student.replaced-*")
    assert (aside / "notes.md").read_text() == "mine"


# --- the real notebooks, and the student tree ----------------------------------------------------------


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
def tree(tmp_path_factory) -> Path:
    """The student tree, as `make student` builds it and docs/instructor.md hands it out."""
    out = tmp_path_factory.mktemp("student") / "tree"
    rep = build_student_tree(ROOT, out)
    assert set(rep.removed) == {p.name for p in NOTEBOOKS}
    return out


@pytest.fixture(scope="module")
def student_dir(tree) -> Path:
    # the notebooks inside the tree: notebook 12 finds the tree's slurm/ from there
    return tree / "notebooks"


def test_tree_holds_what_a_student_needs_and_no_package_or_tooling(tree):
    files = set(snapshot(tree))
    slurm = {p.relative_to(ROOT).as_posix() for p in (ROOT / "slurm").iterdir() if p.is_file()}
    assert slurm <= files and "slurm/jupyter.sbatch" in files, "notebook 12 reads slurm/ from the tree"
    assert {"README.md", MARKER} <= files and {f"notebooks/{p.name}" for p in NOTEBOOKS} <= files
    images = {f"docs/img/{p.name}" for p in (ROOT / "docs" / "img").iterdir()}
    assert images <= files, "the README's screenshots"
    assert "docs/glossary.md" in files, "the README links the glossary"
    assert not [f for f in files if f.startswith("slurm/jupyterhub/")], "the hub setup is the admin's, not the student's"
    tops = {f.split("/")[0] for f in files}
    assert tops == {"README.md", MARKER, "docs", "notebooks", "slurm"}
    assert not [f for f in files if f.endswith(".py")]
    assert not {"docs/instructor.md", "docs/authoring.md"} & files
    for f in ("slurm/jupyter.sbatch", "slurm/ddp.sbatch"):
        assert (tree / f).stat().st_mode == (ROOT / f).stat().st_mode, f"{f}: permission bits kept"


def test_tree_readme_is_the_students_and_every_link_in_the_tree_resolves_inside_it(tree):
    """The tree's README is docs/student/README.md (no make command a student cannot run), and every relative link of
    every Markdown file in the tree points at a file the tree holds."""
    readme = (tree / "README.md").read_text()
    assert readme == (ROOT / "docs" / "student" / "README.md").read_text()
    assert not re.search(r"`make \w|^make ", readme, re.M) and "notebooks/00_environment.ipynb" in readme
    broken = []
    for md in tree.rglob("*.md"):
        for target in re.findall(r"\]\(([^)\s]+)\)", md.read_text()):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue
            path = (md.parent / target.split("#")[0]).resolve()
            if tree.resolve() not in path.parents or not path.exists():
                broken.append(f"{md.relative_to(tree)}: {target}")
    assert not broken, broken


def test_tree_notebooks_are_the_student_build(tree, tmp_path):
    """The tree's notebooks are byte for byte build_student's: the top-to-bottom runs below run them."""
    rep = build_student(ROOT / "notebooks", tmp_path / "copies")
    for name in rep.removed:
        assert (tree / "notebooks" / name).read_bytes() == (tmp_path / "copies" / name).read_bytes(), name
    assert set(json.loads((tree / MARKER).read_text())["files"]) == set(snapshot(tree)) - {MARKER}


def test_tree_holds_no_solution_and_no_reference_answer(tree):
    public = public_text()
    solutions = {s for s in solution_lines() if s not in public}
    references = {s: k for k, ex in all_exercises().items() for ln in reference_lines(ex.reference)
                  if not trivial(s := ln) and s not in public}
    # the search finds what it looks for: each secret is in the instructor notebooks or the exercise modules
    instructor = "\n".join(file_text(p) for p in NOTEBOOKS)
    # reference functions live in the exercise modules or in the labkit module that teaches them (labkit.handpar)
    graders = "\n".join(p.read_text() for p in (ROOT / "labkit").rglob("*.py"))
    assert len(solutions) >= 40 and all(s in instructor for s in solutions)
    code = {ln.strip() for ex in all_exercises().values() if inspect.isfunction(ex.reference)
            for ln in reference_lines(ex.reference)} & set(references)
    assert len(references) >= 40 and len(code) >= 20 and all(s in graders for s in code)
    leaks = []
    for path in sorted(tree.rglob("*")):
        if path.is_file():
            text = file_text(path)
            leaks += [f"{path.relative_to(tree)}: solution line {s!r}" for s in solutions if s in text]
            leaks += [f"{path.relative_to(tree)}: reference of {k}: {s!r}"
                      for s, k in references.items() if s in text]
    assert not leaks, "\n".join(leaks)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_student_copy_has_no_solution(student_dir, path):
    mine, theirs = cells(path), cells(student_dir / path.name)
    assert len(mine) == len(theirs)
    spans = predict_spans(json.loads(path.read_text())["cells"])
    for i, (a, b) in enumerate(zip(mine, theirs)):
        assert "BEGIN SOLUTION" not in b["source"] and "END SOLUTION" not in b["source"]
        blocks = solution_blocks(a["source"], a["cell_type"])
        if not blocks:
            cleared = a["cell_type"] == "code" and (CLEAR_TAG in a.get("metadata", {}).get("tags", [])
                                                    or i in spans or shows_a_verdict(a))
            if cleared:  # a result that answers a prediction, or a stored verdict: the source stays, no output
                assert b["source"] == a["source"] and b["outputs"] == [] and b["execution_count"] is None
            else:
                assert a == b, "cells without solutions are kept intact, outputs included"
            continue
        prompt = strip_solutions(a["source"], a["cell_type"])[0]
        assert b["source"] == prompt
        secret = {ln for blk in blocks for ln in blk if ln.strip()} - set(prompt.splitlines())
        leaked = secret & set(b["source"].splitlines())
        assert not leaked, f"solution lines leaked: {leaked}"
        if b["cell_type"] == "code":
            assert b["outputs"] == [] and b["execution_count"] is None


@pytest.fixture(scope="module")
def lab_env(tmp_path_factory) -> dict[str, str]:
    """The kernel's environment: only what `make lab` installs can be imported (tests/lab_env.py)."""
    return blocker_env(tmp_path_factory.mktemp("lab_env"), dict(os.environ))


def test_lab_env_blocks_the_test_tools_and_keeps_what_make_lab_installs(lab_env):
    probe = ("import importlib, importlib.util\n"
             "for m in ('pytest', 'nbval', 'playwright', 'hypothesis'):\n"
             "    assert importlib.util.find_spec(m) is None, m\n"
             "    try: importlib.import_module(m)\n"
             "    except ModuleNotFoundError as e: assert e.name == m, e\n"
             "    else: raise SystemExit(m + ' imported')\n"
             "import deepspeed, torch, labkit, ipykernel, matplotlib, ml_dtypes, triton\n"
             "from importlib.metadata import version, PackageNotFoundError\n"
             "assert version('deepspeed') and version('matplotlib-inline')\n"
             "try: version('pytest')\n"
             "except PackageNotFoundError: pass\n"
             "else: raise SystemExit('pytest metadata visible')\n"
             "print('ok')")
    out = subprocess.run([sys.executable, "-c", probe], env=lab_env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-2000:]


# Every student copy runs top to bottom, in JupyterLab, with only what `make lab` installs:
# tests/browser/test_notebooks.py::test_run_all_in_browser (the browser tests serve the workspace copies).


def test_predict_spans_run_from_the_prediction_to_its_reveal():
    code = lambda src: {"cell_type": "code", "source": src}  # noqa: E731
    md = {"cell_type": "markdown", "source": "reveal('a.b', 1) in prose is no call"}
    nb = [code("x = 1"), code('predict("a.b", p)'), md, code("measured = 2"), code('reveal("a.b", measured)'),
          code("after = 3"), code("predict('c.d', [1,\n 2])"), code("no reveal below")]
    assert predict_spans(nb) == {1, 3, 4, 6}
    with pytest.raises(TypeError, match="list of cells"):
        predict_spans("not cells")


def test_no_predict_result_is_shown_before_the_learner_predicts(student_dir):
    """In the learner's copy, every code cell from a predict(...) through its reveal(...) has no stored output: the
    measurement that answers the prediction appears only when the learner runs it."""
    seen = 0
    for path in NOTEBOOKS:
        ref, mine = cells(path), cells(student_dir / path.name)
        for i, c in enumerate(ref):
            m = re.search(r"""\bpredict\(\s*["']([^"']+)["']""", c["source"]) if c["cell_type"] == "code" else None
            if not m:
                continue
            j = next(k for k in range(i + 1, len(ref)) if f'reveal("{m.group(1)}"' in ref[k]["source"])
            assert any(ref[k].get("outputs") for k in range(i, j + 1) if ref[k]["cell_type"] == "code"), \
                f"{path.name}: the reference copy of {m.group(1)} stores no output: the test would test nothing"
            shown = [k for k in range(i, j + 1) if mine[k]["cell_type"] == "code" and mine[k]["outputs"]]
            assert not shown, f"{path.name}: cells {shown} show {m.group(1)}'s result before the prediction"
            seen += 1
    assert seen >= 15


def _windows(lines: list[str], n: int = 3) -> set[tuple[str, ...]]:
    kept = [ln.strip() for ln in lines if not trivial(ln.strip())]
    return {tuple(kept[i:i + n]) for i in range(len(kept) - n + 1)}


def test_no_output_of_the_learners_copy_shows_an_answer(tree):
    """No stored output in the student tree shows three consecutive lines of an answer: of a solution block in the
    notebook sources or of a reference answer's code (labkit's own version of what an exercise asks for, printed by
    ``inspect.getsource`` or ``rank_module`` below the exercise). One shared line is no leak (a lesson and its
    exercise may share ``world = dist.get_world_size()``); a printed body of the answer is."""
    answers: dict[tuple[str, ...], str] = {}
    for name, block in solution_source_blocks():
        answers.update(dict.fromkeys(_windows(block), f"a solution in {name}"))
    for key, ex in all_exercises().items():
        if inspect.isfunction(ex.reference):
            answers.update(dict.fromkeys(_windows(reference_lines(ex.reference)), f"the reference of {key}"))
    assert len(answers) >= 100
    # the search finds what it looks for: notebook 11's reference copy prints three answers in full (rank_module of
    # overlap_gradients, labkit's zero1_step and gpipe_step), each after its exercise
    printed = [[ln for o in c.get("outputs", []) for s in strings(o) for ln in s.splitlines()]
               for p in NOTEBOOKS for c in cells(p)]
    assert sum(bool(_windows(lines) & set(answers)) for lines in printed) >= 3
    leaks = []
    for path in sorted((tree / "notebooks").glob("*.ipynb")):
        for i, c in enumerate(cells(path)):
            lines = [ln for o in c.get("outputs", []) for s in strings(o) for ln in s.splitlines()]
            leaks += [f"{path.name} cell {i}: {answers[w]}: {w}" for w in _windows(lines) & set(answers)]
    assert not leaks, "\n".join(sorted(leaks)[:20])
