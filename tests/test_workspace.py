"""The learner's workspace: `make lab` creates work/ (student copies), never overwrites an edit, puts an upstream
change beside the learner's copy, deletes nothing, holds no solution, and its notebooks run top to bottom.

The workspaces here are made from a temporary copy of the checkout's notebooks/ and slurm/ (never in the checkout).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from solution_text import (
    NOTEBOOKS,
    cells,
    file_text,
    public_text,
    reference_lines,
    solution_lines,
    strings,
    trivial,
)

from labkit.exercises import all_exercises
from labkit.student import _student_notebook, predict_spans, shows_a_verdict, solution_blocks
from labkit.workspace import (
    CLEAR_TAG,
    MARKER,
    NOTE_TAG,
    PROGRESS_FILE,
    find_workspace,
    update_workspace,
    updated_name,
    workspace_notebook,
)

ROOT = Path(__file__).resolve().parents[1]
CHECK = re.compile(r"""(?:check|predict|reveal)\(\s*["']([^"']+)["']""")
VERDICT = re.compile(r"^[✓✗✎] \d\d\.\S+:", re.M)  # what check, predict and reveal print for an answer


def snapshot(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "labkit", "workspace", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=120)


@pytest.fixture
def checkout(tmp_path) -> Path:
    """A fresh clone, as far as the workspace is concerned: notebooks/ and slurm/."""
    co = tmp_path / "labkit"
    (co / "notebooks").mkdir(parents=True)
    for nb in NOTEBOOKS:
        shutil.copy2(nb, co / "notebooks" / nb.name)
    shutil.copytree(ROOT / "slurm", co / "slurm")
    return co


def _edit_upstream(path: Path, text: str) -> None:
    """Change a reference notebook as a `git pull` would: a new sentence in its title cell."""
    nb = json.loads(path.read_text())
    src = nb["cells"][0]["source"]
    nb["cells"][0]["source"] = (src if isinstance(src, str) else "".join(src)) + "\n\n" + text
    path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")


def _learner_edits(path: Path, text: str = "answer = 42  # my try") -> None:
    """What a learner does in JupyterLab: fill in an exercise, add a cell, save."""
    nb = json.loads(path.read_text())
    nb["cells"].append({"cell_type": "code", "execution_count": None, "id": "mine", "metadata": {},
                        "outputs": [], "source": text})
    path.write_text(json.dumps(nb, indent=1) + "\n")


# --- make lab ------------------------------------------------------------------------------------------------

def test_make_lab_creates_the_workspace_then_opens_jupyterlab_on_it():
    out = subprocess.run(["make", "-n", "-s", "lab", "VENV=" + sys.prefix], cwd=ROOT, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    ws = next(i for i, ln in enumerate(lines) if "-m labkit workspace" in ln)
    lab = next(i for i, ln in enumerate(lines) if "jupyter lab" in ln)
    assert ws < lab, "the workspace is created or updated before JupyterLab starts"
    assert "--dir work" in lines[ws]
    assert "--ContentsManager.preferred_dir=work" in lines[lab] and "--ServerApp.root_dir=." in lines[lab]
    assert "--ip 127.0.0.1" in lines[lab] and "token" not in lines[lab], "loopback, and the default token auth"


def test_work_is_git_ignored():
    assert re.search(r"^/?work/$", (ROOT / ".gitignore").read_text(), re.M)
    if shutil.which("git") and (ROOT / ".git").exists():
        out = subprocess.run(["git", "check-ignore", "-q", "work/00_environment.ipynb"], cwd=ROOT, timeout=30)
        assert out.returncode == 0


# --- a fresh clone ---------------------------------------------------------------------------------------------

def test_fresh_clone_gets_a_workspace_of_student_copies(checkout):
    out = run_cli(cwd=checkout)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("workspace: created your workspace") and out.stdout.count("\n") == 1
    work = checkout / "work"
    names = {p.name for p in NOTEBOOKS}
    assert names | {"README.md", MARKER} == {p.name for p in work.iterdir()}
    assert not (work / "slurm").exists(), "inside the checkout, notebooks find the checkout's slurm/"
    assert find_workspace(work) == work and find_workspace(checkout) is None
    readme = (work / "README.md").read_text()
    assert "](../notebooks/)" in readme and ".updated.ipynb" in readme
    for ref in NOTEBOOKS:
        mine = work / ref.name
        assert mine.read_bytes() == workspace_notebook(ref, f"../notebooks/{ref.name}")
        theirs, got = cells(ref), cells(mine)
        note = got[0]
        assert note["cell_type"] == "markdown" and NOTE_TAG in note["metadata"]["tags"]
        assert f"]({Path('..') / 'notebooks' / ref.name})" in note["source"]
        assert len(got) == len(theirs) + 1
        student = [{**c, "source": "".join(c["source"]) if isinstance(c["source"], list) else c["source"]}
                   for c in json.loads(_student_notebook(ref)[0])["cells"]]
        spans = predict_spans(json.loads(ref.read_text())["cells"])
        for i, (a, b, s) in enumerate(zip(theirs, got[1:], student)):
            blocks = solution_blocks(a["source"], a["cell_type"])
            verdict = shows_a_verdict(a)
            if CLEAR_TAG in a["metadata"].get("tags", []) or (verdict and not blocks) or (i in spans and not blocks):
                # the learner's own state (progress), a reference answer's verdict (reveal's ✓), or a result that
                # answers a prediction (predict ... reveal): cleared
                assert b["outputs"] == [] and b["execution_count"] is None
                assert b["source"] == a["source"]
            elif blocks:
                assert b == s and "SOLUTION" not in b["source"]
                if b["cell_type"] == "code":
                    assert b["outputs"] == [] and b["execution_count"] is None, "exercise outputs cleared"
            else:
                assert b == a, "teaching cells keep their outputs"
        assert "jupytext" not in json.loads(mine.read_text())["metadata"], "no pairing with tools/nbsrc"


def test_the_progress_cell_of_notebook_00_is_cleared():
    ref = ROOT / "notebooks" / "00_environment.ipynb"
    tagged = [c for c in cells(ref) if CLEAR_TAG in c["metadata"].get("tags", []) and "progress()" in c["source"]]
    assert len(tagged) == 1 and tagged[0]["outputs"]
    assert "record no progress" in "".join(strings(tagged[0]["outputs"])), \
        "the reference notebooks record nothing, so the stored output does not depend on anyone's progress"


# --- no solution in the workspace ------------------------------------------------------------------------------

def test_no_solution_text_in_the_workspace(checkout):
    update_workspace(checkout)
    # an upstream change makes .updated copies too: they are searched as well
    edited = checkout / "work" / NOTEBOOKS[1].name
    _learner_edits(edited)
    _edit_upstream(checkout / "notebooks" / NOTEBOOKS[1].name, "A new paragraph upstream.")
    assert update_workspace(checkout).beside
    public = public_text()
    solutions = {s for s in solution_lines() if s not in public}
    references = {s: k for k, ex in all_exercises().items() for ln in reference_lines(ex.reference)
                  if not trivial(s := ln) and s not in public}
    assert len(solutions) >= 40 and len(references) >= 40

    def leaks(files: list[Path]) -> list[str]:
        found = []
        for path in files:
            text = file_text(path)
            found += [f"{path.name}: solution line {s!r}" for s in solutions if s in text]
            found += [f"{path.name}: reference of {k}: {s!r}" for s, k in references.items() if s in text]
        return found

    # the search finds what it looks for: in the reference notebooks it finds every solution line
    in_reference = leaks(NOTEBOOKS)
    assert sum("solution line" in f for f in in_reference) >= len(solutions), \
        "a solution line of tools/nbsrc is not in its notebook: rebuild it (tools/nbbuild.py NN)"
    files = sorted(p for p in (checkout / "work").rglob("*") if p.is_file())
    assert len([p for p in files if p.suffix == ".ipynb"]) == len(NOTEBOOKS) + 1
    assert not leaks(files), "\n".join(leaks(files))
    # nor a verdict on a reference answer: a stored "✓ 00.x: correct. ..." (of a reveal cell) tells the answer
    assert any(VERDICT.search(file_text(p)) for p in NOTEBOOKS), "the reference notebooks show verdicts"
    shown = [f"{p.name}: {m[0]}" for p in files if p.suffix == ".ipynb"
             for c in cells(p) if c["cell_type"] == "code" for o in c["outputs"]
             for m in [VERDICT.search("".join(strings(o)))] if m]
    assert not shown, shown


# --- updates: never over the learner's work, nothing deleted ----------------------------------------------------

def test_an_edit_survives_a_second_run(checkout):
    assert run_cli(cwd=checkout).returncode == 0
    work = checkout / "work"
    _learner_edits(work / "01_float_bit_layouts.ipynb")
    (work / "notes.md").write_text("mine")
    (work / PROGRESS_FILE).write_text('{"kind": "labkit-progress"}')
    before = snapshot(work)
    out = run_cli(cwd=checkout)
    assert out.returncode == 0, out.stderr
    assert out.stdout == f"workspace: your workspace {work} is up to date ({len(NOTEBOOKS)} notebooks)\n"
    after = snapshot(work)
    assert {k: v for k, v in after.items() if k != MARKER} == {k: v for k, v in before.items() if k != MARKER}


def test_an_upstream_change_lands_beside_an_edited_copy_and_replaces_an_untouched_one(checkout):
    work = checkout / "work"
    update_workspace(checkout)
    mine, untouched = work / "03_loss_scaling.ipynb", work / "04_amp_training.ipynb"
    _learner_edits(mine)
    my_bytes = mine.read_bytes()
    _edit_upstream(checkout / "notebooks" / mine.name, "Changed upstream, first time.")
    _edit_upstream(checkout / "notebooks" / untouched.name, "Changed upstream too.")
    before = set(snapshot(work))

    out = run_cli(cwd=checkout)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    beside = work / "03_loss_scaling.updated.ipynb"
    assert mine.read_bytes() == my_bytes, "the learner's copy is as they left it"
    assert beside.read_bytes() == workspace_notebook(checkout / "notebooks" / mine.name)
    assert "Changed upstream, first time." in beside.read_text()
    assert untouched.read_bytes() == workspace_notebook(checkout / "notebooks" / untouched.name)
    assert any("03_loss_scaling.updated.ipynb" in ln and "beside your copy" in ln for ln in lines), lines
    assert any("04_amp_training.ipynb" in ln and "updated to the new version" in ln for ln in lines), lines
    assert len(lines) == 2
    assert before <= set(snapshot(work)), "nothing deleted"

    # again: nothing new, a one-line reminder; the learner then deletes the .updated file: it stays away
    again = update_workspace(checkout)
    assert again.waiting == ("03_loss_scaling.updated.ipynb",) and not again.beside and len(again.lines) == 1
    beside.unlink()
    assert update_workspace(checkout).lines == (f"your workspace {work} is up to date ({len(NOTEBOOKS)} notebooks)",)
    assert not beside.exists()

    # a second upstream change brings it back; one the learner edited is kept and the next goes to -2
    _edit_upstream(checkout / "notebooks" / mine.name, "Changed upstream, second time.")
    assert update_workspace(checkout).beside == ("03_loss_scaling.updated.ipynb",)
    beside.write_text(beside.read_text().replace("second time", "second time (my notes)"))
    _edit_upstream(checkout / "notebooks" / mine.name, "Changed upstream, third time.")
    rep = update_workspace(checkout)
    assert rep.beside == ("03_loss_scaling.updated-2.ipynb",) and "my notes" in beside.read_text()
    assert mine.read_bytes() == my_bytes

    # the learner takes the new version over: from then on their copy counts as untouched again
    shutil.copyfile(work / "03_loss_scaling.updated-2.ipynb", mine)
    update_workspace(checkout)
    _edit_upstream(checkout / "notebooks" / mine.name, "Changed upstream, fourth time.")
    rep = update_workspace(checkout)
    assert rep.replaced == ("03_loss_scaling.ipynb",) and "fourth time" in mine.read_text()


def test_new_notebooks_are_copied_in_and_a_removed_copy_comes_back(checkout):
    work = checkout / "work"
    update_workspace(checkout)
    new = checkout / "notebooks" / "15_new_topic.ipynb"
    shutil.copyfile(checkout / "notebooks" / "01_float_bit_layouts.ipynb", new)
    (work / "02_underflow_overflow_rounding.ipynb").rename(work / "02_mine.ipynb")
    mine = (work / "02_mine.ipynb").read_bytes()
    rep = update_workspace(checkout)
    assert set(rep.copied) == {"15_new_topic.ipynb", "02_underflow_overflow_rounding.ipynb"}
    assert any(ln.endswith("15_new_topic.ipynb: new upstream; copied in") for ln in rep.lines), rep.lines
    assert any("02_underflow_overflow_rounding.ipynb: was not there" in ln for ln in rep.lines), rep.lines
    assert (work / "15_new_topic.ipynb").read_bytes() == workspace_notebook(new)
    assert (work / "02_mine.ipynb").read_bytes() == mine


def test_a_file_the_workspace_did_not_write_is_never_replaced(checkout):
    work = checkout / "work"
    update_workspace(checkout)
    marker = json.loads((work / MARKER).read_text())
    del marker["files"]["05_bf16_tf32_fp8.ipynb"]  # e.g. a notebook the learner made under an upstream name
    (work / MARKER).write_text(json.dumps(marker))
    (work / "05_bf16_tf32_fp8.ipynb").write_text("{}")
    rep = update_workspace(checkout)
    assert (work / "05_bf16_tf32_fp8.ipynb").read_text() == "{}"
    assert rep.beside == ("05_bf16_tf32_fp8.updated.ipynb",)


def test_refusals_change_nothing(checkout, tmp_path):
    own = tmp_path / "own"
    own.mkdir()
    (own / "thesis.tex").write_text("years of work")
    with pytest.raises(ValueError, match=r"not a labkit workspace.*thesis\.tex"):
        update_workspace(checkout, own)
    assert snapshot(own) == {"thesis.tex": b"years of work"}
    for bad, why in [(checkout, "checkout or a folder above"), (tmp_path, "checkout or a folder above"),
                     (checkout / "notebooks" / "w", "inside the checkout's notebooks/"),
                     (checkout / "slurm" / "w", "inside the checkout's slurm/")]:
        with pytest.raises(ValueError, match=why):
            update_workspace(checkout, bad)
    (tmp_path / "afile").write_text("x")
    with pytest.raises(ValueError, match="existing file"):
        update_workspace(checkout, tmp_path / "afile")
    with pytest.raises(ValueError, match="does not look like the workbook"):
        update_workspace(tmp_path / "nothing")
    with pytest.raises(TypeError):
        update_workspace(3)
    ws = checkout / "work"
    update_workspace(checkout)
    (ws / MARKER).write_text("{broken")
    before = snapshot(ws)
    with pytest.raises(ValueError, match="cannot be read"):
        update_workspace(checkout)
    assert snapshot(ws) == before
    out = run_cli("--dir", str(own), cwd=checkout)
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "not a labkit workspace" in out.stderr
    assert not out.stdout
    assert sorted(p.name for p in checkout.iterdir()) == ["notebooks", "slurm", "work"]


def test_a_workspace_outside_the_checkout_gets_slurm_too(checkout, tmp_path):
    outside = tmp_path / "elsewhere" / "ws"
    rep = update_workspace(checkout, outside)
    assert rep.created and (outside / "slurm" / "jupyter.sbatch").is_file()
    for f in ("slurm/jupyter.sbatch", "slurm/ddp.sbatch"):
        assert (outside / f).read_bytes() == (ROOT / f).read_bytes()
        assert stat.S_IMODE((outside / f).stat().st_mode) == stat.S_IMODE((ROOT / f).stat().st_mode)
    note = cells(outside / "00_environment.ipynb")[0]["source"]
    assert f"]({os.path.relpath(checkout / 'notebooks' / '00_environment.ipynb', outside)})" in note


def test_updated_name():
    assert updated_name("03_loss_scaling.ipynb") == "03_loss_scaling.updated.ipynb"
    assert updated_name("slurm/env.sh", 2) == "slurm/env.updated-2.sh"
    with pytest.raises(ValueError):
        updated_name("x.ipynb", 0)
    with pytest.raises(TypeError):
        updated_name(None)


# --- the workspace notebooks run ------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("number", ["00", "12"])
def test_workspace_notebook_runs_top_to_bottom_unanswered(checkout, number, monkeypatch, tmp_path):
    """The notebooks whose run depends on where they are (00 looks for every notebook beside it and shows the
    progress record; 12 finds slurm/ above it), run in the workspace: no error, every check "not attempted".

    The other workspace notebooks are the student build's copies plus one markdown cell (checked above), and
    tests/browser/test_notebooks.py runs every workspace copy top to bottom."""
    monkeypatch.delenv("LABKIT_PROGRESS", raising=False)  # the kernel records where a learner's would
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    update_workspace(checkout)
    work = checkout / "work"
    path = next(work.glob(f"{number}_*.ipynb"))
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(work)}}).execute()
    printed = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
                      if o.get("output_type") == "stream")
    ids = {i for c in cells(ROOT / "notebooks" / path.name) if c["cell_type"] == "code"
           and solution_blocks(c["source"]) for i in CHECK.findall(c["source"])}
    assert ids and printed.count("not attempted yet") >= len(ids)
    assert "✓" not in printed and "✗" not in printed
    if number == "00":
        assert f"No exercise checked yet (your progress will be recorded in {work / PROGRESS_FILE})" in printed
    assert not (work / PROGRESS_FILE).exists() and not (tmp_path / "state").exists(), "nothing answered, nothing recorded"


def test_a_workspace_from_a_student_tree(tmp_path):
    """A class hands out the student tree (make student); `python -m labkit workspace` works on a copy of it."""
    from labkit.student import build_student_tree

    tree = tmp_path / "tree"
    build_student_tree(ROOT, tree)
    rep = update_workspace(tree)
    assert rep.created and len(rep.copied) == len(NOTEBOOKS) + 1
    note = cells(tree / "work" / "00_environment.ipynb")[0]["source"]
    assert "as it was handed out" in note and "with the solutions" not in note
    assert "handed out" in (tree / "work" / "README.md").read_text()


def test_a_path_the_learner_made_is_never_replaced_a_symbolic_link_included(checkout, tmp_path):
    """A learner's symbolic link where the new version would go (or where a copy is, or above it) is kept, and
    the report says so; the new version goes to the next free name."""
    work = checkout / "work"
    update_workspace(checkout)
    mine = work / "03_loss_scaling.ipynb"
    _learner_edits(mine)
    notes = tmp_path / "my_notes.ipynb"
    notes.write_text("my notes")
    (work / "03_loss_scaling.updated.ipynb").symlink_to(notes)
    (work / "04_amp_training.ipynb").unlink()
    (work / "04_amp_training.ipynb").symlink_to(notes)
    _edit_upstream(checkout / "notebooks" / mine.name, "Changed upstream.")
    _edit_upstream(checkout / "notebooks" / "04_amp_training.ipynb", "Changed upstream too.")

    rep = update_workspace(checkout)
    link = work / "03_loss_scaling.updated.ipynb"
    assert link.is_symlink() and os.readlink(link) == str(notes) and notes.read_text() == "my notes"
    assert (work / "04_amp_training.ipynb").is_symlink()
    assert rep.beside == ("03_loss_scaling.updated-2.ipynb",)
    assert "Changed upstream." in (work / "03_loss_scaling.updated-2.ipynb").read_text()
    assert any("03_loss_scaling.updated.ipynb (a symbolic link)" in ln and "kept" in ln for ln in rep.lines), rep.lines
    assert any("04_amp_training.ipynb: yours (a symbolic link); kept" in ln for ln in rep.lines), rep.lines


def test_a_folder_the_learner_linked_is_never_written_through(checkout, tmp_path):
    outside = tmp_path / "elsewhere" / "ws"
    update_workspace(checkout, outside)
    theirs = tmp_path / "their_slurm"
    theirs.mkdir()
    (theirs / "jupyter.sbatch").write_bytes((outside / "slurm" / "jupyter.sbatch").read_bytes())
    shutil.move(outside / "slurm", tmp_path / "old_slurm")
    (outside / "slurm").symlink_to(theirs)
    with open(checkout / "slurm" / "jupyter.sbatch", "a") as fh:
        fh.write("# changed upstream\n")
    before = snapshot(theirs)
    rep = update_workspace(checkout, outside)
    assert snapshot(theirs) == before, "nothing written through the learner's link"
    assert any(ln.startswith("ws/slurm: yours (a symbolic link); kept") for ln in rep.lines), rep.lines
