"""Class results: a learner's progress record exported, the class's files gathered into a CSV and an HTML page."""

from __future__ import annotations

import csv
import json
import os
import stat
import subprocess
import sys

import pytest

from labkit import check as C
from labkit import classresults as R


@pytest.fixture(autouse=True)
def _clean():
    C.reset_results()
    yield
    C.reset_results()


def _learner(tmp_path, monkeypatch, name: str, answers: list[tuple[str, object]], solution: str | None = None):
    """A learner's progress record, made by real check() calls, exported to the class folder as ``name``."""
    record = tmp_path / f"{name}-progress.json"
    monkeypatch.setenv("LABKIT_PROGRESS", str(record))
    C.reset_results()
    if solution:
        C.solution(solution)
    for ex_id, answer in answers:
        C.check(ex_id, answer)
    monkeypatch.setattr(R, "_login", lambda: name)
    return R.export_record(tmp_path / "class", record)


@pytest.fixture
def two_learners(tmp_path, monkeypatch):
    (tmp_path / "class").mkdir()
    ada = _learner(tmp_path, monkeypatch, "ada", [("01.fp16-max", 65536.0), ("01.fp16-max", 65504.0)])
    bo = _learner(tmp_path, monkeypatch, "bo", [("01.bf16-eps", 2.0**-8), ("02.first-int", 2048)],
                  solution="01.bf16-eps")
    bo_again = _learner(tmp_path, monkeypatch, "bo", [("01.bf16-eps", 2.0**-7)])
    assert bo_again == bo and ada.name == "ada.json", "<login>.json in the class folder; a later export replaces it"
    owners = {"ada.json": "ada", "bo.json": "bo"}  # unit tests run as one user: each file stands for its owner
    monkeypatch.setattr(R, "_owner", lambda st: next(k for f, k in owners.items()
                                                     if os.stat(tmp_path / "class" / f).st_ino == st.st_ino))
    return tmp_path / "class"


def test_export_writes_the_whole_record_with_version_and_time(two_learners):
    doc = json.loads((two_learners / "ada.json").read_text())
    assert doc["kind"] == R.KIND and doc["login"] == "ada" and doc["labkit"] and doc["exported"]
    e = doc["exercises"]["01.fp16-max"]
    assert e["status"] == "correct" and e["attempts"] == 2 and e["solved"] and not e.get("solution_seen")
    assert stat.S_IMODE((two_learners / "ada.json").stat().st_mode) == 0o644
    bo = json.loads((two_learners / "bo.json").read_text())["exercises"]
    assert bo["01.bf16-eps"]["solution_seen"] and bo["01.bf16-eps"]["solved_after_solution"]
    assert bo["02.first-int"]["status"] == "wrong"


def test_gather_and_report_show_both_learners(two_learners, tmp_path, capsys):
    res = R.gather([two_learners])
    assert sorted(res.learners) == ["ada", "bo"] and not res.skipped
    s = res.summary()
    assert s["01.fp16-max"]["solved"] == 1 and s["01.fp16-max"]["mean_attempts"] == 2.0
    assert s["01.bf16-eps"]["solved_after_solution"] == 1 and s["01.bf16-eps"]["solved"] == 0
    assert s["02.first-int"]["tried_not_solved"] == 1 and s["03.static-scale"]["solved"] == 0
    csv_path, html_path = R.write_report(res, tmp_path / "report")
    rows = list(csv.DictReader(csv_path.open()))
    assert {(r["learner"], r["exercise"], r["status"]) for r in rows} == {
        ("ada", "01.fp16-max", "correct"), ("bo", "01.bf16-eps", "correct"), ("bo", "02.first-int", "wrong")}
    page = html_path.read_text()
    assert "ada, bo" in page and page.count("data:image/png;base64,") == 2  # notebooks 01 and 02: a plot each
    assert "Notebook 03" not in page, "a notebook nobody tried gets no section"


def test_a_file_is_listed_under_its_owner_and_a_bad_one_is_skipped(two_learners, tmp_path, monkeypatch, capsys):
    doc = json.loads((two_learners / "ada.json").read_text())
    (two_learners / "ada.json").write_text(json.dumps({**doc, "login": "<b>bo</b>"}))
    (two_learners / "notes.json").write_text("[1]")
    (two_learners / "deep.json").write_text("[" * 100 + "]" * 100)
    os.mkfifo(two_learners / "fifo.json")
    os.symlink(two_learners / "bo.json", two_learners / "link.json")
    real_owner = R._owner
    monkeypatch.setattr(R, "_owner", lambda st: "ada" if not stat.S_ISREG(st.st_mode) else real_owner(st))
    res = R.gather([two_learners])
    out = capsys.readouterr().out
    assert sorted(res.learners) == ["ada", "bo"], "the owner names the learner, not the file's content"
    assert "listed under its owner, ada" in out
    assert len(res.skipped) == 4 and all(s.startswith("(class-report: skipped") for s in res.skipped)
    _, html_path = R.write_report(res, tmp_path / "r")
    assert "<b>bo</b>" not in html_path.read_text()


def test_export_refuses_what_it_must_not_overwrite(tmp_path, monkeypatch):
    record = tmp_path / "p.json"
    monkeypatch.setenv("LABKIT_PROGRESS", str(record))
    C.check("01.fp16-max", 65504.0)
    mine = tmp_path / "mine.json"
    mine.write_text('{"a": 1}')
    with pytest.raises(ValueError, match="not a labkit results file"):
        R.export_record(mine, record)
    assert mine.read_text() == '{"a": 1}'
    with pytest.raises(ValueError, match="not a folder"):
        R.export_record(tmp_path / "missing", record)
    with pytest.raises(TypeError):
        R.export_record(3, record)
    with pytest.raises(ValueError, match="no such"):
        R.gather([tmp_path / "nothing-here"])


def test_the_command_line_exports_and_reports(tmp_path):
    env = {**os.environ, "LABKIT_PROGRESS": str(tmp_path / "p.json"), "HOME": str(tmp_path)}
    code = "from labkit.check import check; check('01.fp16-max', 65504.0)"
    subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True, timeout=120)
    (tmp_path / "class").mkdir()
    run = subprocess.run([sys.executable, "-m", "labkit", "progress", "--export", "--to", str(tmp_path / "class")],
                         env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and "exported 1 exercises" in run.stdout, run.stderr
    rep = subprocess.run([sys.executable, "-m", "labkit", "class-report", str(tmp_path / "class"), "--out",
                          str(tmp_path / "rep")], env=env, capture_output=True, text=True, timeout=120)
    assert rep.returncode == 0 and "1 learner" in rep.stdout, rep.stderr
    assert (tmp_path / "rep" / "class-results.csv").read_text().count("01.fp16-max") == 1
    bad = subprocess.run([sys.executable, "-m", "labkit", "progress", "--to", "x"], env=env, capture_output=True,
                         text=True, timeout=120)
    assert bad.returncode == 2 and "--to goes with --export" in bad.stderr
