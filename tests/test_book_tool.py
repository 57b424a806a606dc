"""tools/book.py without a browser: the run-it box's link, the glossary dictionary, the folders it refuses."""

from __future__ import annotations

import sys
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import book  # noqa: E402  tools/book.py


def test_the_run_box_link_is_nbgitpullers_and_names_the_edition():
    box = book.run_box("zh", "03_loss_scaling.ipynb", "https://hub.x/", "https://git.x/me/labkit/", "dev")
    link = next(ln for ln in box.splitlines() if "git-pull?" in ln)
    assert link.startswith("https://hub.x/hub/user-redirect/git-pull?")
    assert parse_qs(urlsplit(link).query) == {
        "repo": ["https://git.x/me/labkit"], "branch": ["dev"], "targetpath": ["labkit"],
        "urlpath": ["lab/tree/labkit/notebooks/zh/03_loss_scaling.ipynb"]}
    assert "make lab LAB_LANG=zh" in box and "work-zh/03_loss_scaling.ipynb" in box
    en = book.run_box("en", "03_loss_scaling.ipynb", "https://hub.x", "https://git.x/me/labkit")
    assert "work/03_loss_scaling.ipynb" in en and "notebooks%2F03_loss_scaling" in en


def test_the_glossary_gives_the_chinese_search_its_words():
    terms = book.glossary_terms()
    assert {"损失缩放", "主权重", "次正规数"} <= set(terms) and len(terms) > 100
    assert all(len(t) >= 2 for t in terms)


def test_a_folder_it_did_not_make_is_refused_and_kept(tmp_path):
    mine = tmp_path / "site"
    (mine / "notes.txt").parent.mkdir()
    (mine / "notes.txt").write_text("a user's file")
    with pytest.raises(ValueError, match="not made by tools/book.py"):
        book.build(out=mine, stage_dir=tmp_path / "src")
    assert (mine / "notes.txt").read_text() == "a user's file"
    assert book.main(["--out", str(mine), "--stage", str(tmp_path / "src")]) == 1
    with pytest.raises(ValueError):
        book.stage("fr", into=tmp_path / "src")


def test_a_static_widget_shows_its_stored_values():
    models = {
        "box": {"state": {"_model_name": "VBoxModel", "children": ["IPY_MODEL_t", "IPY_MODEL_d", "IPY_MODEL_p"]}},
        "t": {"state": {"_model_name": "BoundedFloatTextModel", "description": "params (B)", "value": 13.0}},
        "d": {"state": {"_model_name": "DropdownModel", "description": "stage", "_options_labels": ["0", "1", "2"],
                        "index": 2}},
        "p": {"state": {"_model_name": "FloatProgressModel", "value": 30, "max": 60}},
    }
    html = book.static_widget("box", models)
    assert 'params (B) <input disabled value="13.0">' in html and "<option>2</option>" in html
    assert 'max="60" value="30"' in html and book.static_widget("missing", models) == ""
