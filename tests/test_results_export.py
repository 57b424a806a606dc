"""Students export their check results to a class folder; the instructor reads them all back."""

from __future__ import annotations

import json
import stat

import pytest
from needs import finishes

from labkit import check as C


@pytest.fixture(autouse=True)
def _clean():
    C.reset_results()
    yield
    C.reset_results()


def test_export_merges_best_status_and_load_reads_the_folder(tmp_path, capsys):
    folder = tmp_path / "class"
    C.check("01.fp16-max", 65504)      # correct
    C.check("01.bf16-eps", 2.0**-8)    # wrong
    path = C.export_results(folder, name="alice")
    assert path == folder / "alice.json" and stat.S_IMODE(path.stat().st_mode) == 0o644
    doc = json.loads(path.read_text())
    assert doc["name"] == "alice" and doc["results"] == {"01.bf16-eps": "wrong", "01.fp16-max": "correct"}

    # a second kernel (another notebook, or a rerun of the student copy) exports into the same file
    C.reset_results()
    C.check("01.fp16-max", ...)        # not attempted in this kernel: does not undo the earlier ✓
    C.check("01.bf16-eps", 2.0**-7)    # now correct
    C.check("02.first-int", 2048)      # wrong
    C.export_results(folder, name="alice")
    C.reset_results()
    C.check("01.fp16-max", 65536.0)
    C.export_results(folder / "bob.json", name="bob")
    (folder / "notes.json").write_text("[1, 2]")  # not a results file: skipped
    (folder / "broken.json").write_text("{")
    capsys.readouterr()

    got = C.load_results(folder)
    assert got == {"alice": {"01.bf16-eps": "correct", "01.fp16-max": "correct", "02.first-int": "wrong"},
                   "bob": {"01.fp16-max": "wrong"}}
    assert not list(folder.glob(".*.tmp")), "no temporary file left behind"


def test_export_refuses_bad_names_and_foreign_files(tmp_path):
    for bad in ["../x", "a/b", "", ".hidden", "x" * 65]:
        with pytest.raises(ValueError):
            C.export_results(tmp_path, name=bad)
    foreign = tmp_path / "carol.json"
    foreign.write_text('{"something": "else"}')
    with pytest.raises(ValueError, match="not a labkit results file"):
        C.export_results(tmp_path, name="carol")
    assert foreign.read_text() == '{"something": "else"}'
    with pytest.raises(ValueError):
        C.load_results(tmp_path / "missing")


def test_export_defaults_to_login_name(tmp_path, monkeypatch):
    monkeypatch.setenv("USER", "dave")
    monkeypatch.setenv("LOGNAME", "dave")
    assert C.export_results(tmp_path).name == "dave.json"


# --- one student's file cannot break the class's results -----------------------------------------------------

def _export(folder, name: str, status: str = "correct"):
    (folder / f"{name}.json").write_text(json.dumps({"name": name, "updated": "", "results": {"01.fp16-max": status}}))


def test_a_hostile_student_file_is_skipped_with_one_line_each(tmp_path, capsys):
    import os

    folder = tmp_path / "class"
    folder.mkdir()
    _export(folder, "alice")
    _export(folder, "carol", "wrong")
    os.mkfifo(folder / "bob.json")                                    # would block the reader for ever
    (folder / "zero.json").symlink_to("/dev/zero")                    # would be read without end
    (folder / "deep.json").write_text("[" * 100_000 + "]" * 100_000)  # RecursionError
    (folder / "listy.json").write_text(json.dumps({"name": "listy", "results": {"01.fp16-max": ["correct"]}}))
    (folder / "big.json").write_text(json.dumps({"results": {}, "pad": "x" * (2 << 20)}))
    (folder / "dir.json").mkdir()
    outside = tmp_path / "elsewhere.json"
    _export(tmp_path, "elsewhere")
    (folder / "link-out.json").symlink_to(outside)                    # a link to a file outside the folder
    (folder / "link-in.json").symlink_to(folder / "carol.json")       # a link inside: followed
    before = {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file() and p.name not in ("bob.json", "zero.json")}
    capsys.readouterr()

    got = finishes(lambda: C.load_results(folder), fifo=folder / "bob.json")
    assert got == {"alice": {"01.fp16-max": "correct"}, "carol": {"01.fp16-max": "wrong"},
                   "link-in": {"01.fp16-max": "wrong"}, "listy": {}}
    lines = capsys.readouterr().out.splitlines()
    for name in ("bob.json", "zero.json", "deep.json", "big.json", "dir.json", "link-out.json"):
        assert sum(name in ln and "skipped" in ln for ln in lines) == 1, (name, lines)
    assert any("link-in.json" in ln and "'carol'" in ln for ln in lines), lines  # the name it claims
    assert len(lines) == 7, lines
    assert {p.name: p.read_bytes() for p in folder.iterdir()
            if p.is_file() and p.name not in ("bob.json", "zero.json")} == before, "nothing written"


def test_a_file_cannot_claim_another_students_name(tmp_path, capsys):
    folder = tmp_path / "class"
    folder.mkdir()
    _export(folder, "alice", "wrong")
    (folder / "mallory.json").write_text(json.dumps({"name": "alice", "results": {"01.fp16-max": "correct"}}))
    capsys.readouterr()
    got = C.load_results(folder)
    assert got == {"alice": {"01.fp16-max": "wrong"}, "mallory": {"01.fp16-max": "correct"}}
    (line,) = capsys.readouterr().out.splitlines()
    assert "mallory.json" in line and "'alice'" in line and "mallory" in line
