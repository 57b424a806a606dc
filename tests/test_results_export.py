"""Students export their check results to a class folder; the instructor reads them all back."""

from __future__ import annotations

import json
import stat

import pytest

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
